"""The bisect and ablation parts of the report: where the difference is born, and the causal test."""

from nondet.fmt import DASH, fmt_float, fmt_margin, fmt_step, is_missing, run_dir_arg
from nondet.reports import figures
from nondet.reports.blocks import Code, Model, Para, Strong, Table, figure_or_hint
from nondet.reports.tables import RunTables
from nondet.verdict import replay_line, routing_line


def bisect_blocks(t: RunTables, no_bisect: list) -> list:
    b = t.bisect
    if b is None:
        return [Para(no_bisect, kind="hint")]
    parts = [f"Bisect replayed run {b.get('run_id')} (", Code(str(b.get("condition_id"))),
             f") in lockstep with the reference (run {b.get('reference_run_id')})."]
    blocks = [Para(parts + _origin_parts(b) + _flip_parts(b))]
    if "routing" in b:  # a mixture of experts: routing or arithmetic, before anything else
        blocks.insert(0, Para([Strong(routing_line(b.get("routing"), b.get("steps") or 0))]))
    agreement = b.get("numeric_agreement")
    if isinstance(agreement, dict) and agreement.get("agree") is False:
        blocks.append(Para([f"Probe vs bisect: {agreement.get('note')}."], kind="note"))
    replayed = replay_line(b)
    if replayed:
        blocks.append(Para([replayed[0].upper() + replayed[1:] + "."], kind="note"))
    blocks += figure_or_hint("bisect_heatmap.svg", figures.bisect_heatmap(t), "Heatmap of differences by layer and op class",
                      ["Layer × op class; colour = log10 of the largest absolute difference of the target row "
                       "(blank = bit-identical); the origin is boxed."],
                      ["No per-module table (bisect_modules.csv) yet: run ", Code(f"nondet bisect {run_dir_arg(t)}"),
                       "."])
    blocks += _first_modules(t)
    return blocks


def _origin_parts(b: dict) -> list:
    origin = b.get("origin")
    if not origin:
        return [" No captured point differs."]
    return [" The first bit difference is born at ", Strong(f"step {origin.get('step')}"), " in ",
            *_module(origin), ".", *_lasting(b, origin)]


def _flip_parts(b: dict) -> list:
    flip, probe_flip = b.get("flip_step"), b.get("probe_flip_step")
    if flip is None:
        return [] if probe_flip is None else [
            f" Bisect replayed {b.get('steps', 'fewer')} steps, short of the probe's token flip at step "
            f"{probe_flip} (rerun with --max-steps {probe_flip + 1} to reach it)."]
    parts = [f" The token flips at step {flip}, where the reference's top1−top2 margin was "
             f"{fmt_margin(b.get('margin_at_flip'))}"]
    ft = b.get("flip_tokens") or {}
    if "reference_piece" in ft and "divergent_piece" in ft:
        parts += [": the reference took ", Model(ft["reference_piece"]), ", the divergent run ",
                  Model(ft["divergent_piece"])]
    return parts + ["."]


def _module(point: dict) -> list:
    layer = "" if point.get("layer") is None else f", layer {point['layer']}"
    return [Code(str(point.get("module"))), f" (op class {point.get('op_class')}{layer})"]


REACH = {"layer": "absorbed before the residual stream", "logits": "it reached the logits but not the KV cache",
         "residual stream": "it reached the residual stream but neither the KV cache nor the logits"}


def _lasting(b: dict, origin: dict) -> list:
    """The transient / lasting sentence (nothing for a bisect.json written before they were told apart)."""
    if "lasting" not in b:
        return []
    lasting, transients = b.get("lasting"), b.get("transients") or []
    if lasting and (lasting.get("step"), lasting.get("order")) == (origin.get("step"), origin.get("order")):
        return [" It is also where the lasting divergence begins: it ", *_via(lasting), "."]
    first = transients[0] if transients and transients[0].get("step") == origin.get("step") else None
    out = [" It is transient: " + (REACH.get(first.get("reach"), str(first.get("reach"))) if first else
                                   "absorbed within its step") + ", so nothing of it reached later steps"]
    out.append(f" ({len(transients)} steps before the lasting divergence had transient differences)."
               if len(transients) > 1 else ".")
    if not lasting:
        return out + [f" No difference lasted: none reached the KV cache or flipped a token in {b.get('steps')} "
                      "steps."]
    return out + [" The lasting divergence is born at ", Strong(f"step {lasting.get('step')}"), " in ",
                  *_module(lasting), "; it ", *_via(lasting), "."]


def _via(lasting: dict) -> list:
    if lasting.get("via") != "kv cache":
        return ["reached the logits at the token flip itself"]
    silent = lasting.get("silent_steps") or 0
    return ["enters the KV cache at ", Code(str(lasting.get("enters_at"))), ", which every later step reads",
            f" (its effect rounded away at {silent} later step(s))" if silent else ""]


def _first_modules(t: RunTables) -> list:
    """Tables of the first differing step and, when it is another, the lasting divergence's step."""
    mods = t.bisect_modules
    if mods.empty:
        return []
    step = int(mods[mods.differs].step.min()) if mods.differs.any() else int(mods.step.min())
    lasting = ((t.bisect or {}).get("lasting") or {}).get("step")
    out = _modules_table(mods, step, f"First differing modules at step {step}")
    if lasting is not None and lasting != step:
        out += _modules_table(mods, lasting, f"Differing modules at step {lasting}, where the lasting divergence "
                                             "is born")
    return out


def _modules_table(mods, step: int, title: str, limit: int = 8) -> list:
    d = mods[(mods.step == step) & mods.differs].sort_values("order").head(limit)
    rows = [[fmt_step(r.layer), Code(r.module), r.op_class, fmt_float(r.max_abs_diff), fmt_float(r.max_rel_diff),
             fmt_float(r.max_ulp), fmt_step(r.first_diff_index)] for r in d.itertuples()]
    header = ["layer", "module", "op class", "max abs diff", "max rel diff", "max ULP", "first differing index"]
    return [Para([f"{title}, in execution order (all rows: bisect_modules.csv):"]),
            Table(header, rows, [True, False, False, True, True, True, True])]




def _point(first_diff) -> str:
    """'step 0: model.layers.0.mlp.up_proj (matmul)' for an ablation's first differing point."""
    if not isinstance(first_diff, dict):
        return DASH
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
    if "lasting" in t.ablation.columns:  # ablation entries since lasting divergences are told apart
        header.append("lasting divergence born at")
        rows = [row + [_point(r.lasting)] for row, r in zip(rows, t.ablation.itertuples())]
    out = [Table(header, rows, [False, False, False, True, True, False, False][: len(header)],
                 [False] * 5 + [True] * (len(header) - 5))]
    if t.minimal_set:
        out.append(Para(["Minimal set that removes the divergence: ", Strong(" + ".join(t.minimal_set)), "."]))
    else:
        out.append(Para(["No op-class set removed the divergence."]))
    return out


def _yes(v) -> str:
    return DASH if is_missing(v) else "yes" if v else "no"
