"""RunTables -> Report: what the report says, in this order:

verdict, prompts, conditions, branch tree, token diff, figures (first divergence, distinct by
batch size, bisect heatmap, amplification, before/after kernels), ablation, environment,
reproduce. A section without data becomes one line saying how to produce it.
"""

import shlex

import pandas as pd

from nondet.fmt import DASH, ahead_note, breaks_note, fmt_hex, fmt_margin, fmt_step, run_dir_arg, saved_steps_note
from nondet.reports import figures
from nondet.reports.blocks import (Branch, BranchPoint, Code, CodeBlock, Model, Para, Report, Section, Strong,
                                   Table, TokenDiff, figure_or_hint)
from nondet.reports.against import against_sections
from nondet.reports.bisect_sections import ablation_blocks, bisect_blocks
from nondet.reports.prefill import prefill_sections
from nondet.reports.prompts import prompt_blocks
from nondet.reports.speculative import speculative_sections
from nondet.reports.tables import RunTables
from nondet.reports.tensor_parallel import tensor_parallel_sections
from nondet.verdict import confidence_line, graph_census_line, partly_line, report_verdict, sampler_lines

CONTEXT_BEFORE, CONTEXT_AFTER = 12, 16  # tokens shown around a split in the token diff
MAX_DIFFS = 6                            # divergent completions shown in the token diff
MAX_TREE_NODES = 30                      # branch points drawn before the tree is cut


def build_report(t: RunTables) -> Report:
    sections = [
        Section("Verdict", "verdict", [_verdict(t), *_confidence_note(t), *_coverage_note(t), *_gate_note(t),
                                       *_model_note(t), *_load_notes(t), *_decode_path_note(t)]),
        Section("Prompts", "prompts", prompt_blocks(t.config.get("config") or {})),
        Section("Conditions", "conditions", _conditions(t)),
        *speculative_sections(t),
        *prefill_sections(t),
        *tensor_parallel_sections(t),
        *against_sections(t),
        Section("Branch tree", "branch-tree", _tree(t)),
        Section("Token diff", "token-diff", _token_diffs(t)),
        Section("Figures", "figures", []),
        *_figure_sections(t),
        Section("Ablation", "ablation", ablation_blocks(t)),
        Section("Environment", "environment", _environment(t)),
        Section("Reproduce", "reproduce", _reproduce(t)),
    ]
    return Report(_title(t), sections)


def _title(t: RunTables) -> str:
    """The command and the model, then the run directory: 'nondet probe: Qwen3ForCausalLM (run-dir)'."""
    model = (t.fingerprint.get("model") or {}).get("name") or "unknown model"
    return f"nondet {t.config.get('command', 'probe')}: {model} ({t.path.resolve().name})"


# -- verdict ----------------------------------------------------------------------------


def _verdict(t: RunTables) -> Para:
    # two servers: the sentence that compares them (it names a cross-engine one); --tp: within each degree,
    # then across them (the main diff mixes the two)
    if t.summary.get("against") or t.summary.get("tensor_parallel"):
        sentence = t.summary["verdict"]
        if t.minimal_set:
            sentence += f"; fixed by batch-invariant {' + '.join(t.minimal_set)}"
        return Para([sentence[:1].upper() + sentence[1:] + "." + partial_sentence(t.partial)], kind="verdict")
    return Para([report_verdict(t.modes, t.primary_mode, t.minimal_set) + partial_sentence(t.partial)],
                kind="verdict")


def partial_sentence(partial: str) -> str:
    """' Partial: ...' after the verdict when a torn record was left out; '' otherwise."""
    return f" Partial: {partial}; the tables below cover the records before it." if partial else ""


def _confidence_note(t: RunTables) -> list[Para]:
    """Per kernels mode: the runs that diverged, the 95% interval of the rate, the grade; then the flips
    the sampler made with the reference's logits."""
    lines = [confidence_line(f"{mode} kernels", m["confidence"]) for mode, m in t.modes.items() if m.get("confidence")]
    return _sentences(lines + sampler_lines(t.summary))


def _coverage_note(t: RunTables) -> list[Para]:
    """What the batch-invariant kernels covered (the op census): partly invariant runs, and the demo's
    injected control, whose fix under the mode is by construction."""
    coverage = t.summary.get("kernel_coverage") or {}
    lines = []
    if coverage.get("coverage") == "partly invariant":
        lines.append(partly_line(coverage.get("uncovered") or []) + "; agreement under them proves nothing about "
                     "those ops")
    if coverage.get("injected_control"):
        lines.append(coverage["injected_control"])
    if t.summary.get("compiled_graph_census"):
        lines.append(graph_census_line(t.summary["compiled_graph_census"]))
    return _sentences(lines)


def _sentences(lines: list[str]) -> list[Para]:
    """Each of verdict.py's lines as a note: capitalized, with its full stop."""
    return [Para([line[:1].upper() + line[1:] + "."], kind="note") for line in lines]


def _gate_note(t: RunTables) -> list[Para]:
    """One line when `nondet gate` judged this run: the policy and pass/fail."""
    if not t.gate:
        return []
    policy = t.gate.get("policy") or {}
    rule = policy.get("require", "?") + ("" if policy.get("value") is None else f" = {policy['value']:g}")
    failed = [c for c in t.gate.get("conditions", []) if not c.get("passed")]
    outcome = (f"policy violated by {len(failed)} of {len(t.gate.get('conditions', []))} condition(s)"
               if failed else "policy met")
    return [Para([f"CI gate ({rule}): {outcome}."], kind="note")]


def _model_note(t: RunTables) -> list[Para]:
    """Which model, and the variance built into it on purpose (never to be taken for the host's kernels)."""
    model = t.fingerprint.get("model") or {}
    name = model.get("name", "unknown model")
    dtype, device = t.fingerprint.get("dtype", "?"), t.fingerprint.get("device", "?")
    if model.get("embedded_default") and model.get("demo") == "trained":
        parts = ["Model: the demo model (", Code(str(name)), f", trained, {dtype} on {device})."]
    elif model.get("embedded_default"):
        parts = ["Model: the embedded demonstration model (", Code(str(name)), ", random weights built in "
                 f"code, {dtype} on {device}). Its text is meaningless; the numerics are real."]
    else:
        parts = ["Model: ", Code(str(name)), f", {dtype} on {device}."]
    if model.get("injected_variance"):
        parts += [" ", Code(str(model["injected_variance"])), " was made batch-variant on purpose (a positive "
                  "control: its reduction changes strategy with the number of rows, as a split-reduction kernel "
                  "does on a busy GPU server); without it (--no-inject-variance) only this host's own kernels vary."]
    ignored = model.get("generation_defaults_ignored")
    notes = ([defaults_not_applied(ignored)] if ignored else []) + ([dtype_note(model)] if model.get("checkpoint_dtype")
                                                                   else [])
    parts += [" " + note[:1].upper() + note[1:] for note in notes]
    return [Para(parts, kind="note")]


def _load_notes(t: RunTables) -> list[Para]:
    """The load's caveats, as the terminal prints them after its tables (summary.json load.notes: a server's
    comparison level, a prefix cache's cold state and counted lengths, a continuous engine's runs alone)."""
    load = t.summary.get("load") or {}
    return [Para(["Load (", Code(str(load.get("mode", "?"))), "): ", note[:1].upper() + note[1:]
                  + ("" if note.endswith(".") else ".")], kind="note")
            for note in load.get("notes") or []]


def dtype_note(model: dict) -> str:
    """One sentence when the weights were saved in another dtype than the probe ran (fingerprint model)."""
    return (f"its checkpoint is {model['checkpoint_dtype']}, probed in {model.get('dtype', '?')} (--dtype "
            f"{model['checkpoint_dtype']} probes it as shipped).")


def defaults_not_applied(ignored: dict) -> str:
    """One sentence on the model's generation_config.json settings the probe did not apply (fingerprint
    model.generation_defaults_ignored: probes/core/generation_defaults.py)."""
    settings = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in ignored.items())
    return (f"its generation_config.json sets {settings}, not applied: nondet decodes the model's own logits "
            "(greedy), as bisect and the RL trainer read them; a server that applies them decodes other tokens.")


def _decode_path_note(t: RunTables) -> list[Para]:
    """Which decode path the numbers come from: eager, the compiled one (`probe --compile`), or eager kernels
    replayed from CUDA graphs (`probe --cuda-graphs`), per kernels mode, since a compiled model rounds as
    Inductor's kernels do, not as eager's."""
    path = t.fingerprint.get("decode_path")
    compiled = t.summary.get("decode_path") or {}
    if not path or not compiled:
        ahead = "".join(f"; {mode} kernels: {outcome}" for mode, outcome in
                        t.summary.get("decoded_ahead", {}).items() if ahead_note(outcome))
        return [Para([f"Decode path: {path}{ahead}."], kind="note")] if path else []
    done, doing = ("recorded", "record") if compiled.get("backend") == "cuda-graphs" else ("compiled", "compile")
    modes = [f"{mode} kernels " + (f"{done} ({doing} + warm-up {m['warmup_s']:.1f} s, decoding {m['measured_s']:.1f} s"
                                    f"{breaks_note(m)}{saved_steps_note(compiled.get('precompiled', {}).get(mode, {}))}"
                                    f"{ahead_note(compiled.get('compiled_ahead', {}).get(mode))})"
                                   if m["path"] != "eager" else
                                   f"eager (could not {doing}: {m['reason']}; decoding {m['measured_s']:.1f} s)")
             for mode, m in compiled["modes"].items()]
    return [Para([f"Decode path: {compiled['compiled']}; " + "; ".join(modes) + "."], kind="note")]


# -- conditions -------------------------------------------------------------------------


def _positions(p) -> str:
    return ", ".join(map(str, p)) if isinstance(p, list) else DASH


def _conditions(t: RunTables) -> list:
    header = ["condition", "kernels", "load", "batch size", "positions", "fillers", "runs", "runs ≠ reference",
              "distinct completions", "first token divergence", "first numeric divergence"]
    off = t.runs.dropna(subset=["first_token_divergence"]).groupby("condition_id").size()
    rows = [[Code(str(c.condition_id)), str(c.kernels), str(c.load), fmt_step(c.batch_size),
             _positions(c.positions), str(c.fillers), fmt_step(c.n_runs),
             str(int(off.get(c.condition_id, 0))), fmt_step(c.distinct_completions),
             fmt_step(c.first_token_divergence), _numeric_cell(t, c.kernels, c.first_numeric_divergence)]
            for c in t.conditions.itertuples()]
    numeric = [False] * 6 + [True] * 5
    ref = t.modes[t.primary_mode].get("reference_run_id")
    note = Para([f"{_what_ran(t)} Every run is compared with the reference (run {ref}: the prompt alone"
                 f"{'' if (t.summary.get('load') or {}).get('mode') == 'server' else ', batch size 1'}). "
                 "Runs ≠ reference: runs whose tokens differ from it; distinct completions: among the condition's "
                 "own runs. A numeric divergence is a step where the sampled token's logprob bits differ (bisect's "
                 "first differing step is where any activation differs, which can be earlier); a token divergence "
                 "is a different token."], kind="note")
    return [Table(header, rows, numeric), note, *_resume_note(t)]


def _numeric_cell(t: RunTables, kernels, value) -> str:
    """The step, or why a mode has none (a server that sent no logprobs)."""
    na = t.modes.get(kernels, {}).get("numeric_na")
    return f"n/a ({na})" if na else fmt_step(value)


def _what_ran(t: RunTables) -> str:
    """What one condition is, per load: a batched call, engine runs, or requests to a server."""
    load = t.summary.get("load") or {}
    if load.get("mode") == "server":
        return (f"Server probe: the reference is one request sent alone, nothing else in flight; the burst is "
                f"{load.get('runs')} concurrent copies of it, at most {load.get('concurrency')} in flight, while "
                f"{load.get('filler_requests')} filler requests arrive at {load.get('rate', 0):g} "
                f"{load.get('rate_unit', 'per second')}; the server batches them as it likes.")
    if load.get("mode") == "continuous":
        return (f"Continuous batching in process: each condition is one run of the engine with the target joining "
                f"mid-flight, at most {load.get('concurrency')} fillers at once, {load.get('filler_requests')} in "
                f"all, arriving at {load.get('rate', 0):g} {load.get('rate_unit', 'per step')}.")
    return "Each condition is one batched generate call."


def _resume_note(t: RunTables) -> list[Para]:
    """A probe finished with --resume: when, and how many runs each resume added."""
    resumes = t.config.get("resumes") or []
    if not resumes:
        return []
    parts = "; ".join(f"{r.get('time')}: {r.get('runs_added')} run(s) added" for r in resumes)
    return [Para([f"Resumed {len(resumes)} time(s) with --resume ({parts}): the runs added then ran after the "
                  "interruption, possibly on a restarted server with another batch around them."], kind="note")]


# -- streams ----------------------------------------------------------------------------


def _run_steps(t: RunTables) -> dict[int, pd.DataFrame]:
    return {int(k): g.sort_values("step") for k, g in t.streams.groupby("run_id")}


def _mode_runs(t: RunTables, mode: str) -> list[dict]:
    return t.modes[mode].get("runs", [])


# -- branch tree ------------------------------------------------------------------------


def _as_far(m: dict) -> str:
    """A mode some of whose runs --fail-fast stopped: they agree only as far as they were decoded."""
    n = m.get("stopped_runs")
    return f", as far as decoded ({n} run{'s' if n > 1 else ''} stopped by --fail-fast at a settled verdict)" if n else ""


def _tree(t: RunTables) -> list:
    mode = t.primary_mode
    m = t.modes[mode]
    # One tree per prompt that split (several prompts: each prompt's own tree, labelled).
    trees = [(p["prompt_id"], p["branch_tree"]) for p in m.get("prompts", []) if p.get("branch_tree")]
    if not trees and m.get("branch_tree"):
        trees = [(None, m["branch_tree"])]
    if not trees:
        return [Para(["No branch point: every run produced the reference completion" + _as_far(m) + "."], kind="hint")]
    steps = _run_steps(t)
    budget = {"left": MAX_TREE_NODES, "cut": False}
    parts: list = [Para([f"Runs with {mode} kernels share a prefix until a branch point; each alternative shows "
                         "the token taken there, how many runs took it, the top1−top2 logit margin there, and "
                         "the text that follows."], kind="note")]
    for prompt, node in trees:
        if budget["left"] <= 0:
            budget["cut"] = True
            break
        # The prompt's own runs only: another prompt's run may hold the same token at a step.
        tokens = {r["run_id"]: steps[r["run_id"]].token.tolist() for r in _mode_runs(t, mode)
                  if r["run_id"] in steps and (prompt is None or r.get("prompt_id", 0) == prompt)}
        if prompt is not None:
            parts.append(Para([f"Prompt p{prompt}:"]))
        parts.append(_branch_point(node, [], tokens, steps, budget))
    if budget["cut"]:
        parts.append(Para([f"Further branch points left out (more than {MAX_TREE_NODES})."], kind="note"))
    return parts


def _branch_point(node: dict, path: list, tokens: dict, steps: dict, budget: dict) -> BranchPoint:
    budget["left"] -= 1
    step, total = node["step"], node["count"]
    alts = []
    for a in node["alternatives"]:
        here = path + [(step, a["token"])]
        run = next((r for r, toks in tokens.items() if all(len(toks) > s and toks[s] == tok for s, tok in here)), None)
        cont = "".join(steps[run].piece.tolist()[step + 1: step + 1 + 10]) if run is not None else ""
        child = a.get("child")
        if child and budget["left"] <= 0:
            budget["cut"], child = True, None
        sub = _branch_point(child, here, tokens, steps, budget) if child else None
        alts.append(Branch(piece=a.get("piece", ""), count=a["count"], share=a["count"] / max(total, 1),
                           is_reference=bool(a.get("is_reference")), margin=fmt_margin(a.get("margin")),
                           continuation=cont, child=sub))
    return BranchPoint(step=step, count=total, prefix=node.get("prefix_text", ""), alternatives=alts)


# -- token diff -------------------------------------------------------------------------


def _token_diffs(t: RunTables) -> list:
    mode = t.primary_mode
    m = t.modes[mode]
    divergent = sorted((c for c in m.get("completions", []) if not c.get("is_reference")),
                       key=lambda c: -c["count"])
    if not divergent:
        return [Para(["No divergent completion: every run matches the reference token for token" + _as_far(m) + "."],
                     kind="hint")]
    steps = _run_steps(t)
    refs = _reference_runs(m)  # prompt id -> its reference run (the prompt alone)
    if any(r not in steps for r in refs.values()):
        return [Para(["The reference run's stream is missing from streams.jsonl: rerun `nondet probe`."], kind="hint")]
    several = len(refs) > 1
    whose = ("Each prompt's reference against each distinct divergent completion of that prompt" if several
             else "The reference against each distinct divergent completion")
    out = [Para([f"{whose} ({mode} kernels), aligned at the first differing token (highlighted)."], kind="note")]
    for c in divergent[:MAX_DIFFS]:
        run = next((r for r in m.get("runs", []) if r.get("completion_id") == c["completion_id"]), None)
        prompt = c.get("prompt_id", 0)
        if run is not None and run["run_id"] in steps and prompt in refs:
            n_runs = sum(x["count"] for x in m["completions"] if x.get("prompt_id", 0) == prompt)
            out.append(_one_diff(c, run, steps[refs[prompt]], steps[run["run_id"]], n_runs,
                                 f"p{prompt}" if several else None))
    if len(divergent) > MAX_DIFFS:
        out.append(Para([f"{len(divergent) - MAX_DIFFS} more divergent completions not shown "
                         "(all are in summary.json and `nondet.reports.read_tables`)."], kind="note"))
    return out


def _reference_runs(m: dict) -> dict[int, int]:
    """Prompt id -> the run id of that prompt alone (one prompt: the mode's reference run)."""
    prompts = m.get("prompts") or []
    if prompts:
        return {p["prompt_id"]: p["reference_run_id"] for p in prompts}
    return {0: m.get("reference_run_id")}


def _split(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _one_diff(c: dict, run: dict, ref: pd.DataFrame, alt: pd.DataFrame, n_runs: int,
              prompt: str | None = None) -> TokenDiff:
    rt, at = ref.token.tolist(), alt.token.tolist()
    k = _split(rt, at)
    rp, ap = ref.piece.tolist(), alt.piece.tolist()
    lo = max(0, k - CONTEXT_BEFORE)
    of = f" of {prompt}'s" if prompt else " of"
    title = [Strong(f"Completion {c['completion_id']}"), f": {c['count']}{of} {n_runs} runs, e.g. run "
             f"{run['run_id']} (", Code(run["condition_id"]), f", position {run['position']}); splits at step {k}"]
    return TokenDiff(title=title, step=k, before=rp[lo:k], ref_after=rp[k:k + CONTEXT_AFTER],
                     alt_after=ap[k:k + CONTEXT_AFTER], ref_label="reference",
                     alt_label=f"completion {c['completion_id']}", detail=_diff_detail(k, ref, alt),
                     cut_before=lo > 0)


def _diff_detail(k: int, ref: pd.DataFrame, alt: pd.DataFrame) -> list:
    parts = []
    for label, df in (("reference", ref), ("this completion", alt)):
        if k < len(df):
            s = df.iloc[k]
            parts += [f"{label} chose ", Model(s.piece), f" (logprob {fmt_hex(s.logprob_hex)}, "
                      f"top1−top2 margin {fmt_margin(s.margin_hex)}); "]
        else:
            parts.append(f"{label} had ended; ")
    if k < len(ref) and k < len(alt) and ref.iloc[k].top_ids:
        s, tok = ref.iloc[k], int(alt.iloc[k].token)
        rank = s.top_ids.index(tok) + 1 if tok in s.top_ids else None
        parts.append(f"in the reference, that token ranked #{rank} of its top {len(s.top_ids)}."
                     if rank else f"that token was outside the reference's top {len(s.top_ids)}.")
    return parts


# -- figures ----------------------------------------------------------------------------


def _figure_sections(t: RunTables) -> list[Section]:
    rd = run_dir_arg(t)
    no_bisect = ["No bisect yet: run ", Code(f"nondet bisect {rd}"), "."]
    return [
        Section("First divergence steps", "fig-first-divergence", figure_or_hint(
            "first_divergence.svg", figures.first_divergence_histogram(t), "Histogram of first divergence steps",
            ["Per run: the first step whose logprob bits differ from the reference, and the first step "
             "whose token differs. Numeric divergence comes first; the token flips later, at a near-tie."],
            ["No run diverged from the reference: nothing to plot."]), level=3),
        Section("Completions by batch size", "fig-batch-size", figure_or_hint(
            "distinct_by_batch_size.svg", figures.distinct_by_batch_size(t), "Completions by batch size",
            ["Every run at each batch size, coloured by the completion it produced (green: the reference's); "
             "the number on top counts the runs whose completion differs from their prompt's reference."],
            ["No runs with a batch size and completion id: rerun `nondet probe`."]), level=3),
        Section("Bisect: where the difference is born", "fig-bisect", bisect_blocks(t, no_bisect), level=3),
        Section("Bisect: amplification", "fig-amplification", figure_or_hint(
            "amplification.svg", figures.amplification_curve(t), "Amplification of the difference",
            ["Largest absolute difference of the target row's residual stream after each decoder layer, "
             "per replayed step: how far a few-ULP difference at the origin spreads, and whether it lasts "
             "until a near-tie flips a token."],
            no_bisect), level=3),
        Section("Before / after: batch-invariant kernels", "fig-before-after", figure_or_hint(
            "kernels_before_after.svg", figures.kernels_before_after(t), "Default against batch-invariant kernels",
            ["Distinct completions per condition under default and batch-invariant kernels."],
            ["No before/after comparison yet: run ", Code(_confirm_command(t)), "."]), level=3),
    ]


# -- environment, reproduce ---------------------------------------------------------


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", ", ".join(map(str, v)) if isinstance(v, list) else str(v)))
    return out


def _environment(t: RunTables) -> list:
    if not t.fingerprint:
        return [Para(["No environment fingerprint (fingerprint.json is missing): rerun ",
                      Code("nondet probe"), " to record it."], kind="hint")]
    return [Table(["setting", "value"], [[Code(k), v] for k, v in _flatten(t.fingerprint)])]


def probe_command(t: RunTables) -> str | None:
    """The probe's command line as recorded in config.json, spelled as `nondet ...`."""
    argv = [str(a) for a in t.config.get("argv") or []]
    if not argv:
        return None
    if argv[0].endswith(("nondet", "__main__.py", "python", "python3")) or "/" in argv[0]:
        argv = argv[1:]
    if argv[:2] == ["-m", "nondet"]:
        argv = argv[2:]
    command = t.config.get("command", "probe")
    if not argv or argv[0] not in (command, "gate"):  # a gate's probe records the gate's own command line
        argv = [command, *argv]
    return "nondet " + shlex.join(argv)


def _confirm_command(t: RunTables) -> str:
    cmd = probe_command(t) or "nondet probe"
    if cmd.split()[1] == "gate":  # the gate judges one kernels mode: the other is a second gate run
        return cmd if "--kernels" in cmd.split() else cmd + " --kernels batch-invariant"
    return cmd if "--confirm" in cmd.split() else cmd + " --confirm"


def _reproduce(t: RunTables) -> list:
    cmd = probe_command(t)
    if cmd is None:
        return [Para(["No recorded command (config.json is missing or has no argv)."], kind="hint")]
    lines = [cmd]
    if t.bisect is not None:
        cond = t.bisect.get("condition_id")
        lines.append(f"nondet bisect {run_dir_arg(t)}" + (f" --condition {shlex.quote(cond)}" if cond else ""))
    lines.append(f"nondet report {run_dir_arg(t)}")
    return [Para(["With the environment above (same library versions, device and threads):"]), CodeBlock(lines)]
