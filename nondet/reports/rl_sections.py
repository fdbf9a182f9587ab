"""The report of a `nondet rl` run: sampler vs trainer logprob metrics, a |dlogp| histogram.

Reads the run directory through nondet.rundir only (no probes, no torch): summary.json's
"rl" pairs for the table, streams.jsonl for the per-token differences behind the figure,
"rl" sample_groups for the GRPO groups whose samples are all identical (nondet.rl.groups).
"""

import shlex

import numpy as np

from nondet.fmt import fmt_float
from nondet.reports.blocks import Code, CodeBlock, Figure, Model, Para, Report, Section, Table
from nondet.reports.content import partial_sentence
from nondet.reports.prompts import prompt_blocks
from nondet.reports.svg import Box, Key, Panel, legend_width, plot_box
from nondet.reports.svg_axes import Linear, fmt_tick, nice_ticks
from nondet.reports.svg_canvas import Canvas
from nondet.rl.groups import warning
from nondet.rundir import RunDir
from nondet.rundir.reader import has_bisect, has_header, read_header, read_streams, read_summary, torn_records
from nondet.rundir.records import to_json


def is_rl_run(run_dir) -> bool:
    rd = RunDir(run_dir)
    return has_header(rd) and read_header(rd).command == "rl"


def rl_report(run_dir) -> Report:
    rd = RunDir(run_dir)
    header, summary = read_header(rd), to_json(read_summary(rd))
    pairs = [p for p in summary.get("rl", {}).get("pairs", []) if p.get("n_tokens")]
    streams = [to_json(s) for s in read_streams(rd)]
    sections = [
        Section("Verdict", "verdict", [Para([summary.get("verdict", "") + partial_sentence(torn_records(rd))],
                                            kind="verdict")]),
        *([Section("Prompts", "prompts", prompt_blocks(header.config))] if header.config.get("prompts") else []),
        Section("Sampler vs trainer", "rl", [metrics_table(pairs), Para([NOTE], kind="note")]),
        *_identical_groups(summary.get("rl") or {}),
        Section("Logprob differences", "rl-histogram", _figure(pairs, streams)),
        *_bisect(rd),
        Section("Reproduce", "reproduce", [CodeBlock([_command(header.argv)])]),
    ]
    return Report(f"nondet rl report: {rd.path.resolve().name}", sections)


def _bisect(rd: RunDir) -> list:
    """After `nondet bisect RUN_DIR`: where the trainer's bits leave the sampler's, and the ablation."""
    if not has_bisect(rd):
        return []
    from nondet.reports.bisect_sections import ablation_blocks, bisect_blocks
    from nondet.reports.tables import read_tables

    t = read_tables(rd.path)
    rl = (t.bisect or {}).get("rl") or {}
    what = Para([f"Sequence {rl.get('sequence')}: the sampler's decode (batch {rl.get('sampler_batch')}) vs the "
                 f"trainer's teacher-forced prefill (micro-batch {rl.get('micro_batch')}, {rl.get('padding')}); "
                 "step s is the position whose logits give sampled token s."], kind="note")
    return [Section("Where the trainer leaves the sampler", "rl-bisect", [what, *bisect_blocks(t, [])]),
            Section("Kernel ablation", "rl-ablation", ablation_blocks(t))]


def _identical_groups(rl: dict) -> list:
    """Only when some GRPO group's samples are all one completion: the warning and those groups."""
    line = warning(rl)
    if not line:
        return []
    flagged = [g for g in rl["sample_groups"]["groups"] if g["identical"]]
    rows = [[Code(g["kernels"]), Model(g["prompt"]), str(g["size"]), ", ".join(map(str, g["prompt_ids"]))]
            for g in flagged]
    table = Table(["kernels", "prompt", "samples", "prompt_id of each sample"], rows, [False, False, True, False])
    return [Section("Identical sample groups", "rl-groups", [Para([line + "."]), table])]


def _command(argv: list) -> str:
    """The command line that made the run (argv as the CLI recorded it: "rl" first)."""
    return shlex.join(["nondet", *(argv if argv[:1] == ["rl"] else ["rl", *argv])])


NOTE = ("ratio = exp(trainer logprob - sampler logprob) of each sampled token; k1, k2, k3: J. Schulman's "
        "estimators of KL(sampler || trainer) (http://joschu.net/blog/kl-approx.html); exact KL: the mean over "
        "sampled tokens of KL(sampler || trainer) over the whole processed distributions (only where the sampler "
        "ran in-process). All are exactly 0 when every logprob is bit-identical (true on-policy).")


def metrics_table(pairs: list[dict]) -> Table:
    header = ["kernels", "micro-batch", "tokens", "bit-identical", "max |dlogp|", "mean |dlogp|", "p95 |dlogp|",
              "ratio outside 0.9-1.1", "ratio outside 0.8-1.2", "k1", "k2", "k3", "exact KL", "backward"]
    rows = [[Code(p["kernels"]), f"{p['micro_batch']} ({p['padding']})", str(p["n_tokens"]),
             f"{p['frac_identical']:.1%}", *(fmt_float(p[k]) for k in ("dlogp_max", "dlogp_mean", "dlogp_p95")),
             f"{p['ratio_outside_0.1']:.1%}", f"{p['ratio_outside_0.2']:.1%}",
             *(fmt_float(p[k]) for k in ("kl_k1", "kl_k2", "kl_k3")), _exact(p), _grads(p)] for p in pairs]
    return Table(header, rows, [False, False] + [True] * 11 + [False])


def _exact(p: dict) -> str:
    """The exact KL over the whole processed distributions ("-": the sampler's were not in-process)."""
    return "-" if p.get("kl_exact") is None else fmt_float(p["kl_exact"])


def _grads(p: dict) -> str:
    if not p.get("backward"):
        return "not run"
    return "finite gradients" if p.get("grad_finite") else "NON-FINITE gradients"


def token_differences(pair: dict, streams: list[dict]) -> np.ndarray:
    """|trainer - sampler| logprob of every token of one pair (0 where bit-identical)."""
    sampler = {s["prompt_id"]: s for s in streams if s.get("side") == "sampler" and s["kernels"] == pair["sampler"]}
    out = []
    for s in streams:
        if s["condition_id"] == pair["trainer_condition"]:
            ref = sampler[s["prompt_id"]]["steps"]
            out += [abs(float.fromhex(a["logprob"]) - float.fromhex(b["logprob"])) for a, b in zip(s["steps"], ref)]
    return np.asarray(out)


def _figure(pairs: list[dict], streams: list[dict]) -> list:
    if not pairs:
        return [Para(["No trainer tokens to compare."], kind="hint")]
    svg = dlogp_histogram([(f"{p['kernels']} mb={p['micro_batch']}", token_differences(p, streams)) for p in pairs])
    return [Figure("rl_dlogp.svg", svg, "histogram of |dlogp| per kernels mode and micro-batch",
                   ["|trainer - sampler| logprob per sampled token; the bar at 0 counts bit-identical tokens."])]


# one colour per pair: the first of the "tab10" palette, the colours this histogram always had
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def dlogp_histogram(series: list[tuple[str, np.ndarray]]) -> bytes:
    """One step histogram per pair over log10 |dlogp|, with identical tokens in a bin left of the axis."""
    edges = np.concatenate([[-10], np.linspace(-9, 1, 41)])
    counts = []
    for _, d in series:
        logs = np.where(d > 0, np.log10(np.where(d > 0, d, 1)), -9.5)  # identical tokens: the bin at -9.5
        counts.append(np.histogram(np.clip(logs, -9.99, 0.99), bins=edges)[0])
    tallest = max((int(c.max()) for c in counts), default=1)
    yticks = [(v, fmt_tick(v)) for v in nice_ticks(0, tallest * 1.05, integer=True)]
    keys = [Key(label, CYCLE[i % len(CYCLE)], "line") for i, (label, _) in enumerate(series)]
    canvas = Canvas(840, 384)
    box = plot_box(Box(0, 0, 840, 384), ytick_labels=[s for _, s in yticks], xlabel=True, ylabel=True,
                   right=legend_width(keys) + 10)
    panel = Panel(canvas, box, Linear(-10.5, 1.5), Linear(0, yticks[-1][0]))
    for key, c in zip(keys, counts):
        xs = np.repeat(edges, 2)  # the outline of the bars: up and across each bin, down at the end
        panel.line(xs, np.concatenate([[0], np.repeat(c, 2), [0]]), key.colour, 1.5)
    panel.frame([(v, fmt_tick(v)) for v in range(-10, 2, 2)], yticks,
                "log10 |dlogp|  (leftmost bin: bit-identical)", "tokens")
    panel.legend(keys, "right")
    return canvas.to_bytes()
