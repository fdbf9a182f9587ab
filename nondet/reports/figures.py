"""Figures as SVG text (svg.py, no plotting library): each returns UTF-8 SVG bytes or None.

A function returns None when the run lacks its data; the caller says how to get it. Sizes are in
px: 840 x 384 is the 7 x 3.2 in at 120 dpi the report's figures always had.
"""

import numpy as np
import pandas as pd

from nondet.fmt import fmt_prefill_form, prefill_order
from nondet.reports.colormaps import colour_at
from nondet.reports.svg import (Box, Key, Panel, colorbar, colorbar_width, legend_width, plot_box,
                                rotated_height)
from nondet.reports.svg_axes import (Linear, Log, Symlog, fmt_power, fmt_tick, log_ticks, nice_ticks,
                                     symlog_ticks, ticks_within)
from nondet.reports.svg_canvas import Canvas
from nondet.reports.tables import RunTables

OP_ORDER = ["embedding", "norm", "matmul", "attention", "softmax", "rotary", "activation", "other"]
MODE_COLOURS = {"default": "#c0392b", "batch-invariant": "#2471a3"}
WIDTH, HEIGHT = 840, 384
BLANK = "#eef2f5"  # a heatmap cell without a difference (bit-identical or not recorded)


def _mode_runs(t: RunTables, mode: str) -> pd.DataFrame:
    return t.runs[t.runs.kernels == mode]


def _labelled(ticks: list[float], fmt=fmt_tick) -> list[tuple[float, str]]:
    return [(v, fmt(v)) for v in ticks]


def _padded(lo: float, hi: float) -> Linear:
    """A data range with 5% room at each end, so end points do not sit on the frame."""
    pad = (hi - lo) * 0.05 or 0.5
    return Linear(lo - pad, hi + pad)


def first_divergence_histogram(t: RunTables) -> bytes | None:
    """Histogram of each run's first token and first numeric divergence step."""
    runs = _mode_runs(t, t.primary_mode)
    tok = runs.first_token_divergence.dropna().astype(int)
    num = runs.first_numeric_divergence.dropna().astype(int)
    if tok.empty and num.empty:
        return None
    hi = int(max(tok.max() if not tok.empty else 0, num.max() if not num.empty else 0))
    width = max(1, -(-(hi + 1) // 30))  # at most ~30 bins, each a whole number of steps
    bins = np.arange(-0.5, hi + width + 0.5, width)
    series = [(np.histogram(num, bins)[0], "first numeric divergence (logprob bits)", "#7f8c8d"),
              (np.histogram(tok, bins)[0], "first token divergence", "#c0392b")]
    top = max(int(c.max()) for c, _, _ in series) / 0.72  # the top quarter is the legend's
    yticks = _labelled(nice_ticks(0, top, integer=True))
    canvas = Canvas(WIDTH, HEIGHT)
    box = plot_box(Box(0, 0, WIDTH, HEIGHT), ytick_labels=[s for _, s in yticks], xlabel=True, ylabel=True,
                   title=True)
    panel = Panel(canvas, box, _padded(bins[0], bins[-1]), Linear(0, yticks[-1][0]))
    for counts, _, colour in series:
        for left, n in zip(bins, counts):
            if n:
                panel.bar(left + width / 2, n, width, colour, opacity=0.8)
    panel.frame(_labelled(ticks_within(bins[0], bins[-1], 12, integer=True)), yticks, "decode step", "runs",
                f"Where runs leave the reference ({t.primary_mode} kernels; of {len(runs)} runs, {len(num)} "
                f"differ in logprob bits, {len(tok)} in tokens)")
    panel.legend([Key(label, colour) for _, label, colour in series], "upper right")
    return canvas.to_bytes()


REF_COLOUR = "#1e8449"
PALETTE = ["#c0392b", "#2471a3", "#d68910", "#7d3c98", "#17a589", "#a04000", "#5d6d7e", "#cb4335"]


def _completion_style(cid: int, is_ref: bool) -> tuple[str, str]:
    """Legend label and colour of a completion: the reference's is green, the first few get colours."""
    if is_ref:
        return "reference completion", REF_COLOUR
    if 1 <= cid <= len(PALETTE):
        return f"completion {cid}", PALETTE[cid - 1]
    return "other completions", "#999999"


def distinct_by_batch_size(t: RunTables) -> bytes | None:
    """Runs at each batch size stacked by the completion they produced; label = runs off the reference.

    The label counts runs whose completion is not their prompt's reference: with several prompts, a
    count of distinct completions would call every all-reference bar "4 distinct" (one per prompt)."""
    runs = t.runs.dropna(subset=["batch_size", "completion_id"])
    if runs.empty:
        return None
    modes = [m for m in t.modes if m in set(runs.kernels)]
    sizes = sorted(int(b) for b in runs.batch_size.unique())
    ref_ids = {m: {c["completion_id"] for c in t.modes[m].get("completions", []) if c.get("is_reference")}
               for m in modes}
    tallest = runs.groupby(["kernels", "batch_size"]).size().max()
    yticks = _labelled(nice_ticks(0, tallest * 1.12, integer=True))  # room for the numbers on top
    stacks = [(i, j, _stack(runs[(runs.kernels == m) & (runs.batch_size == bs)], ref_ids[m]))
              for i, m in enumerate(modes) for j, bs in enumerate(sizes)]
    keys = list({label: Key(label, colour) for _, _, stack in stacks for _, label, colour in stack}.values())
    canvas = Canvas(WIDTH, HEIGHT)
    # Beside the plot: inside it, the legend covers the labels of the first bars.
    box = plot_box(Box(0, 0, WIDTH, HEIGHT), ytick_labels=[s for _, s in yticks], xlabel=True, ylabel=True,
                   title=True, right=legend_width(keys) + 10)
    panel = Panel(canvas, box, Linear(-0.5, len(sizes) - 0.5), Linear(0, yticks[-1][0]))
    width = 0.8 / len(modes)
    for i, j, stack in stacks:
        x, bottom = j + i * width - 0.4 + width / 2, 0
        for n, label, colour in stack:
            panel.bar(x, n, width * 0.92, colour, bottom=bottom, hatch=modes[i] != "default")
            bottom += n
        if bottom:
            off_reference = sum(n for n, label, _ in stack if label != "reference completion")
            panel.note(x, bottom, str(off_reference), dy=-8)
    panel.frame(list(enumerate(map(str, sizes))), yticks,
                "batch size" + ("   (hatched: batch-invariant kernels)" if len(modes) > 1 else ""), "runs",
                "Completions by batch size (number on top: runs off the reference)")
    panel.legend(keys, "right")
    return canvas.to_bytes()


def _stack(runs: pd.DataFrame, ref_ids: set) -> list[tuple[int, str, str]]:
    """(runs, legend label, colour) of each completion at one batch size, by completion id."""
    counts = runs.completion_id.value_counts().sort_index()
    return [(int(n), *_completion_style(int(cid), cid in ref_ids)) for cid, n in counts.items()]


def _heat_matrix(mods: pd.DataFrame) -> tuple[np.ndarray, list[str], list[str]]:
    """Rows: before the layers, each layer, after them; columns: op classes; max abs diff."""
    first_layer = mods.order[mods.layer.notna()].min()
    row = mods.layer.astype("float").copy()
    row[mods.layer.isna() & (mods.order < first_layer)] = -1
    row[mods.layer.isna() & ~(mods.order < first_layer)] = np.inf
    rows = sorted(row.unique())
    cols = [c for c in OP_ORDER if c in set(mods.op_class)] + sorted(set(mods.op_class) - set(OP_ORDER))
    mat = np.full((len(rows), len(cols)), np.nan)
    for (r, c), v in mods.assign(row=row).groupby(["row", "op_class"]).max_abs_diff.max().items():
        mat[rows.index(r), cols.index(c)] = v
    labels = ["before layers" if r == -1 else "after layers" if r == np.inf else f"layer {int(r)}" for r in rows]
    return mat, labels, cols


def bisect_heatmap(t: RunTables) -> bytes | None:
    """Layer x op class, colour = log10 of the max abs diff, at the first numeric and flip steps."""
    mods = t.bisect_modules
    if mods.empty:
        return None
    steps = sorted(mods.step.unique())[:3]
    mats = [_heat_matrix(mods[mods.step == s]) for s in steps]
    logs = [np.log10(np.where(m > 0, m, np.nan)) for m, _, _ in mats]
    finite = np.concatenate([l[np.isfinite(l)] for l in logs])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (-8.0, 0.0)
    vmax = max(vmax, vmin + 1e-9)
    bar_ticks = ticks_within(vmin, vmax, 6) or [vmin]
    all_cols = [c for _, _, cols in mats for c in cols]
    n_rows = max(len(lbl) for _, lbl, _ in mats)
    bar_w = colorbar_width([f"{v:g}" for v in bar_ticks])
    canvas = Canvas(400 * len(steps) + bar_w, 70 + 26 * n_rows + rotated_height(all_cols, 35))
    step_w = (canvas.width - bar_w) / len(steps)
    for k, (s, (_, rlabels, cols), lg) in enumerate(zip(steps, mats, logs)):
        region = Box(k * step_w, 0, (k + 1) * step_w, canvas.height)
        box = plot_box(region, ytick_labels=rlabels, xtick_labels=all_cols, xrotate=-35, title=True)
        panel = Panel(canvas, box, Linear(-0.5, len(cols) - 0.5), Linear(-0.5, len(rlabels) - 0.5), flip_y=True)
        for (r, c), v in np.ndenumerate(lg):
            panel.cell(c, r, colour_at("magma_r", (v - vmin) / (vmax - vmin)) if np.isfinite(v) else BLANK)
        panel.frame(list(enumerate(cols)), list(enumerate(rlabels)), title=_step_title(t, int(s)), xrotate=-35)
        _mark_origin(panel, t, int(s), rlabels, cols)
    bar = Box(canvas.width - bar_w + 16, box.top, canvas.width - bar_w + 30, box.bottom)
    colorbar(canvas, bar, "magma_r", vmin, vmax, bar_ticks, "log10 max |diff|")
    return canvas.to_bytes()


def _step_title(t: RunTables, step: int) -> str:
    b = t.bisect or {}
    tags = [name for key, name in (("first_numeric_step", "first numeric divergence"), ("flip_step", "token flip"))
            if b.get(key) == step]
    return f"step {step}" + (f" ({', '.join(tags)})" if tags else "")


def _mark_origin(panel: Panel, t: RunTables, step: int, rlabels: list[str], cols: list[str]) -> None:
    origin = (t.bisect or {}).get("origin") or {}
    if origin.get("step") != step or origin.get("op_class") not in cols:
        return
    layer = origin.get("layer")
    label = f"layer {layer}" if layer is not None else None
    if label not in rlabels:
        return
    r, c = rlabels.index(label), cols.index(origin["op_class"])
    panel.outline(c - 0.5, r - 0.5, c + 0.5, r + 0.5, "#1abc9c", 2.5)


def amplification_curve(t: RunTables) -> bytes | None:
    """Residual-stream max diff by layer (one line per step) and its growth over steps."""
    amp = t.amplification
    if amp.empty:
        return None
    positive = amp.max_abs_diff[amp.max_abs_diff > 0]
    floor = positive.min() / 2 if not positive.empty else 1e-8  # symlog: zeros (bit-identical) sit on the axis
    top = positive.max() * 2 if not positive.empty else 1e-6
    steps = sorted(amp.step.unique())
    per_step = amp.groupby("step").max_abs_diff.max()
    flip = (t.bisect or {}).get("flip_step")
    canvas = Canvas(1080, HEIGHT)
    has_zero = bool((amp.max_abs_diff == 0).any())
    left = _amp_panel(canvas, Box(0, 0, 540, HEIGHT), amp.layer, amp.max_abs_diff, has_zero, floor, top, "layer",
                      "max |diff| of residual stream", "By layer (colour: step, early = dark; 0 = bit-identical)")
    for i, s in enumerate(steps):
        d = amp[amp.step == s].sort_values("layer")
        left.line(d.layer, d.max_abs_diff, colour_at("viridis", i / max(1, len(steps) - 1)), 1.2,
                  "dot" if len(steps) <= 30 else None)
    if len(steps) <= 8:
        left.legend([Key(f"step {s}", colour_at("viridis", i / max(1, len(steps) - 1)), "line", "dot")
                     for i, s in enumerate(steps)], "upper left")
    xs = list(per_step.index) + ([flip] if flip is not None else [])
    right = _amp_panel(canvas, Box(540, 0, 1080, HEIGHT), pd.Series(xs), per_step, has_zero, floor, top,
                       "decode step", "", "Largest over layers, by step")
    right.line(per_step.index, per_step.values, "#c0392b", 2.0, "circle" if len(per_step) <= 30 else None)
    if flip is not None:
        right.vline(flip, "token flip")
    return canvas.to_bytes()


def _amp_panel(canvas: Canvas, region: Box, xs: pd.Series, ys: pd.Series, has_zero: bool, floor: float,
               top: float, xlabel: str, ylabel: str, title: str) -> Panel:
    """One half of the amplification figure: integer x, y on a log scale (symlog from 0 when some
    differences are exactly 0), framed and labelled."""
    if has_zero:
        yt, y = symlog_ticks(floor, top), Symlog(floor, 0.0, top)
    else:
        seen = ys[ys > 0]
        yt = log_ticks(seen.min(), seen.max())
        y = Log(yt[0], yt[-1])
    yticks = _labelled(yt, fmt_power)
    box = plot_box(region, ytick_labels=[s for _, s in yticks], xlabel=True, ylabel=bool(ylabel), title=True)
    panel = Panel(canvas, box, _padded(float(xs.min()), float(xs.max())), y)
    panel.frame(_labelled(ticks_within(panel.x.lo, panel.x.hi, 8, integer=True)), yticks, xlabel, ylabel, title)
    return panel


def kernels_before_after(t: RunTables) -> bytes | None:
    """Distinct completions per condition, default kernels against batch-invariant ones."""
    modes = list(t.modes)
    if len(modes) < 2:
        return None
    conds = t.conditions.assign(key=[_cond_key(r) for r in t.conditions.itertuples()])
    table = conds.pivot_table(index="key", columns="kernels", values="distinct_completions", sort=False)
    table = table[[m for m in modes if m in table.columns]]
    xmax = float(np.nanmax(table.values)) * 1.25 + 0.5
    canvas = Canvas(WIDTH, 168 + 36 * len(table))
    box = plot_box(Box(0, 0, canvas.width, canvas.height), ytick_labels=list(table.index), xlabel=True, title=True)
    panel = Panel(canvas, box, Linear(0, xmax), Linear(-0.5, len(table) - 0.5), flip_y=True)
    height = 0.8 / len(table.columns)
    for i, mode in enumerate(table.columns):
        for y, n in enumerate(table[mode]):
            if pd.notna(n):
                at = y + i * height - 0.4 + height / 2
                panel.barh(at, n, height, MODE_COLOURS.get(mode, "#555555"))
                panel.note(n, at, f"{n:.0f}", dx=3, anchor="start")
    panel.frame(_labelled(ticks_within(0, xmax, 8, integer=True)), list(enumerate(table.index)),
                "distinct completions in the condition",
                title="Before / after: default against batch-invariant kernels")
    panel.legend([Key(f"{m} kernels", MODE_COLOURS.get(m, "#555555")) for m in table.columns], "lower right")
    return canvas.to_bytes()


def _cond_key(row) -> str:
    """The condition id without its kernels mode, so both modes line up."""
    cid = str(row.condition_id)
    return cid.split("/", 1)[1] if cid.startswith(f"{row.kernels}/") else cid


def prefill_divergence(t: RunTables) -> bytes | None:
    """The prefill axis: per form and size (rows), each kernels mode's first step whose logprob bits
    differ from one-pass prefill (filled marker) and whose token differs (cross); a hollow marker at
    the right edge where nothing differed within the run's steps."""
    forms = (t.summary.get("prefill") or {}).get("by_form") or []
    if not forms:
        return None
    labels = list(dict.fromkeys(fmt_prefill_form(f) for f in sorted(forms, key=prefill_order)))
    horizon = max(1, int((t.config.get("config") or {}).get("max_new_tokens") or 1))
    modes = list(dict.fromkeys(f["kernels"] for f in forms))
    keys = [Key(f"{m}: bits differ", MODE_COLOURS.get(m, "#5d6d7e"), "marker", "circle") for m in modes]
    keys += [Key("token differs", "#333333", "marker", "cross"),
             Key(f"no difference in {horizon} steps", "#333333", "marker", "hollow")]
    canvas = Canvas(WIDTH, 144 + 38 * len(labels) * len(modes))
    box = plot_box(Box(0, 0, canvas.width, canvas.height), ytick_labels=labels, xlabel=True, title=True,
                   right=legend_width(keys) + 10)
    panel = Panel(canvas, box, Linear(-0.5, horizon + 0.5), Linear(-0.5, len(labels) - 0.5), flip_y=True)
    for i, mode in enumerate(modes):
        offset = (i - (len(modes) - 1) / 2) * 0.25
        colour = MODE_COLOURS.get(mode, "#5d6d7e")
        for f in (f for f in forms if f["kernels"] == mode):
            y = labels.index(fmt_prefill_form(f)) + offset
            bits, token = f["first_numeric_divergence"], f["first_token_divergence"]
            panel.marker(horizon if bits is None else bits, y, "hollow" if bits is None else "circle", colour)
            if token is not None:
                panel.marker(token, y, "cross", colour)
    panel.frame(_labelled(ticks_within(0, horizon, 10, integer=True)), list(enumerate(labels)), "decode step",
                title="Prefix cache and chunked prefill: where a run leaves one-pass prefill")
    panel.legend(keys, "right")
    return canvas.to_bytes()
