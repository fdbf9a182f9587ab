"""The bisect and ablation parts of the report: where the difference is born, and the causal test."""

import pandas as pd

from nondet.reports import figures
from nondet.reports.blocks import Code, Model, Para, Strong, Table, figure_or_hint
from nondet.reports.fmt import fmt_float, fmt_margin, fmt_step, run_dir_arg
from nondet.reports.load import RunTables


def bisect_blocks(t: RunTables, no_bisect: list) -> list:
    b = t.bisect
    if b is None:
        return [Para(no_bisect, kind="hint")]
    parts = [f"Bisect replayed run {b.get('run_id')} (", Code(str(b.get("condition_id"))),
             f") in lockstep with the reference (run {b.get('reference_run_id')})."]
    origin = b.get("origin")
    if origin:
        layer = "" if origin.get("layer") is None else f", layer {origin['layer']}"
        parts += [" The first bit difference is born at ", Strong(f"step {origin.get('step')}"), " in ",
                  Code(str(origin.get("module"))), f" (op class {origin.get('op_class')}{layer})."]
    else:
        parts.append(" No captured point differs.")
    flip, probe_flip = b.get("flip_step"), b.get("probe_flip_step")
    if flip is not None:
        parts.append(f" The token flips at step {flip}, where the reference's top1−top2 margin was "
                     f"{fmt_margin(b.get('margin_at_flip'))}")
        ft = b.get("flip_tokens") or {}
        if "reference_piece" in ft and "divergent_piece" in ft:
            parts += [": the reference took ", Model(ft["reference_piece"]), ", the divergent run ",
                      Model(ft["divergent_piece"])]
        parts.append(".")
    elif probe_flip is not None:
        parts.append(f" Bisect replayed {b.get('steps', 'fewer')} steps, short of the probe's token flip at step "
                     f"{probe_flip} (rerun with --max-steps {probe_flip + 1} to reach it).")
    blocks = [Para(parts)]
    blocks += figure_or_hint("bisect_heatmap.png", figures.bisect_heatmap(t), "Heatmap of differences by layer and op class",
                      ["Layer × op class; colour = log10 of the largest absolute difference of the target row "
                       "(blank = bit-identical); the origin is boxed."],
                      ["No per-module table (bisect_modules.csv) yet: run ", Code(f"nondet bisect {run_dir_arg(t)}"),
                       "."])
    blocks += _first_modules(t)
    return blocks


def _first_modules(t: RunTables, limit: int = 8) -> list:
    mods = t.bisect_modules
    if mods.empty:
        return []
    step = int(mods[mods.differs].step.min()) if mods.differs.any() else int(mods.step.min())
    d = mods[(mods.step == step) & mods.differs].sort_values("order").head(limit)
    rows = [[fmt_step(r.layer), Code(r.module), r.op_class, fmt_float(r.max_abs_diff), fmt_float(r.max_rel_diff),
             fmt_float(r.max_ulp), fmt_step(r.first_diff_index)] for r in d.itertuples()]
    header = ["layer", "module", "op class", "max abs diff", "max rel diff", "max ULP", "first differing index"]
    return [Para([f"First differing modules at step {step}, in execution order (all rows: bisect_modules.csv):"]),
            Table(header, rows, [True, False, False, True, True, True, True])]




def _point(first_diff) -> str:
    """'step 0: model.layers.0.mlp.up_proj (matmul)' for an ablation's first differing point."""
    if not isinstance(first_diff, dict):
        return "—"
    return f"step {first_diff.get('step')}: {first_diff.get('module')} ({first_diff.get('op_class')})"


def ablation_blocks(t: RunTables) -> list:
    if t.ablation.empty:
        return [Para(["No ablation yet: run ", Code(f"nondet bisect {run_dir_arg(t)}"),
                      " (it reruns the divergent condition with each op class made batch-invariant)."], kind="hint")]
    header = ["batch-invariant op classes", "tokens match reference", "activations bit-identical",
              "first token divergence", "first numeric divergence", "first differing point"]
    rows = [[Code(" + ".join(r.ops)), _yes(r.tokens_match), _yes(r.activations_match),
             fmt_step(r.first_token_divergence), fmt_step(r.first_numeric_step), _point(r.first_diff)]
            for r in t.ablation.itertuples()]
    out = [Table(header, rows, [False, False, False, True, True, False])]
    if t.minimal_set:
        out.append(Para(["Minimal set that removes the divergence: ", Strong(" + ".join(t.minimal_set)), "."]))
    else:
        out.append(Para(["No op-class set removed the divergence."]))
    return out


def _yes(v) -> str:
    return "—" if v is None or v is pd.NA or (isinstance(v, float) and pd.isna(v)) else "yes" if v else "no"
