"""The continuous source: the target inside transformers' continuous-batching engine, in process.

Per kernels mode: the reference (the target alone in the engine), then `runs` replays of the
target while fillers arrive as a seeded Poisson process, `fillers_per_step` arrivals per
engine step on average, at most `max_fillers` in the engine at once, `fillers_per_run` in all.
The target joins at a seeded step, so it meets the batch mid-flight: requests join and leave
around it at every step. One condition per run; run r uses the same arrival pattern in every
kernels mode.
"""

import contextlib
import math
from dataclasses import dataclass

from nondet.probes.continuous.engine import ContinuousEngine, EngineSettings
from nondet.probes.core import arrivals
from nondet.probes.core.batch import tokenize_inputs
from nondet.probes.core.kernel_coverage import PARTLY
from nondet.probes.core.numerics import fingerprint
from nondet.probes.core.pieces import token_piece
from nondet.probes.core.replay import eos_ids, finish_reason
from nondet.probes.core.source import Emit, Opened, Planned, step_record
from nondet.probes.core.summarize import summarize_modes
from nondet.probes.models.loading import load_model
from nondet.rundir.records import ConditionRecord, StreamRecord, Summary

ATTENTION_NOTE = ("batch-invariant kernels under --load continuous cover matmul, norm and softmax only: the engine's "
                  "{impl} attention path (paged, packed, possibly CUDA-graphed) cannot take nondet's attention "
                  "kernel; invariance is not claimed for attention")
INVARIANT_NOTE = ("batch-invariant kernels under --load continuous: matmul, norm and softmax through nondet's "
                  "kernels; attention per request with nondet's kernel over the engine's paged KV cache "
                  "(CUDA graphs and the switch to flash attention are off in this probe, for both kernel modes)")


@dataclass(frozen=True)
class ContinuousSettings:
    runs: int = 8  # replays under load, besides the reference
    fillers_per_step: float = 0.5  # mean Poisson filler arrivals per engine step
    max_fillers: int = 8  # fillers in the engine at once
    fillers_per_run: int = 24  # filler requests per run

    @classmethod
    def from_config(cls, config) -> "ContinuousSettings":
        """The probe's flags (--runs, --rate, --concurrency, --filler-requests) over these defaults."""
        load, d = config.load, cls()
        return cls(runs=d.runs if config.runs is None else config.runs,
                   fillers_per_step=d.fillers_per_step if load.rate is None else load.rate,
                   max_fillers=load.concurrency or d.max_fillers,
                   fillers_per_run=d.fillers_per_run if load.filler_requests is None else load.filler_requests)


@dataclass(frozen=True)
class RunPlan:
    run: int  # 0 = the reference
    target_step: int  # engine step at which the target joins
    schedule: list  # filler arrivals (arrivals.per_step)


class ContinuousSource:
    kind = "continuous"

    def __init__(self, config) -> None:
        self.config = config  # ProbeConfig
        self.settings = ContinuousSettings.from_config(config)
        self.loaded = self.engine = None
        self.target: list[int] = []
        self.fillers: list[list[int]] = []
        self.run_ids = 0

    def open(self) -> Opened:
        self.loaded = load_model(self.config.model)
        self.target, self.fillers = tokenize_inputs(self.loaded.tokenizer, self.config.prompt, self.config.fillers)
        self.engine = ContinuousEngine(self.loaded.model, self._engine_settings())
        fp = fingerprint(self.loaded.description, ",".join(self.config.kernels))
        fp["load"] = {"mode": "continuous", "engine": "transformers ContinuousBatchingManager, stepped in process",
                      "attn_implementation": self.engine.attn_implementation,
                      "page_size": self.engine.settings.page_size,
                      "max_batch_tokens": self.engine.settings.max_batch_tokens}
        return Opened(fp)

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        out = []
        for mode in self.config.kernels:
            for run in range(self.settings.runs + 1):
                plan = self._run_plan(run)
                out.append(Planned(f"{mode}/cb/{'ref' if run == 0 else f'run{run}'}", self._label(plan), mode, plan))
        return out

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        plan: RunPlan = planned.plan
        with engine_kernels(planned.kernels, self.engine):
            trace = self.engine.run(self.target, plan.target_step, plan.schedule, self.fillers,
                                    self.settings.max_fillers)
        emit(self._stream(planned, plan, trace))
        return ConditionRecord(
            condition_id=planned.condition_id, kernels=planned.kernels, load="continuous",
            batch_size=max(trace.batch_requests, default=1), positions=[trace.position or 0],
            fillers="none" if plan.run == 0 else "poisson", label=planned.label,
            extra={"target_step": plan.target_step, "filler_arrivals": len(plan.schedule)})

    def summarize(self, streams: list[dict]) -> Summary:
        doc = summarize_modes(streams, self.loaded.tokenizer)
        alone = _alone(streams)
        load = {**self._load_summary(), "alone": alone}
        if alone:  # said beside the verdict: these runs cannot show a difference
            runs = sum(not s["is_reference"] for s in streams)
            load["notes"] = [*load["notes"], f"{len(alone)} of {runs} run(s) had the target alone in the engine at "
                             "every step (no other request shared one): they repeat the reference's computation "
                             "and compare nothing (raise --rate or --filler-requests)"]
        extra = {"load": load}
        if "batch-invariant" in self.config.kernels and not self.engine.invariant_attention_ok:
            # the mode's label must say what the engine kept (probes/core/kernel_coverage.py; the gate fails it)
            extra["kernel_coverage"] = {"coverage": PARTLY, "uncovered": [
                f"attention: the engine's {self.engine.attn_implementation} path (paged / packed)"]}
        return Summary(doc["modes"], doc["verdict"], extra=extra)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def _stream(self, planned: Planned, plan: RunPlan, trace) -> StreamRecord:
        tok = self.loaded.tokenizer
        tokens = [s["token"] for s in trace.steps]
        self.run_ids += 1
        return StreamRecord(
            run_id=self.run_ids - 1, condition_id=planned.condition_id, kernels=planned.kernels,
            position=trace.position or 0, is_reference=plan.run == 0, prompt_tokens=len(self.target),
            finish=finish_reason(tokens, eos_ids(self.loaded.model, tok)), text=tok.decode(tokens),
            steps=[step_record(s, token_piece(tok, s["token"])) for s in trace.steps],
            extra={"load": "continuous", "engine_steps": trace.engine_steps,
                   "batch_requests": trace.batch_requests, "batch_tokens": trace.batch_tokens})

    def _run_plan(self, run: int) -> RunPlan:
        """Run 0 is the reference (alone); run r >= 1 draws its arrival pattern from (seed, r)."""
        if run == 0:
            return RunPlan(0, 0, [])
        s = self.settings
        rng = arrivals.run_rng(self.config.seed, run)
        # Filler lengths uniform in [1, 2 x the target's]: they finish before, with and after it.
        schedule = arrivals.per_step(rng, s.fillers_per_step, s.fillers_per_run, len(self.fillers),
                                     2 * self.config.max_new_tokens)
        target_step = rng.randint(0, math.ceil(s.max_fillers / s.fillers_per_step))  # filling up, or full
        return RunPlan(run, target_step, schedule)

    def _label(self, plan: RunPlan) -> str:
        s = self.settings
        if plan.run == 0:
            return "alone (reference)"
        return (f"run {plan.run}: {s.fillers_per_step:g} fillers/step, <= {s.max_fillers} at once, "
                f"target at step {plan.target_step}")

    def _engine_settings(self) -> EngineSettings:
        longest = max(map(len, self.fillers + [self.target])) + 2 * self.config.max_new_tokens
        return EngineSettings(self.config.max_new_tokens, tuple(eos_ids(self.loaded.model, self.loaded.tokenizer)),
                              max_requests=self.settings.max_fillers + 1, max_len=longest,
                              max_batch_tokens=max(512, 2 * len(self.target)),
                              plain="batch-invariant" in self.config.kernels)

    def _load_summary(self) -> dict:
        s, impl = self.settings, self.engine.attn_implementation
        notes = []
        if "batch-invariant" in self.config.kernels:
            notes.append(INVARIANT_NOTE if self.engine.invariant_attention_ok else ATTENTION_NOTE.format(impl=impl))
        return {"mode": "continuous", "compare_level": "logits", "runs": s.runs, "rate": s.fillers_per_step,
                "rate_unit": "filler arrivals per engine step (Poisson)", "concurrency": s.max_fillers,
                "filler_requests": s.fillers_per_run, "attn_implementation": impl, "notes": notes}


@contextlib.contextmanager
def engine_kernels(mode: str, engine: ContinuousEngine):
    """The kernels mode inside the engine: nondet's batch-invariant ops for matmul, norm and softmax
    (aten overrides) and, where the engine's path allows it, cb_attention for attention."""
    if mode == "default":
        yield
        return
    from nondet.kernels import OP_CLASSES, batch_invariant
    from nondet.probes.continuous.cb_attention import invariant_attention

    attention = invariant_attention(engine.model) if engine.invariant_attention_ok else contextlib.nullcontext()
    with batch_invariant(ops=[op for op in OP_CLASSES if op != "attention"]), attention:
        yield


def _alone(streams: list[dict]) -> list[str]:
    """Condition ids of runs whose target never shared an engine step with another request: they repeat
    the reference's computation, so they compare nothing (the gate fails them: gate/vacuous.py)."""
    return [s["condition_id"] for s in streams
            if not s["is_reference"] and max(s.get("batch_requests") or [1]) <= 1]
