"""The gate's policy and its verdict: which batch variance a model repository accepts.

A policy is ONE requirement on ONE axis, checked per condition against that axis's reference.
The axes (`axis`), each a key of nondet.toml:

    batch         (require = ...)      each batched call of the probe vs the prompt alone at batch size 1
    speculative   (speculative = ...)  each speculative form (ngram:K, self:K, draft) vs plain greedy
    rl            (rl = ... / max-kl)  each trainer micro-batch size vs the sampler's logprobs of the
                                       same sampled tokens (`nondet rl`)

The requirements (rl takes identical and max-kl only; max-kl is rl's alone):

    identical                 every run has the reference's tokens AND bit-identical logprobs
    max-distinct = N          at most N distinct completions per kernels mode, the reference's
                              included (a condition fails when one of its runs produces a
                              completion beyond the reference and the N-1 most common ones)
    min-divergence-step = S   no run's tokens diverge before step S (steps count from 0)
    max-logprob-diff = X      same tokens as the reference, and every chosen token's logprob
                              within X of the reference's (needs streams.jsonl)
    max-flip-rate = P         (batch) per kernels mode, the 95% upper bound of the rate of runs whose
                              tokens leave their reference (Wilson; summary.json confidence) is below
                              P: met only when the runs rule out a higher rate; when not, the message
                              says how many flip-free runs would decide
    max-kl = X                (rl) KL(sampler || trainer) at most X: the exact mean per-token KL
                              where the sampler's distributions were kept (in process), else
                              the k3 estimate over the sampled tokens (nondet/rl/compare.py);
                              identical on rl means every sampled token's logprob
                              bit-identical (KL exactly 0)

A check that could not have failed is a failure (gate/vacuous.py): nothing compared, a condition whose
runs repeat the reference's computation, max-distinct = N over at most N runs; min-divergence-step = 0
and max-flip-rate = 1 are refused when parsed.

A failed condition's message names the first divergence and the branch tokens, e.g.
    first token divergence at step 93 (run 3, row 7): reference ' Queens' vs ' New'
Pure Python on summary.json / streams.jsonl records; imports no torch.
"""

from dataclasses import dataclass, field

from nondet.errors import UsageError
from nondet.gate.prompts import per_prompt
from nondet.gate.rl_policy import rl_message
from nondet.gate.vacuous import (MAX_DISTINCT, fail_unexercised, short_reference, unexercised,
                                 unfailable_threshold)
from nondet.interval import runs_to_bound
from nondet.verdict import partly_line

# results that judge a whole mode or run rather than one condition of it: nothing to replay
FLIP_RATE, KERNEL_COVERAGE = "flip-rate", "kernel-coverage"
REQUIREMENTS = ("identical", "max-distinct", "min-divergence-step", "max-logprob-diff", "max-kl", "max-flip-rate")
AXES = {  # axis -> the requirements it takes
    "batch": REQUIREMENTS[:4] + ("max-flip-rate",),
    "speculative": REQUIREMENTS[:4],
    "rl": ("identical", "max-kl"),
}


@dataclass(frozen=True)
class Policy:
    require: str = "identical"  # one of REQUIREMENTS; identical is the only safe default
    value: float | None = None  # N, S or X of a threshold requirement; None for identical
    axis: str = "batch"  # which comparison it judges: batch | speculative | rl (see AXES)

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise UsageError(f"axis must be one of {', '.join(AXES)}, not {self.axis!r}")
        allowed = AXES[self.axis]
        if self.require not in allowed:
            what = "requirement" if self.axis == "batch" else f"{self.axis} requirement"
            raise UsageError(f"{what} must be one of {', '.join(allowed)}, not {self.require!r}")
        if (self.value is None) != (self.require == "identical"):
            raise UsageError(f"requirement {self.require!r} needs a value, as in '{self.require} = N'"
                             if self.value is None else "requirement 'identical' takes no value")
        if self.value is not None:
            _check_value(self.require, self.value)

    @classmethod
    def parse(cls, text: str, axis: str = "batch") -> "Policy":
        """'identical', 'max-distinct = 2', 'min-divergence-step=50', 'max-logprob-diff = 1e-3', 'max-kl = 1e-6'."""
        name, sep, value = (part.strip() for part in text.partition("="))
        if not sep:
            return cls(name, axis=axis)
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"requirement {text.strip()!r}: {value!r} is not a number") from None
        return cls(name, number, axis)

    def describe(self) -> str:
        """'identical', 'max-distinct = 2'; other axes than batch are named: 'rl: max-kl = 0.001'."""
        if self.value is None:
            text = self.require
        else:
            shown = int(self.value) if self.require in ("max-distinct", "min-divergence-step") else self.value
            text = f"{self.require} = {shown}"
        return text if self.axis == "batch" else f"{self.axis}: {text}"

    def evaluate(self, summary: dict, streams: list[dict] | None = None, name: str = "") -> "Verdict":
        return evaluate(summary, streams, self, name)


def _check_value(require: str, value: float) -> None:
    if require == "max-flip-rate":  # 1 passes whatever the runs hold: a gate that cannot fail
        if not 0 < value < 1:
            raise UsageError(f"max-flip-rate is a rate in (0, 1), not {value:g}")
        return
    if require in ("max-distinct", "min-divergence-step") and value != int(value):
        raise UsageError(f"{require} must be an integer, not {value:g}")
    lowest = 1 if require in ("max-distinct", "min-divergence-step") else 0  # no divergence is before step 0
    if not value >= lowest:  # NaN too
        raise UsageError(f"{require} must be >= {lowest}, not {value:g}")


@dataclass(frozen=True)
class ConditionResult:
    kernels: str  # kernels mode of the condition
    condition_id: str  # e.g. "default/bs8/ends"
    n_runs: int
    first_token_divergence: int | None  # earliest over the condition's runs
    first_numeric_divergence: int | None
    passed: bool
    message: str  # why it failed: first divergence and branch tokens; "" when it passed


@dataclass(frozen=True)
class Verdict:
    policy: Policy
    name: str  # what was gated (e.g. the prompt); "" when only one thing was
    conditions: tuple[ConditionResult, ...]  # every non-reference condition, in run order
    run_dir: str = ""  # where the evidence is, when known
    note: str = ""  # what the check could not see, e.g. a server that sent no logprobs
    passed: bool = field(init=False)

    def __post_init__(self) -> None:  # nothing compared passes nothing (gate/vacuous.py)
        object.__setattr__(self, "passed", bool(self.conditions) and all(c.passed for c in self.conditions))

    @property
    def failures(self) -> list[ConditionResult]:
        return [c for c in self.conditions if not c.passed]

    @property
    def message(self) -> str:
        """One line: met, or the first failing condition and its divergence."""
        policy = self.policy.describe() + (f"; {self.note}" if self.note else "")
        if not self.conditions:
            return (f"nothing compared ({policy}): no condition besides the reference ran, so no difference "
                    "could have shown; run more than the reference (batch sizes above 1, --runs above 1)")
        if self.passed:
            against = "the sampler" if self.policy.axis == "rl" else "the reference"
            return f"policy met ({policy}): {len(self.conditions)} condition(s) agree with {against}"
        first = self.failures[0]
        return (f"policy violated ({policy}): {len(self.failures)} of {len(self.conditions)} condition(s) "
                f"fail; {first.condition_id}: {first.message}")


def evaluate(summary: dict, streams: list[dict] | None = None, policy: Policy = Policy(),
             name: str = "", run_dir: str = "") -> Verdict:
    """Check every non-reference condition of every kernels mode in summary.json; on the rl axis,
    every sampler/trainer pair of an rl run's summary.json (streams are not needed)."""
    _check_axis(summary, policy)
    if policy.axis == "rl":
        return Verdict(policy, name, tuple(_judge_rl_pair(p, policy) for p in summary["rl"]["pairs"]), run_dir)
    level = summary.get("load", {}).get("compare_level")
    blind = level in ("tokenizer", "text")  # a server that sent no logprobs: tokens only
    if policy.require == "max-logprob-diff" and (streams is None or blind):
        raise UsageError("max-logprob-diff needs logprobs: " + (
            f"the server sent none (compared at level {level})" if blind else "pass the streams (streams.jsonl)"))
    if policy.require == "max-flip-rate":
        results = [_judge_flip_rate(name_, mode, policy.value) for name_, mode in summary["modes"].items()]
    else:
        results = [r for name_, mode in summary["modes"].items() for r in _judge_mode(name_, mode, streams, policy)]
    results = fail_unexercised(results, unexercised(summary, policy.axis))
    results += [ConditionResult(mode, MAX_DISTINCT, runs, None, None, False, message)
                for mode, runs, message in unfailable_threshold(summary, policy.require, policy.value)]
    results += _coverage_failures(summary)
    notes = [f"compared at level {level}: logprob bits not checked" if blind else "", short_reference(summary)]
    return Verdict(policy, name, tuple(results), run_dir, "; ".join(n for n in notes if n))


def _judge_flip_rate(mode_name: str, mode: dict, limit: float) -> ConditionResult:
    """One kernels mode's runs pooled: met when the 95% upper bound of its flip rate is below `limit`."""
    c = mode.get("confidence")
    if c is None:
        raise UsageError("max-flip-rate needs summary.json's confidence (written by probes since nondet "
                         "added it): probe again")
    passed = c["high"] < limit
    message = "" if passed else (
        f"{c['diverged']} of {c['runs']} runs diverged: the flip rate's 95% upper bound {c['high']:.3g} is not "
        f"below {limit:g}" + ("" if c["diverged"] else f"; {runs_to_bound(limit)} runs with no flip would decide"))
    return ConditionResult(mode_name, FLIP_RATE, c["runs"], mode.get("first_token_divergence"),
                           mode.get("first_numeric_divergence"), passed, message)


def _coverage_failures(summary: dict) -> list[ConditionResult]:
    """A run whose batch-invariant kernels were partly invariant (--allow-uncovered: the op census found
    ops the mode does not cover) fails every policy: its agreement proves nothing about those ops."""
    coverage = summary.get("kernel_coverage") or {}
    if coverage.get("coverage") != "partly invariant":
        return []
    message = partly_line(coverage.get("uncovered") or [])
    return [ConditionResult("batch-invariant", KERNEL_COVERAGE, 0, None, None, False, message)]


def _check_axis(summary: dict, policy: Policy) -> None:
    if policy.require == "max-kl" and policy.axis != "rl":
        raise UsageError("max-kl judges `nondet rl` runs: give it as the rl policy (rl = \"max-kl = X\")")
    is_rl = "rl" in summary
    if is_rl != (policy.axis == "rl"):
        raise UsageError(f"a {policy.axis} policy cannot judge "
                         + ("an rl run (use rl = ... or max-kl)" if is_rl else "a probe run (rl policies judge nondet rl)"))
    if policy.axis == "speculative" and "speculative" not in summary:
        raise UsageError("a speculative policy needs a run of `nondet probe --speculative FORMS`")


def _judge_mode(mode_name: str, mode: dict, streams: list[dict] | None, policy: Policy) -> list[ConditionResult]:
    mine = [s for s in streams or [] if s.get("kernels", mode_name) == mode_name]
    views = [_ModeView(one, mine) for one in per_prompt(mode)]
    results = []
    for cond in mode["conditions"]:
        messages = [m for m in (_judge_prompt(v, cond["condition_id"], policy) for v in views) if m is not None]
        if messages == []:
            continue  # the condition only holds references: they are what the others are compared with
        failed = [m for m in messages if m]
        message = failed[0] + (f" (and {len(failed) - 1} more prompt(s))" if len(failed) > 1 else "") if failed else ""
        results.append(ConditionResult(mode_name, cond["condition_id"], cond["n_runs"],
                                       cond["first_token_divergence"], cond["first_numeric_divergence"],
                                       not failed, message))
    return results


def _judge_prompt(view: "_ModeView", condition_id: str, policy: Policy) -> str | None:
    """One prompt's runs of a condition: None when it has none but references, "" when they pass,
    else the failure message (prefixed with the prompt when the run holds several)."""
    runs = [r for r in view.mode["runs"] if r["condition_id"] == condition_id]
    if all(r["is_reference"] for r in runs):
        return None
    message = _CHECKS[policy.require](view, runs, policy.value)
    if message and view.mode.get("prompt_label"):
        return f"{view.mode['prompt_label']}: {message}"
    return message or ""


class _ModeView:
    """Tokens, pieces and logprobs of one kernels mode's runs, from streams or the summary."""

    def __init__(self, mode: dict, streams: list[dict]) -> None:
        self.mode = mode
        self.streams = {s["run_id"]: s for s in streams}
        self.tokens = {c["completion_id"]: c["tokens"] for c in mode["completions"]}
        self.pieces = _tree_pieces(mode.get("branch_tree"))
        self.ref_id = mode["reference_run_id"]
        self.completion_of = {r["run_id"]: r["completion_id"] for r in mode["runs"]}

    def step(self, run_id: int, step: int) -> dict | None:
        """{"token", "piece", "logprob"?, "margin"?} of one step, or None past the end."""
        stream = self.streams.get(run_id)
        if stream is not None:
            return stream["steps"][step] if step < len(stream["steps"]) else None
        tokens = self.tokens[self.completion_of[run_id]]
        if step >= len(tokens):
            return None
        return {"token": tokens[step], "piece": self.pieces.get(tokens[step])}

    def logprob_diffs(self, run_id: int) -> list[float]:
        ref, run = self.streams[self.ref_id]["steps"], self.streams[run_id]["steps"]
        return [abs(float.fromhex(a["logprob"]) - float.fromhex(b["logprob"])) for a, b in zip(ref, run)]


def _tree_pieces(node: dict | None) -> dict[int, str]:
    """token id -> piece for every branch token in the tree (the summary's only pieces)."""
    pieces: dict[int, str] = {}
    for alt in node["alternatives"] if node else []:
        pieces.setdefault(alt["token"], alt["piece"])
        for token, piece in _tree_pieces(alt["child"]).items():
            pieces.setdefault(token, piece)
    return pieces


# -- the four requirements: each returns None (pass) or the failure message -----------------

def _identical(view: _ModeView, runs: list[dict], _value) -> str | None:
    diverged = [r for r in runs if r["first_token_divergence"] is not None]
    if diverged:
        return _token_message(view, _earliest(diverged, "first_token_divergence"), runs)
    numeric = [r for r in runs if r["first_numeric_divergence"] is not None]
    if numeric:
        return _numeric_message(view, _earliest(numeric, "first_numeric_divergence"))
    return None


def _max_distinct(view: _ModeView, runs: list[dict], value) -> str | None:
    beyond = [r for r in runs if r["completion_id"] >= int(value)]
    if not beyond:
        return None
    total = view.mode["distinct_completions"]
    return (f"{total} distinct completions in {view.mode['kernels']} kernels, at most {int(value)} allowed; "
            + _token_message(view, _earliest(beyond, "first_token_divergence"), runs))


def _min_divergence_step(view: _ModeView, runs: list[dict], value) -> str | None:
    early = [r for r in runs if r["first_token_divergence"] is not None
             and r["first_token_divergence"] < int(value)]
    if not early:
        return None
    return f"diverges before step {int(value)}: " + _token_message(
        view, _earliest(early, "first_token_divergence"), runs)


def _max_logprob_diff(view: _ModeView, runs: list[dict], value) -> str | None:
    diverged = [r for r in runs if r["first_token_divergence"] is not None]
    if diverged:
        return _token_message(view, _earliest(diverged, "first_token_divergence"), runs)
    for run in runs:
        diffs = view.logprob_diffs(run["run_id"])
        worst = max(range(len(diffs)), key=diffs.__getitem__, default=None)
        if worst is not None and diffs[worst] > value:
            first = next(i for i, d in enumerate(diffs) if d > value)
            return (f"logprob differs by {diffs[worst]:.3g} > {value:g} at step {worst} "
                    f"(first over the limit at step {first}; run {run['run_id']}, row {run['position']})")
    return None


_CHECKS = {"identical": _identical, "max-distinct": _max_distinct,
           "min-divergence-step": _min_divergence_step, "max-logprob-diff": _max_logprob_diff}


# -- the rl axis: one condition per trainer micro-batch size, against the sampler ------------

def _judge_rl_pair(pair: dict, policy: Policy) -> ConditionResult:
    firsts = [f for f in pair.get("first_diff") or [] if f is not None]
    message = rl_message(pair, policy.require, policy.value) if pair.get("n_tokens") else None
    return ConditionResult(pair["kernels"], pair["trainer_condition"], len(pair.get("prompt_ids") or []),
                           None, min(firsts, default=None), message is None, message or "")


# -- messages ------------------------------------------------------------------------------

def _earliest(runs: list[dict], key: str) -> dict:
    return min(runs, key=lambda r: r[key])


def _token_message(view: _ModeView, run: dict, runs: list[dict]) -> str:
    """'first token divergence at step 93 (run 3, row 7, 2 of 2 runs): reference ' Queens' vs ' New''."""
    step = run["first_token_divergence"]
    n = sum(r["first_token_divergence"] is not None for r in runs)
    ref, here = view.step(view.ref_id, step), view.step(run["run_id"], step)
    text = (f"first token divergence at step {step} (run {run['run_id']}, row {run['position']}, "
            f"{n} of {len(runs)} runs): reference {_show(ref)} vs {_show(here)}")
    if run["first_numeric_divergence"] is not None and run["first_numeric_divergence"] < step:
        text += f"; logprob bits differ from step {run['first_numeric_divergence']}"
    return text


def _numeric_message(view: _ModeView, run: dict) -> str:
    step = run["first_numeric_divergence"]
    ref, here = view.step(view.ref_id, step), view.step(run["run_id"], step)
    same = "same tokens as far as decoded (stopped there: --fail-fast)" if run.get("stopped") else "same tokens"
    text = (f"{same}, but logprob bits differ from step {step} "
            f"(run {run['run_id']}, row {run['position']}) at {_show(ref)}")
    if ref and here and "logprob" in ref and "logprob" in here:
        a, b = float.fromhex(ref["logprob"]), float.fromhex(here["logprob"])
        text += f": {a!r} vs {b!r} (diff {abs(a - b):.3g})"
    return text


def _show(step: dict | None) -> str:
    """A branch token as repr of its piece (escapes control characters), or <end>."""
    if step is None:
        return "<end>"
    piece = step.get("piece")
    shown = repr(piece) if piece is not None else f"token {step['token']}"
    margin = step.get("margin")
    return shown + (f" (margin {float.fromhex(margin):.3g})" if margin else "")
