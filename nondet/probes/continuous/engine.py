"""Step transformers' continuous-batching engine from this thread, fillers added on a schedule.

transformers' ContinuousBatchingManager (behind `generate_batch` / `init_continuous_batching`)
normally loops in a background thread and requests join whenever they arrive in wall-clock
time, so no two runs batch alike. Here the manager's own batch processor is stepped from the
calling thread and fillers are added between steps by a seeded schedule: the batch around
the target at every step is a function of the seed, and replaying a schedule gives the same
bits. Everything else is the engine's own: FIFO scheduler, paged KV cache, ragged (varlen)
batches that mix prefill chunks with decode tokens, its attention path.

The engine's logits are captured with a forward hook on the model; the target's row is the
position of the target among the requests that predict a token this step (the engine's
`logits_indices` order). The engine picks the token (greedy argmax); the hook only records.
Uses the engine's private stepping methods: written against transformers 5.17-5.24.
"""

import math
from collections import deque
from dataclasses import dataclass, field

from nondet.errors import ModelLoadError
from nondet.probes.core.arrivals import Arrival
from nondet.probes.core.recorder import step_record

TARGET_ID = "target"


@dataclass(frozen=True)
class EngineSettings:
    max_new_tokens: int  # the target's (and the engine's default) generation length
    eos: tuple[int, ...]  # end-of-sequence ids; empty = none
    max_requests: int  # target + fillers in the engine at once: sizes the paged KV cache
    max_len: int  # the longest request (prompt + new tokens) the cache must hold
    page_size: int = 64  # tokens per KV page (the engine's default, 256, wastes memory here)
    max_batch_tokens: int = 512  # query tokens per step: prefill chunks + one per decoding request
    plain: bool = False  # no CUDA graphs, no automatic switch to flash attention: what the
    #                      per-request invariant attention (cb_attention) needs


@dataclass
class TargetTrace:
    steps: list[dict] = field(default_factory=list)  # recorder-format step records
    batch_requests: list[int] = field(default_factory=list)  # requests in the batch at each target step
    batch_tokens: list[int] = field(default_factory=list)  # query tokens in the batch at each target step
    position: int | None = None  # target's index in the batch at its first step
    engine_steps: int = 0  # engine steps until the target finished


class ContinuousEngine:
    """One continuous-batching manager for a loaded model, reused run after run."""

    def __init__(self, model, settings: EngineSettings):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.model, self.settings = model, settings
        gen = GenerationConfig(do_sample=False, max_new_tokens=settings.max_new_tokens,
                               eos_token_id=list(settings.eos) or -1)
        pages = math.ceil(settings.max_len / settings.page_size) + 1
        plain = {"use_cuda_graph": False, "auto_switch_to_flash": False} if settings.plain else {}
        cb = _cb_config(ContinuousBatchingConfig, page_size=settings.page_size,
                        num_blocks=settings.max_requests * pages + 2, max_batch_tokens=settings.max_batch_tokens, **plain)
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.processor = self._processor()
        self.attn_implementation = model.config._attn_implementation
        self._logits: list = []

    def _processor(self):
        try:
            processor = self.manager._create_batch_processor()
            self.manager.batch_processor = processor
            for name in ("prepare_next_batch", "update_batch", "_generation_step", "reset"):
                getattr(processor, name)
            processor.inputs_and_outputs.requests_in_batch
        except AttributeError as exc:
            raise ModelLoadError(f"this transformers version's continuous-batching engine has no {exc.name!r}; "
                                 "--load continuous needs transformers 5.17-5.24") from None
        return processor

    @property
    def invariant_attention_ok(self) -> bool:
        """Can cb_attention replace the engine's attention? Needs a masked path (sdpa or eager,
        whose cache.update gathers each request's keys; transformers 5.17-5.18 name the engine's sdpa
        "paged|sdpa") and unpadded, ungraphed batches."""
        return (self.attn_implementation in ("sdpa", "paged|sdpa", "paged|eager")
                and not self.processor.model_runner.pad_inputs)

    def run(self, target: list[int], target_at: int, schedule: list[Arrival], fillers: list[list[int]],
            concurrency: int) -> TargetTrace:
        """Add fillers by `schedule` (at most `concurrency` live), the target at step `target_at`;
        step until the target finishes; return what the target saw."""
        hook = self.model.register_forward_hook(lambda _m, _a, out: self._logits.append(out.logits))
        try:
            return self._steps(target, target_at, deque(schedule), fillers, concurrency)
        finally:
            hook.remove()
            self._logits.clear()
            self.processor.reset()
            _drain(self.manager.output_router.output_queue)

    def _steps(self, target, target_at, pending: deque, fillers, concurrency) -> TargetTrace:
        trace, state, step = TargetTrace(), None, 0
        limit = 4 * (self.settings.max_len + len(pending) + target_at) + 64
        while state is None or state.status.name != "FINISHED":
            assert step < limit, "the continuous-batching engine did not finish the target"
            self._admit(pending, step, fillers, concurrency)
            if step == target_at:
                self.manager.add_request(target, request_id=TARGET_ID, max_new_tokens=self.settings.max_new_tokens)
            state = self._step(trace) or state
            step += 1
        trace.engine_steps = step
        return trace

    def _admit(self, pending: deque, step: int, fillers, concurrency: int) -> None:
        scheduler = self.processor.scheduler
        live = len(scheduler.active_requests) + len(scheduler.waiting_requests) + self.manager.input_queue.qsize()
        live -= TARGET_ID in scheduler.active_requests or TARGET_ID in scheduler.waiting_requests
        while pending and pending[0].at <= step and live < concurrency:
            arrival = pending.popleft()
            self.manager.add_request(fillers[arrival.filler], request_id=f"filler-{len(pending)}",
                                     max_new_tokens=arrival.max_new_tokens)
            live += 1

    def _step(self, trace: TargetTrace):
        """One engine step; records the target's token if it got one. Returns the target's state if in the batch."""
        processor = self.processor
        if not processor.prepare_next_batch():
            return None
        batch = processor.inputs_and_outputs.requests_in_batch
        row, state = _target_row(batch)
        before = state.generated_len() if state is not None else 0
        self._logits.clear()
        processor._generation_step(self.model)
        processor.update_batch()
        if state is not None and row is not None and state.generated_len() > before:
            logits = self._logits[-1][0, row:row + 1].float()  # [1, vocab] fp32, as generate scores it
            # non-finite: named at the target's step and its row among this step's logits
            trace.steps.append(step_record(logits, int(state.generated_tokens[-1]), step=len(trace.steps), row=row,
                                           model_dtype=self.model.dtype))
            trace.batch_requests.append(len(batch))
            trace.batch_tokens.append(int(processor.inputs_and_outputs.total_seqlen_q))
            trace.position = trace.position if trace.position is not None else _index(batch, TARGET_ID)
        return state

    def close(self) -> None:
        """Give the model back as it came: the engine may have switched its attention implementation."""
        original = getattr(self.manager, "_original_attn_impl", None)
        if original is not None:
            self.model.set_attn_implementation(original)
            self.manager._original_attn_impl = None
        self.manager.batch_processor = None


def _cb_config(cls, **settings):
    """ContinuousBatchingConfig across 5.17-5.24: `page_size` was `block_size` before."""
    import inspect

    accepted = inspect.signature(cls).parameters
    if "page_size" not in accepted:
        settings["block_size"] = settings.pop("page_size")
    return cls(**{k: v for k, v in settings.items() if k in accepted})


def _target_row(batch) -> tuple[int | None, object]:
    """(row of the target among this step's logits, target state), or (None, None) if absent."""
    row = 0
    for future in batch:
        if future.state.request_id == TARGET_ID:
            return (row if future.has_new_token else None), future.state
        row += bool(future.has_new_token)
    return None, None


def _index(batch, request_id: str) -> int:
    return next(i for i, f in enumerate(batch) if f.state.request_id == request_id)


def _drain(q) -> None:
    while not q.empty():
        q.get_nowait()
