"""The verdict: what a probe found, in one sentence. The one place that words it.

`verdict(modes, level)` is summary.json's sentence (the terminal prints it): one clause per
kernels mode, over one prompt or several; a server compared without logprobs says what its
texts show. `report_verdict(modes, mode, minimal_set)` is the report's headline about one
mode, with the ablation's fix and the batch-invariant confirmation; `tp_verdict(section)` a --tp probe's
sentence, within each degree and across them; `replay_line` a bisect replay whose reference is not the
probe's. `partly_line`,
`injected_control_line` and `graph_census_line` word what the batch-invariant kernels covered (summary.json,
the gate, the report); `confidence_line` how sure a mode's verdict is (its rate, interval and grade); `undrafted_line` a speculative form that drafted nothing. `modes` is summary.json's
"modes": {kernels mode: the diff of its runs (probes/core/diff.py)}. No torch, no pandas.
"""

from typing import Sequence

from nondet.fmt import fmt_step

TOKENS, BITS, BITS_NA, SAME = "tokens differ", "bits differ", "bits n/a", "identical"  # what a mode shows


def finding(m: dict) -> str:
    """What one mode's runs show, the most serious first."""
    if m.get("distinct_completions", 1) > 1:
        return TOKENS
    if m.get("numeric_na"):
        return BITS_NA
    return BITS if m.get("first_numeric_divergence") is not None else SAME


def verdict(modes: dict[str, dict], level: str = "logprobs", subject: str | None = None) -> str:
    """summary.json's sentence. `level`: what the runs were compared on ("logprobs"; a server
    that sent none: "tokenizer" = texts tokenized locally, else "words"). `subject`: who is
    judged when it is not our kernels (a live "server", whose kernels are unknown)."""
    if level != "logprobs":
        return _text_verdict(modes["default"], "token" if level == "tokenizer" else "word")
    return "; ".join((_prompts_clause(subject or f"{name} kernels", m) if m.get("n_prompts", 1) > 1
                      else _mode_clause(subject or f"{name} kernels", m)) + stopped_clause(m)
                     for name, m in modes.items())


def stopped_clause(m: dict) -> str:
    """A mode whose runs --fail-fast cut at their settled verdicts: they were compared only that far."""
    n = m.get("stopped_runs")
    return (f" ({n} run{'s' if n > 1 else ''} stopped once the verdict was settled (--fail-fast): "
            "compared only that far)") if n else ""


def _mode_clause(name: str, m: dict) -> str:
    if m["n_runs"] <= 1:  # the reference alone: no run could have differed
        return f"{name}: nothing compared, only the reference ran (the prompt alone at batch size 1)"
    found = finding(m)
    if found == TOKENS:
        return (f"{name}: batch-variant, {m['distinct_completions']} distinct completions "
                f"over {m['n_runs']} runs; first token divergence at step {m['first_token_divergence']}")
    if found == BITS:
        return (f"{name}: same tokens over {m['n_runs']} runs, but logprob bits differ "
                f"from step {m['first_numeric_divergence']}")
    return (f"{name}: batch-invariant, 1 distinct completion over {m['n_runs']} runs, "
            "bit-identical logprobs")


def _prompts_clause(name: str, m: dict) -> str:
    """Several prompts: how many changed tokens, how many only bits."""
    n, flipped, bits = m["n_prompts"], m["prompts_diverged"], m["prompts_bits_differ"]
    if m["n_runs"] <= n:  # each prompt's reference alone
        return f"{name}: nothing compared, only the {n} prompts' references ran (each alone at batch size 1)"
    if flipped:
        return (f"{name}: batch-variant, tokens differ on {flipped} of {n} prompts (up to "
                f"{m['distinct_completions']} distinct completions per prompt over {m['n_runs']} runs); "
                f"first token divergence at step {m['first_token_divergence']}")
    if bits:
        return (f"{name}: same tokens on all {n} prompts over {m['n_runs']} runs, but logprob bits "
                f"differ on {bits} of {n} prompts from step {m['first_numeric_divergence']}")
    return (f"{name}: batch-invariant, 1 distinct completion per prompt over {m['n_runs']} runs "
            f"({n} prompts), bit-identical logprobs")


def _text_verdict(m: dict, unit: str) -> str:
    """A server without logprobs: only its texts, compared `unit` by `unit`."""
    if m["distinct_completions"] == 1:
        return f"server: 1 distinct completion over {m['n_runs']} runs (texts compared {unit} by {unit})"
    return (f"server: batch-variant, {m['distinct_completions']} distinct completions over {m['n_runs']} runs; "
            f"first divergence at {unit} {m['first_token_divergence']}")


def tp_verdict(section: dict) -> str:
    """A --tp probe's sentence (summary.json "tensor_parallel"): per kernels mode, the batch variance within
    each degree, then what changing the degree alone does. The run's main diff mixes the two (every
    degree's streams against the smallest degree's reference), so a mode batch-invariant at every degree
    would read as variant there whenever the degrees sum in different orders."""
    return "; ".join(_tp_clause(mode, m, section.get("tp_invariant", False)) for mode, m in section["modes"].items())


def _tp_clause(mode: str, m: dict, tp_invariant: bool) -> str:
    name = f"{mode} kernels"
    degrees = m["by_degree"]
    if all(finding(r) == SAME for r in degrees):
        names = ", ".join(f"TP{r['tp']}" for r in degrees)
        within = [f"{name}: batch-invariant at every TP degree ({names}: 1 distinct completion each, "
                  "bit-identical logprobs)"]
    else:  # each degree as a mode's clause: "default kernels at TP1: ...; at TP2: ..."
        within = [_mode_clause(f"{name} at TP{r['tp']}" if i == 0 else f"at TP{r['tp']}", r)
                  for i, r in enumerate(degrees)]
    # --tp-invariant (the mode's K tree) is what makes degrees agree: under it the mode's difference is not excused
    why = " (the degrees sum in different orders)" if mode != "batch-invariant" else (
        "" if tp_invariant else " (the degrees sum in different orders; --tp-invariant makes them agree)")
    return "; ".join(within + [_degree_against(r, why) for r in m["vs_reference"]])


def _degree_against(r: dict, why: str) -> str:
    """One degree's prompt alone against the reference degree's; `why` follows a difference."""
    head = f"TP{r['tp']} against TP{r['against']}"
    if r["bitwise_equal"]:
        return f"{head}: bit-identical"
    if r["first_token_divergence"] is not None:
        found = f"tokens differ from step {r['first_token_divergence']}"
    else:
        found = f"same tokens, logprob bits differ from step {r['first_numeric_divergence']}"
    return f"{head}: {found}{why}"


def cross_engine_clause(section: dict) -> str:
    """`--against` with two engines (summary.json "against" with "cross_engine"): what is compared,
    and why a difference between the sides is no batch variance."""
    a, b = (s.get("engine") or "an unrecognized engine" for s in section["sides"])
    return (f"cross-engine comparison, not batch variance: A is {a}, B is {b}; different engines compute with "
            "different kernels and arithmetic (and may read other weight formats), so their logits are expected "
            "to differ from step 0")


def report_verdict(modes: dict[str, dict], mode: str, minimal_set: Sequence[str] = ()) -> str:
    """The report's headline about `mode`: variance found or not, where, and what fixes it."""
    m = modes[mode]
    found = finding(m)
    s = _report_clause(m, found, "" if mode == "default" else f" with {mode} kernels") + stopped_clause(m)
    if minimal_set and (found == TOKENS or m.get("first_numeric_divergence") is not None):
        s += f"; fixed by batch-invariant {' + '.join(minimal_set)}"
    if mode == "default" and "batch-invariant" in modes:
        s += _confirmed(modes["batch-invariant"])
    return s + "."


def _report_clause(m: dict, found: str, where: str) -> str:
    n_cond = m.get("n_conditions", 0)
    if found == TOKENS:
        return (f"Batch-variant{where}: {m['distinct_completions']} distinct completions over {n_cond} conditions "
                f"({m.get('n_runs')} runs); first token divergence at step {fmt_step(m.get('first_token_divergence'))}")
    if found == BITS_NA:
        return f"No token divergence{where}: 1 completion over {n_cond} conditions; logprob bits n/a ({m['numeric_na']})"
    if found == BITS:
        return (f"Numerically batch-variant{where}: 1 completion over {n_cond} conditions, "
                f"but logprob bits differ from step {m['first_numeric_divergence']}")
    return f"Batch-invariant{where}: 1 completion over {n_cond} conditions, bit-identical logprobs"


def _confirmed(inv: dict) -> str:
    """The batch-invariant mode beside the default one."""
    if inv.get("distinct_completions") == 1 and inv.get("first_numeric_divergence") is None:
        return "; with batch-invariant kernels: 1 completion, bit-identical logprobs"
    return (f"; with batch-invariant kernels: {inv.get('distinct_completions')} distinct completions, "
            f"first numeric divergence at step {fmt_step(inv.get('first_numeric_divergence'))}")


def routing_line(change: dict | None, steps: int) -> str:
    """bisect on a mixture of experts: where the routing changed first, or that it never did."""
    if change is None:
        return f"routing: same experts at every step ({steps} steps); the divergence is arithmetic"
    k = change["top_k"]
    margin = "" if change["margin"] is None else (
        f"; router margin between the {_ordinal(k)} and {_ordinal(k + 1)} expert {change['margin']:.2g}"
        f" (the reference's k-th and k+1-th router logits)")
    return (f"routing changed: step {change['step']}, layer {change['layer']}: experts "
            f"{_set(change['reference_experts'])} -> {_set(change['divergent_experts'])}{margin}")


def replay_line(b: dict) -> str | None:
    """bisect.json's reference replay, where it is not the probe's: other tokens, or the same tokens with other
    logprob bits (a compiled probe replayed eager, or other threads, versions or device); None where it is."""
    replay = b.get("replay") if isinstance(b.get("replay"), dict) else {}
    if b.get("reference_reproduced") is False:
        return ("the replayed reference's tokens differ from the probe's reference stream (other threads, library "
                "versions or device?): the attribution is for this replay")
    if b.get("reference_bits_reproduced") is False:
        why = _other_bits(b, replay)
        return f"the replayed reference has the probe's tokens but other logprob bits ({why}): the attribution " \
               "is for this replay"
    return None


def _other_bits(b: dict, replay: dict) -> str:
    """Why a replayed reference can keep the probe's tokens and lose its bits, most likely first."""
    if b.get("baseline"):  # a library caller's baseline: those classes were never the probe's kernels
        return f"the replay keeps {' + '.join(b['baseline'])} batch-invariant in every replay"
    if replay.get("probe_compiled"):
        return "the probe's decode steps were compiled (Inductor's kernels), the replay is eager"
    return "other threads, library versions or device?"


def _set(experts: list[int]) -> str:
    return "{" + ", ".join(str(e) for e in experts) + "}"


def _ordinal(n: int) -> str:
    return f"{n}{'tsnrhtdd'[(n // 10 % 10 != 1) * (n % 10 < 4) * n % 10::4]}"


def injected_control_line(norm: str) -> str:
    """What the demo's fix shows: the injected norm is swapped for its one-row path by construction."""
    return (f"{norm} is the injected control: under batch-invariant kernels it takes its one-row path by "
            "construction, so its fix shows the detector and the kernel swap; the op census and the family "
            "matrix show the kernels themselves")


def partly_line(uncovered: list[str]) -> str:
    """One line for a partly invariant run: how many ops the mode did not cover, the first few."""
    shown = "; ".join(uncovered[:3]) + ("; ..." if len(uncovered) > 3 else "")
    return f"batch-invariant kernels partly invariant: {len(uncovered)} op(s) not covered ({shown})"


def graph_census_line(g: dict) -> str:
    """--compile under the mode: what the ops Inductor compiled were (summary.json compiled_graph_census)."""
    stored = g.get("graphs_from_store") or 0
    if not g.get("graphs_inspected") and not stored:
        return ("compiled graphs under the mode: none inspected (the backend ran no Inductor pass); the compiled "
                "path's coverage rests on the census taken before compiling")
    unreviewed = sum(g.get("unreviewed", {}).values())
    inspected = f"{g['graphs_inspected']} inspected" + (
        f" and {stored} from the census store (graphs compiled under the census before: Inductor's cache or "
        "the saved decode steps serve those this run needs)" if stored else "")
    return (f"compiled graphs under the mode: {inspected}, {g['routed']} ops batch-invariant, "
            f"{g['row_independent']} row-independent, {len(g.get('uncovered', []))} uncovered"
            + (f", {unreviewed} unreviewed" if unreviewed else ""))


def confidence_line(name: str, c: dict) -> str:
    """How sure one kernels mode's verdict is (summary.json modes.<mode>.confidence): the runs that
    diverged in tokens, the 95% interval of the rate, and the grade."""
    k, n, undecided = c["diverged"], c["runs"], c.get("undecided", 0)
    if n == 0 and undecided:
        rate = f"no rate: all {undecided} runs stopped by --fail-fast before their tokens could leave the reference's"
    elif n == 0:
        rate = "no run besides the reference: no rate"
    elif k == 0:
        rate = f"0 of {n} runs diverged: the flip rate is below {_percent(c['high'])} at 95%"
    else:
        rate = (f"{k} of {n} runs diverged ({_percent(c['rate'])}; 95% interval {_percent(c['low'])}-"
                f"{_percent(c['high'])})")
    if n and undecided:
        rate += f" ({undecided} more stopped by --fail-fast before their tokens could leave the reference's)"
    return f"{name}: {rate}; {_grade_words(c)}"


def _grade_words(c: dict) -> str:
    grades = c.get("grades") or {}
    if sum(grades.values()) > 1:
        return "prompts " + ", ".join(f"{n} {g}" for g, n in grades.items())
    if c["grade"] == "fragile":
        steps = [p["fragile_steps"] for p in (c.get("prompts") or {}).values() if p["fragile_steps"]]
        shown = ", ".join(map(str, steps[0][:5])) + (", ..." if steps and len(steps[0]) > 5 else "")
        return f"fragile (the reference's margin is 0 or below the measured difference at step {shown})"
    return c["grade"]


def _percent(x: float) -> str:
    """0.1135 -> '11%', 0.00998 -> '1%', 0.0042 -> '0.42%'."""
    return f"{x:.0%}" if x == 0 or x >= 0.1 else f"{x * 100:.2g}%"


def sampler_lines(summary: dict) -> list[str]:
    """sampler_line of every kernels mode of a summary.json (terminal and report)."""
    sampler = (summary.get("sampling") or {}).get("sampler", "per-request")
    lines = [sampler_line(f"{mode} kernels", m.get("flip_causes") or {}, sampler)
             for mode, m in summary.get("modes", {}).items()]
    return [line for line in lines if line]


def sampler_line(name: str, causes: dict, sampler: str) -> str | None:
    """When some runs flipped with the reference's logits (summary.json modes.<mode>.flip_causes): the
    sampler's random stream, not the kernels, chose another token. None when no flip was the sampler's."""
    n = causes.get("sampler", 0)
    if not n:
        return None
    total = sum(causes.values())
    fix = {"shared": "the requests share one generator (--sampler shared); each request its own seeded generator "
                     "(--sampler per-request) removes it",
           "server": "every request carried the same seed, so the server ignores or shares seeds under load"
           }.get(sampler, "the requests drew different random numbers with equal seeds")
    return (f"{name}: {n} of {total} runs whose tokens differ had the reference's logits, bit for bit, at the "
            f"flip: the sampler chose another token, not the kernels; {fix}")


def undrafted_line(form: dict) -> str | None:
    """A speculative form (summary.json "speculative" by_form row) that drafted no token decoded as plain
    greedy does, plus its drafter's cost: say so where its gain would be read (the gain is left empty)."""
    if form.get("drafted", 1):
        return None
    return (f"{form['speculative']} ({form['kernels']} kernels) drafted no token in {form.get('rounds', 0)} "
            "round(s): every token came from one-token decoding, so it measured no speculative gain and its "
            "match with plain greedy compares nothing new; use a form that drafts (self:K) or more tokens")
