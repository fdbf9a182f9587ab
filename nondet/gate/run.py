"""The gate as a library: probe each target, judge it under a policy, write the CI outputs, diagnose.

    from nondet.gate import GateOutputs, Policy, run_gate
    result = run_gate([ProbeConfig(...)], Policy.parse("max-distinct = 2"), GateOutputs(junit="junit.xml"))
    result.passed, result.verdicts[0].failures

    # several axes, each with its policy: probe configs (batch sizes, or speculative forms)
    # and rl configs (nondet rl: sampler vs trainer micro-batches)
    run_targets([GateTarget(probe_config, Policy()),
                 GateTarget(rl_config, Policy("max-kl", 1e-6, axis="rl"), name="rl")])

The caller builds the probe configs (the CLI: nondet/cli/probe_config.py) and says how it
shows the run through GateHooks: a probe runner (the CLI's has a progress bar) and callbacks
for the verdicts, the bisect line, warnings and the report. Nothing here prints; the one
exception is the `::error` annotations under GitHub Actions, a CI output like the JUnit file.
"""

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from nondet.gate import github
from nondet.gate.diagnose import bisect_first_failure
from nondet.gate.junit import write_junit
from nondet.gate.policy import Policy, Verdict, evaluate

if TYPE_CHECKING:
    from nondet.prompt import Prompt
    from nondet.probes.probe import ProbeConfig, ProbeResult
    from nondet.rl.config import RLConfig
    from nondet.rl.run import RLResult


@dataclass(frozen=True)
class GateOutputs:
    junit: str | None = None  # JUnit XML path, or None
    bisect: bool = True  # bisect the first failing condition (when nondet bisect is installed)


@dataclass(frozen=True)
class GateTarget:
    """One thing the gate runs and judges: a probe (batch or speculative axis) or an rl run."""

    config: "ProbeConfig | RLConfig"
    policy: Policy  # its axis must fit the config: rl for an RLConfig, batch or speculative for a probe
    name: str = ""  # how its verdict, JUnit suite and annotations name it ("" when only one thing is gated)


@dataclass
class Gated:
    run_dir: Path
    summary: dict  # summary.json of the probe
    verdict: Verdict
    bisect: str | None = None  # the bisect's one-line result, or its warning; None when not bisected


def _nothing(*_args) -> None:
    return None


@dataclass(frozen=True)
class GateHooks:
    """How the caller sees a gate run. Every hook is optional: a library caller can read GateResult."""

    probe: "Callable[[ProbeConfig], ProbeResult] | None" = None  # runs one probe; None = run_probe, no display
    rl: "Callable[[RLConfig], RLResult] | None" = None  # runs one nondet rl; None = run_rl, no display
    on_judged: Callable[[list[Gated]], None] = _nothing  # all prompts judged, JUnit written: show the verdicts
    on_bisect: Callable[[Path, str], None] = _nothing  # (run_dir, line) after a violation was bisected
    on_warning: Callable[[str], None] = _nothing  # a diagnostic failed; the verdict and exit code stand
    report: Callable[[Path], None] | None = None  # writes a run directory's report (gate never imports reports)


@dataclass
class GateResult:
    gated: list[Gated]  # one per probe config, in order
    warnings: list[str] = field(default_factory=list)  # diagnostics that failed (never change the verdict)

    @property
    def verdicts(self) -> list[Verdict]:
        return [g.verdict for g in self.gated]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)


def run_gate(configs: "Sequence[ProbeConfig]", policy: Policy, outputs: GateOutputs = GateOutputs(),
             hooks: GateHooks = GateHooks()) -> GateResult:
    """Probe every config, judge, write the CI outputs, bisect, report; result.passed when the policy is met."""
    from nondet.prompt import label

    several = len(configs) > 1
    return run_targets([GateTarget(c, policy, f"prompt {label(c.prompt)[:60]!r}" if several else "")
                        for c in configs], outputs, hooks)


def run_targets(targets: Sequence[GateTarget], outputs: GateOutputs = GateOutputs(),
                hooks: GateHooks = GateHooks()) -> GateResult:
    """run_gate over targets of any axis, each judged under its own policy; one JUnit file, one summary."""
    started = time.perf_counter()
    result = GateResult([_gate_one(t, hooks) for t in targets])
    if outputs.junit:
        _write_junit(outputs.junit, result, hooks, time.perf_counter() - started)
    github.annotate(result.verdicts)
    hooks.on_judged(result.gated)
    for g in result.gated:  # diagnostics: they never change the verdict or the exit code
        if outputs.bisect and not g.verdict.passed and g.verdict.policy.axis != "rl":  # bisect replays probes
            g.bisect = _diagnose("bisect", result, hooks, _bisect, g, hooks)
        if hooks.report is not None:
            _diagnose("report", result, hooks, hooks.report, g.run_dir)
    _step_summary(result, hooks)
    return result


def prompt_dirs(prompts: "Sequence[Prompt]", out: str | None) -> "list[tuple[Prompt | None, str]]":
    """(prompt, run directory) pairs: the run directory itself, or prompt-N below it.
    No prompts: one pair (None, run directory), None meaning the probe's default prompt."""
    from nondet.probes.probe import default_run_dir

    base = out or default_run_dir("gate")
    if len(prompts) <= 1:
        return [(prompts[0] if prompts else None, base)]
    return [(p, str(Path(base) / f"prompt-{i}")) for i, p in enumerate(prompts, start=1)]


def verdict_json(verdict: Verdict) -> dict:
    """gate.json: the policy, pass/fail and each condition's result (docs/run-directory.md)."""
    return dataclasses.asdict(verdict)


def _run_probe(config: "ProbeConfig") -> "ProbeResult":
    from nondet.probes.probe import run_probe

    return run_probe(config)


def _run_rl(config: "RLConfig") -> "RLResult":
    from nondet.rl.run import run_rl

    return run_rl(config)


def _gate_one(target: GateTarget, hooks: GateHooks) -> Gated:
    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_streams, require_finished
    from nondet.rundir.writer import write_gate
    from nondet.rundir.records import to_json

    if target.policy.axis == "rl":  # the pairs in summary.json hold the metrics; no streams needed
        result = (hooks.rl or _run_rl)(target.config)
        streams = None
    else:
        result = (hooks.probe or _run_probe)(target.config)
        rd = RunDir(result.run_dir)
        require_finished(rd)  # a hooks.probe may hand back a directory it did not finish: no verdict on that
        streams = [to_json(s) for s in read_streams(rd, whole=True)]  # exact logprobs, for the policy
    verdict = evaluate(result.summary, streams, target.policy, name=target.name, run_dir=str(result.run_dir))
    write_gate(RunDir(result.run_dir), verdict_json(verdict))  # the report shows it
    return Gated(result.run_dir, result.summary, verdict)


def _bisect(g: Gated, hooks: GateHooks) -> str | None:
    line = bisect_first_failure(g.run_dir, g.verdict)
    if line is not None:
        hooks.on_bisect(g.run_dir, line)
    return line


def _diagnose(what: str, result: GateResult, hooks: GateHooks, step, *args) -> str | None:
    """Run a diagnostic step; its one-line error is a warning, so a violation keeps meaning 'violated'.
    Returns the step's one-line result, or the warning."""
    from nondet.errors import NondetError

    try:
        return step(*args)
    except NondetError as exc:
        return _warn(f"{what} failed: {exc}", result, hooks)
    except Exception as exc:  # a diagnostic's own bug: the verdict was given; exit 1 must stay exit 1
        return _warn(f"{what} failed: {type(exc).__name__}: {exc} (NONDET_DEBUG=1 nondet bisect RUN_DIR "
                     "shows the traceback)", result, hooks)


def _write_junit(path: str, result: GateResult, hooks: GateHooks, seconds: float) -> None:
    """The JUnit file; one that cannot be written (its path was checked before the run, but a disk can fill or
    turn read-only) is a warning: the verdict and its exit code stand."""
    try:
        write_junit(path, result.verdicts, seconds)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        _warn(f"cannot write the JUnit file {path}: {reason}; the gate's verdict stands", result, hooks)


def _step_summary(result: GateResult, hooks: GateHooks) -> None:
    """The GitHub step summary, last (it holds the bisect result). A summary that cannot be written
    is a warning: the verdict, the JUnit file and the annotations stand."""
    try:
        github.append_step_summary(result.verdicts, bisects=[g.bisect for g in result.gated])
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        _warn(f"cannot write the GitHub step summary to {os.environ.get('GITHUB_STEP_SUMMARY')}: {reason}; "
              "the gate's verdict stands", result, hooks)


def _warn(text: str, result: GateResult, hooks: GateHooks) -> str:
    result.warnings.append(text)
    hooks.on_warning(text)
    return text
