"""The static source: one batched `model.generate` call per condition.

Conditions come from conditions.py, per kernels mode. With several prompts (placement
`rows`, the default, or `padded`): every prompt alone (its reference), then per batch size
the prompts sharing batches, every row a target (conditions.plan_rows). Otherwise, per
target prompt (conditions.plan_conditions): the prompt alone, then batches of the
configured sizes with the target in the configured rows and same-length fillers (or copies)
around it, and ragged batches when asked. Each target row of a condition becomes one
StreamRecord whose prompt_id is that row's prompt: it is compared with that prompt's reference.
"""

import time

from nondet.errors import UsageError
from nondet.kernels import prefetch
from nondet.probes.core import conditions as cond
from nondet.probes.core.batch import batch_shape, tokenize_inputs
from nondet.probes.core.chat import model_texts
from nondet.probes.core.compiled import census_store
from nondet.probes.core.numerics import fingerprint
from nondet.probes.core.pieces import token_piece
from nondet.probes.core.replay import DecodeSettings, eos_ids, finish_reason, replay_condition
from nondet.probes.core.settled import STOPPED, stopped
from nondet.probes.core.source import Emit, Opened, Planned, step_record
from nondet.probes.core.summarize import as_summary, sampling_section, summarize_modes
from nondet.probes.models.loading import load_model
from nondet.probes.static.compile_ahead import CompileAhead, decodes_ahead
from nondet.probes.static.decoder import ConditionDecoder
from nondet.probes.static.fail_fast import FailFast
from nondet.rundir.records import ConditionRecord, StreamRecord


class StaticSource:
    kind = "static"

    def __init__(self, config, loaded=None) -> None:
        self.config = config  # ProbeConfig
        self.loaded = loaded  # a LoadedModel already in memory (the in-memory probe), else loaded in open()
        self.inputs: list[tuple[list[int], list[list[int]]]] = []  # per prompt: (target ids, filler ids)
        self.placement = cond.resolve_placement(config.placement, len(config.targets), config.runs)
        self.run_ids = 0
        self.started = time.perf_counter()  # --budget counts from open() (model load included)
        self.budget_note: dict | None = None  # summary.json "budget" (--budget only)
        self.decoder = None  # eager or compiled decoding of a condition (decoder.py), set in open()
        self.workers = None  # --workers: helper processes decoding conditions beside this one (workers.py)
        self.ahead = None  # compile_ahead.CompileAhead: second processes compiling or decoding a kernels mode
        self.plan_index: dict[str, int] = {}  # condition id -> its place in the plan (what helpers are sent)
        # --fail-fast: the references decoded so far and each batch's stop (fail_fast.py); None = decode to the end
        self.fail_fast = FailFast(config.fail_fast) if config.fail_fast else None

    def open(self) -> Opened:
        self.started = time.perf_counter()
        in_memory = self.loaded is not None  # a model handed over (probe_model), not loaded from config.model
        c = self.config
        if "batch-invariant" in c.kernels:
            prefetch.start(c.model.device)  # Triton's key and the GPU's libraries beside the load, not in it
        if c.compile_backend or decodes_ahead(c):  # later kernels modes compiled or decoded meanwhile
            self.ahead = CompileAhead()
            if not c.compile_backend and not in_memory:  # a decoding second process loads the model beside this one
                self.ahead.start(c, None)
        self.loaded = self.loaded or load_model(self.config.model)
        self.inputs = [tokenize_inputs(self.loaded.tokenizer, p, self.config.fillers) for p in self.prompt_texts()]
        env = fingerprint(self.loaded.description, ",".join(self.config.kernels))
        settings = DecodeSettings(c.max_new_tokens, c.temperature, c.seed, c.kv_cache, cuda_graphs=c.cuda_graphs,
                                  allow_uncovered=c.allow_uncovered, sampler=c.sampler)
        store = census_store(self.loaded.model) if c.compile_backend else None
        self.decoder = ConditionDecoder(settings, c.compile_backend, self.loaded.model.device.type, store)
        if self.ahead is not None:  # where not decided before the load
            self.decoder.ahead = self.ahead
            self.ahead.start(c, self.loaded.model, in_memory)
        env["decode_path"] = self.decoder.label(c.kv_cache)
        if c.workers > 1:
            env["workers"] = c.workers
        return Opened(env)

    def prompt_texts(self) -> list[str]:
        """The targets as the model reads them: chat-formatted with --chat (probes/core/chat.py)."""
        return model_texts(self.loaded.tokenizer, self.config.targets, self.config.chat, self.config.system)

    def attach(self, writer) -> None:
        pass  # nothing to amend: the header is complete when the run starts

    def plan(self) -> list[Planned]:
        if self.config.budget is not None:
            conditions = self._fit_budget()
        else:
            conditions = plan_static(self.config, self.placement, self.lengths())
        if min(self.config.workers, len(conditions)) > 1:  # a helper with nothing to claim is not started
            self._start_workers(conditions)
        return [Planned(x.condition_id, x.label, x.kernels, x) for x in conditions]

    def _start_workers(self, conditions: list[cond.Condition]) -> None:
        import torch

        from nondet.probes.static.workers import ConditionWorkers

        self.plan_index = {c.condition_id: i for i, c in enumerate(conditions)}
        job = dict(spec=self.config.model, inputs=tuple(self.inputs), settings=self.decoder.settings,
                   threads=torch.get_num_threads())  # the parent's, set by numerics_scope
        self.workers = ConditionWorkers(job, conditions, min(self.config.workers, len(conditions)), self.fail_fast)

    def _fit_budget(self) -> list[cond.Condition]:
        """--budget: time short calls per kernels mode, then keep what fits (probes/static/budget.py);
        prompts are dropped from the end only when not even references + one batch size fit."""
        from nondet.probes.static import budget

        costs = {mode: self._step_cost(mode) for mode in self.config.kernels}
        left = budget.PLAN_SHARE * (self.config.budget - (time.perf_counter() - self.started))
        lengths = self.lengths()
        for n in range(len(lengths), 0, -1):
            fitted = budget.fit(plan_static(self.config, self.placement, lengths[:n]), costs,
                                self.config.max_new_tokens, left)
            if n == 1 or any(c.batch_size > 1 for c in fitted.conditions):
                break
        self.budget_note = budget.describe(self.config.budget, fitted, costs, list(range(n, len(lengths))))
        return fitted.conditions

    def _step_cost(self, mode: str):
        """Seconds per decode step at batch size 1 and the largest, and a call's fixed cost: calls of
        1 and TIMING_TOKENS steps on copies of the first prompt (probes/static/budget.py)."""
        from nondet.probes.static.budget import TIMING_TOKENS, from_timings

        target, fillers = self.inputs[0]
        sizes = (1, max(self.config.batch_sizes))

        def seconds(b: int, steps: int) -> float:
            timing = cond.Condition(f"{mode}/timing/bs{b}", mode, b, tuple(range(b)), "copies")
            settings = DecodeSettings(steps, self.config.temperature, self.config.seed, self.config.kv_cache,
                                      allow_uncovered=self.config.allow_uncovered, sampler=self.config.sampler)
            started = time.perf_counter()
            replay_condition(self.loaded.model, self.loaded.tokenizer, timing, target, fillers, settings)
            return time.perf_counter() - started

        seconds(1, 2)  # warm-up: first-call costs are not the sweep's
        return from_timings({b: seconds(b, 1) for b in sizes}, {b: seconds(b, TIMING_TOKENS) for b in sizes},
                            TIMING_TOKENS)

    def lengths(self) -> list[int]:
        """Each prompt's token count (rows groups prompts of equal length)."""
        return [len(target) for target, _ in self.inputs]

    def _runner(self, condition: cond.Condition):
        """The condition's decoding call `run(settings, warm)` and its batch shape (core/batch.batch_shape)."""
        target, fillers = self.inputs[condition.prompt_id]
        prompts = [ids for ids, _ in self.inputs]

        def run(settings: DecodeSettings, warm: bool = False) -> dict[int, list[dict]]:
            settle = self.fail_fast.settle(condition) if self.fail_fast is not None and not warm else None
            return replay_condition(self.loaded.model, self.loaded.tokenizer, condition, target, fillers,
                                    settings, prompts, warm, settle)

        return run, batch_shape(condition, target, fillers, prompts)

    def decoded_rows(self, condition: cond.Condition) -> dict[int, list[dict]]:
        """The condition decoded in this process: {target row: step dicts}."""
        run, shape = self._runner(condition)
        return self.decoder.decode(condition.kernels, run, shape)

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        condition: cond.Condition = planned.plan
        lengths = self.lengths()

        def decode_here() -> dict[int, list[dict]]:
            return self.decoded_rows(condition)

        if self.workers is not None:
            rows = self.workers.rows(self.plan_index[condition.condition_id], decode_here)
        elif self.ahead is not None:
            rows = self.ahead.rows(condition.kernels, condition.condition_id, decode_here)
        else:
            rows = decode_here()
        if self.fail_fast is not None:
            self.fail_fast.record(condition, rows)
        for row, steps in rows.items():
            prompt_id = condition.row_prompts[row] if condition.row_prompts else condition.prompt_id
            emit(self._stream(condition, row, steps, prompt_id, lengths[prompt_id]))
        return condition_record(condition)

    def summarize(self, streams: list[dict]):
        doc = summarize_modes(streams, self.loaded.tokenizer, self.config.targets)
        if self.budget_note:
            doc["budget"] = self.budget_note
        doc.update(sampling_section(self.config, self.config.sampler))
        if self.config.prefill:
            from nondet.probes.core.prefill_summary import prefill_section

            doc["prefill"] = prefill_section(streams, self.config.prefill)
        doc.update(self.decoder.summary())
        if self.ahead is not None:
            self._ahead_summary(doc)
        if self.workers is not None:
            doc["workers"] = self.workers.summary()
        return as_summary(doc)

    def _ahead_summary(self, doc: dict) -> None:
        """The second processes' outcomes (every condition ran: those still running are stopped): under the
        compiled or CUDA-graph path's decode_path as compiled_ahead, eager as decoded_ahead."""
        self.ahead.close()
        if not self.ahead.outcomes:
            return
        if "decode_path" in doc:
            doc["decode_path"]["compiled_ahead"] = self.ahead.as_summary()
        else:
            doc["decoded_ahead"] = self.ahead.as_summary()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        if self.ahead is not None:
            self.ahead.close()

    def _stream(self, condition: cond.Condition, row: int, steps: list[dict], prompt_id: int,
                prompt_tokens: int) -> StreamRecord:
        tok = self.loaded.tokenizer
        tokens = [s["token"] for s in steps]
        finish = STOPPED if stopped(steps) else finish_reason(tokens, eos_ids(self.loaded.model, tok))
        self.run_ids += 1
        return StreamRecord(
            run_id=self.run_ids - 1, condition_id=condition.condition_id, kernels=condition.kernels, position=row,
            is_reference=condition.is_reference, prompt_id=prompt_id, prompt_tokens=prompt_tokens,
            finish=finish, text=tok.decode(tokens),
            steps=[step_record(s, token_piece(tok, s["token"])) for s in steps],
            extra={"prefill": condition.prefill} if condition.prefill else {})


def plan_static(config, placement: str, lengths: list[int]) -> list[cond.Condition]:
    """The conditions of every kernels mode, in the order they run (placement resolved, not auto)."""
    from nondet.probes.core.prefill import as_forms

    forms = as_forms(config.prefill)
    plan = [x for mode in config.kernels
            for x in cond.with_trials(_batches(config, placement, lengths, mode), config.trials, len(config.fillers))
            + cond.plan_prefill(forms, lengths, mode)]
    if config.trials > 1 and not any(c.trial for c in plan):
        raise UsageError("--trials repeats each batch with other requests in its filler rows; no batch here has "
                         "one (every row a target, or a single filler text), so a repeat would be the same batch "
                         "again; drop --trials, or use --positions last / a larger --batch-sizes")
    return plan


def _batches(config, placement: str, lengths: list[int], mode: str) -> list[cond.Condition]:
    """One kernels mode's references and batches."""
    if placement in cond.ROW_PLACEMENTS:
        return cond.plan_rows(config.batch_sizes, lengths, placement, config.ragged, mode)
    several = len(lengths) > 1
    return [x for k in range(len(lengths))
            for x in cond.plan_conditions(config.batch_sizes, placement, config.runs, config.ragged, mode, k, several)]


def condition_record(condition: cond.Condition) -> ConditionRecord:
    return ConditionRecord(condition_id=condition.condition_id, kernels=condition.kernels,
                           batch_size=condition.batch_size, positions=list(condition.positions),
                           fillers=condition.fillers, label=condition.label, load=condition.load,
                           prompt_id=condition.prompt_id, extra=_condition_extra(condition))


def _condition_extra(condition: cond.Condition) -> dict:
    """What conditions.jsonl needs beyond the common fields to rebuild the batch (bisect)."""
    extra = {"row_prompts": list(condition.row_prompts)} if condition.row_prompts else {}
    if condition.trial:
        extra["trial"] = condition.trial
    if condition.prefill:
        extra.update(prefill=condition.prefill, splits=list(condition.splits))
    return extra
