"""Figures (matplotlib, Agg canvas, no pyplot state): each returns PNG bytes or None.

A function returns None when the run lacks its data; the caller says how to get it.
"""

import io

import numpy as np
import pandas as pd

from nondet.fmt import fmt_prefill_form, prefill_order
from nondet.reports.tables import RunTables

OP_ORDER = ["embedding", "norm", "matmul", "attention", "softmax", "rotary", "activation", "other"]
MODE_COLOURS = {"default": "#c0392b", "batch-invariant": "#2471a3"}
DPI = 120


def _new(width: float = 7.0, height: float = 3.2, ncols: int = 1):
    # The Agg canvas is attached here, not at import, and never touches pyplot's global backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    return fig, axes


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def _mode_runs(t: RunTables, mode: str) -> pd.DataFrame:
    return t.runs[t.runs.kernels == mode]


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
    fig, ax = _new()
    for data, label, colour in ((num, "first numeric divergence (logprob bits)", "#7f8c8d"),
                                (tok, "first token divergence", "#c0392b")):
        ax.hist(data, bins=bins, label=label, color=colour, alpha=0.8, edgecolor="white")
    ax.set_xlabel("decode step")
    ax.set_ylabel("runs")
    ax.set_title(f"Where runs leave the reference ({t.primary_mode} kernels; of {len(runs)} runs, {len(num)} "
                 f"differ in logprob bits, {len(tok)} in tokens)", fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="best")
    ax.yaxis.get_major_locator().set_params(integer=True)
    return _png(fig)


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
    fig, ax = _new()
    width = 0.8 / len(modes)
    seen: dict[str, object] = {}
    for i, mode in enumerate(modes):
        mine = runs[runs.kernels == mode]
        for j, bs in enumerate(sizes):
            x = j + i * width - 0.4 + width / 2
            counts = mine[mine.batch_size == bs].completion_id.value_counts().sort_index()
            bottom, off_reference = 0, 0
            for cid, n in counts.items():
                label, colour = _completion_style(int(cid), cid in ref_ids[mode])
                off_reference += 0 if cid in ref_ids[mode] else int(n)
                bar = ax.bar(x, n, width * 0.92, bottom=bottom, color=colour, edgecolor="white",
                             hatch="//" if mode != "default" else None)
                seen.setdefault(label, bar)
                bottom += n
            if bottom:
                ax.annotate(f"{off_reference}", (x, bottom), xytext=(0, 2), textcoords="offset points",
                            ha="center", fontsize=8)
    ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
    ax.set_xlabel("batch size" + ("   (hatched: batch-invariant kernels)" if len(modes) > 1 else ""))
    ax.set_ylabel("runs")
    ax.set_title("Completions by batch size (number on top: runs off the reference)", fontsize=10)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    # Beside the plot: inside it, the legend covers the distinct-count labels of the first bars.
    ax.legend(seen.values(), seen.keys(), frameon=False, fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


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
    finite = np.concatenate([l[np.isfinite(l)] for l in logs]) if logs else np.array([])
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (-8, 0)
    n_rows = max(len(lbl) for _, lbl, _ in mats)
    fig, axes = _new(3.4 * len(steps) + 1.2, 1.2 + 0.28 * n_rows, ncols=len(steps))
    axes = np.atleast_1d(axes)
    import matplotlib

    cmap = matplotlib.colormaps["magma_r"].with_extremes(bad="#eef2f5")
    for ax, s, (m, rlabels, cols), lg in zip(axes, steps, mats, logs):
        im = ax.imshow(lg, aspect="auto", cmap=cmap, vmin=vmin, vmax=max(vmax, vmin + 1e-9))
        ax.set_xticks(range(len(cols)), cols, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(len(rlabels)), rlabels, fontsize=8)
        ax.set_title(_step_title(t, int(s)), fontsize=9)
        _mark_origin(ax, t, int(s), rlabels, cols)
    fig.colorbar(im, ax=list(axes), label="log10 max |diff|", shrink=0.9)
    return _png(fig)


def _step_title(t: RunTables, step: int) -> str:
    b = t.bisect or {}
    tags = [name for key, name in (("first_numeric_step", "first numeric divergence"), ("flip_step", "token flip"))
            if b.get(key) == step]
    return f"step {step}" + (f" ({', '.join(tags)})" if tags else "")


def _mark_origin(ax, t: RunTables, step: int, rlabels: list[str], cols: list[str]) -> None:
    origin = (t.bisect or {}).get("origin") or {}
    if origin.get("step") != step or origin.get("op_class") not in cols:
        return
    layer = origin.get("layer")
    label = f"layer {layer}" if layer is not None else None
    if label not in rlabels:
        return
    from matplotlib.patches import Rectangle

    r, c = rlabels.index(label), cols.index(origin["op_class"])
    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="#1abc9c", linewidth=2.5))


def amplification_curve(t: RunTables) -> bytes | None:
    """Residual-stream max diff by layer (one line per step) and its growth over steps."""
    amp = t.amplification
    if amp.empty:
        return None
    import matplotlib

    fig, (left, right) = _new(9.0, 3.2, ncols=2)
    positive = amp.max_abs_diff[amp.max_abs_diff > 0]
    floor = positive.min() / 2 if not positive.empty else 1e-8  # symlog: zeros (bit-identical) sit on the axis
    steps = sorted(amp.step.unique())
    cmap = matplotlib.colormaps["viridis"]
    for i, s in enumerate(steps):
        d = amp[amp.step == s].sort_values("layer")
        left.plot(d.layer, d.max_abs_diff, marker="." if len(steps) <= 30 else None, linewidth=1,
                  color=cmap(i / max(1, len(steps) - 1)),
                  label=f"step {s}" if len(steps) <= 8 else None)
    left.set_xlabel("layer")
    left.set_ylabel("max |diff| of residual stream")
    left.set_title("By layer (colour: step, early = dark; 0 = bit-identical)", fontsize=9)
    if len(steps) <= 8:
        left.legend(frameon=False, fontsize=7)
    per_step = amp.groupby("step").max_abs_diff.max()
    right.plot(per_step.index, per_step.values, marker="o" if len(per_step) <= 30 else None, color="#c0392b")
    right.set_xlabel("decode step")
    right.set_title("Largest over layers, by step", fontsize=9)
    from matplotlib.ticker import FuncFormatter

    top = positive.max() * 2 if not positive.empty else 1e-6
    ticks = [0.0] + [m * 10.0 ** e for e in range(int(np.floor(np.log10(floor))), int(np.ceil(np.log10(top))) + 1)
                     for m in (1, 2, 5) if floor <= m * 10.0 ** e <= top]
    has_zero = bool((amp.max_abs_diff == 0).any())
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
        if not has_zero:
            ax.set_yscale("log")
            continue
        ax.set_yscale("symlog", linthresh=floor)
        ax.set_ylim(0, top)
        ax.set_yticks(ticks)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}" if v else "0"))
    flip = (t.bisect or {}).get("flip_step")
    if flip is not None:
        right.axvline(flip, color="#555", linestyle="--", linewidth=1)
        right.annotate("token flip", (flip, 0.95), xycoords=("data", "axes fraction"), xytext=(-4, 0),
                       textcoords="offset points", fontsize=8, ha="right")
    return _png(fig)


def kernels_before_after(t: RunTables) -> bytes | None:
    """Distinct completions per condition, default kernels against batch-invariant ones."""
    modes = list(t.modes)
    if len(modes) < 2:
        return None
    conds = t.conditions.assign(key=[_cond_key(r) for r in t.conditions.itertuples()])
    table = conds.pivot_table(index="key", columns="kernels", values="distinct_completions", sort=False)
    table = table[[m for m in modes if m in table.columns]]
    fig, ax = _new(7.0, 1.4 + 0.3 * len(table))
    y = np.arange(len(table))
    height = 0.8 / len(table.columns)
    for i, mode in enumerate(table.columns):
        bars = ax.barh(y + i * height - 0.4 + height / 2, table[mode], height, label=f"{mode} kernels",
                       color=MODE_COLOURS.get(mode, "#555"))
        ax.bar_label(bars, fmt="%d", fontsize=8, padding=2)
    ax.set_yticks(y, table.index, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("distinct completions in the condition")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlim(0, np.nanmax(table.values) * 1.25 + 0.5)
    ax.set_title("Before / after: default against batch-invariant kernels")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return _png(fig)


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
    fig, ax = _new(height=1.2 + 0.32 * len(labels) * len(modes))
    for i, mode in enumerate(modes):
        offset = (i - (len(modes) - 1) / 2) * 0.25
        colour = MODE_COLOURS.get(mode, "#5d6d7e")
        for f in (f for f in forms if f["kernels"] == mode):
            y = labels.index(fmt_prefill_form(f)) + offset
            bits, token = f["first_numeric_divergence"], f["first_token_divergence"]
            if bits is None:
                ax.plot(horizon, y, "o", mfc="white", mec=colour)
            else:
                ax.plot(bits, y, "o", color=colour)
            if token is not None:
                ax.plot(token, y, "x", color=colour, ms=8)
        ax.plot([], [], "o", color=colour, label=f"{mode}: bits differ")
    ax.plot([], [], "x", color="#333333", label="token differs")
    ax.plot([], [], "o", mfc="white", mec="#333333", label=f"no difference in {horizon} steps")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlim(-0.5, horizon + 0.5)
    ax.set_xlabel("decode step")
    ax.set_title("Prefix cache and chunked prefill: where a run leaves one-pass prefill", fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)
