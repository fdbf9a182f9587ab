"""Lockstep of an rl run's two sides: the sampler's decode vs the trainer's teacher-forced prefill.

The same sampled tokens reach the model two ways. The sampler computes position P + s - 1
(whose logits choose token s) in decode step s: one query row per request against the KV
cache, its batch left-padded with the other prompts of its sampler batch. The trainer
computes every position in ONE forward over prompt + completion, the sequence one row of a
padded micro-batch (or one segment of a packed row). capture.py's hooks record every point
of both; the trainer's one forward is cut back into logical steps (step 0: the prompt's
positions, step s >= 1: position P + s - 1), so step s of both sides is compared point by
point with bisect/lockstep.py's sinks (RecordSink, CompareSink), exactly as a probe's bisect.

Both sides are teacher-forced to the tokens the sampler recorded: the sampler replay forces
every row of its batch to its own recorded completion, so ablations that change the numerics
keep the same histories. Logprobs are taken over the processed distribution (temperature,
top-k, top-p: processed.py) on each side, as `nondet rl` took them.
"""

from dataclasses import dataclass

from nondet.probes.bisect.capture import Tap
from nondet.probes.bisect.lockstep import CompareSink, KernelScope, Lockstep, RecordSink
from nondet.probes.core.replay import DecodeSettings, generate
from nondet.probes.rl.processed import Processing, processed_logprobs
from nondet.probes.rl.sampler import left_padded
from nondet.probes.rl.trainer import Sequence, layout, pad_token, target_index, training


@dataclass(frozen=True)
class SamplerBatchPlan:
    prompts: list[list[int]]  # the sampler batch's prompt ids, one per row (left-padded when replayed)
    completions: list[list[int]]  # each row's recorded completion (forced)
    row: int  # the target's row


@dataclass(frozen=True)
class TrainerBatchPlan:
    chunk: list[Sequence]  # the micro-batch the target was teacher-forced in
    index: int  # the target's index in the chunk
    padding: str  # right | left | packed


def run_rl_lockstep(model, tokenizer, sampler: SamplerBatchPlan, trainer: TrainerBatchPlan, processing: Processing,
                    kernels: KernelScope) -> Lockstep:
    """Sampler replay (reference) then the trainer's forward, compared step by step."""
    pad = pad_token(tokenizer)
    record = RecordSink()
    trim = _TrimPrompt(record, len(sampler.prompts[sampler.row]))
    with kernels():
        reference = _sampler_replay(model, tokenizer, sampler, processing, trim)
    sink = CompareSink(record, lambda step: False)  # teacher-forced on both sides: no token can flip
    with kernels():
        own = _trainer_replay(model, pad, trainer, processing, sink)
    sink.flush()
    return Lockstep(reference, own, sink.rows, sink.amplification, sink.first, sink.tracker.result(),
                    sink.tracker.transients)


class _TrimPrompt:
    """The sampler's prefill row is left-padded to its batch's widest prompt: keep the last P positions."""

    def __init__(self, sink: RecordSink, prompt_len: int):
        self.sink, self.prompt_len = sink, prompt_len

    def __call__(self, step: int, point, row) -> None:
        if step == 0 and row.dim() >= 1 and row.shape[0] > self.prompt_len:
            row = row[row.shape[0] - self.prompt_len:]
        self.sink(step, point, row)


class _ForceRecorded:
    """Logits processor: the target row's processed logprob of its token (over the whole batch's
    scores, as the sampler computed it), then every row forced to its recorded token."""

    def __init__(self, completions: list[list[int]], row: int, processing: Processing):
        self.completions, self.row, self.processing = completions, row, processing
        self.step = 0
        self.records: list[dict] = []

    def __call__(self, input_ids, scores):
        import torch

        tokens = [c[self.step] if self.step < len(c) else (c[-1] if c else 0) for c in self.completions]
        if self.step < len(self.completions[self.row]):
            logprobs = processed_logprobs(scores, self.processing)
            token = tokens[self.row]
            self.records.append({"token": token, "logprob": float(logprobs[self.row, token]).hex()})
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), tokens] = 0.0
        self.step += 1
        return forced


def _sampler_replay(model, tokenizer, plan: SamplerBatchPlan, processing: Processing, sink) -> list[dict]:
    """The sampler's batched decode (the probe's generate call), target row captured."""
    batch = left_padded(plan.prompts, pad_token(tokenizer))
    steps = len(plan.completions[plan.row])
    force = _ForceRecorded(plan.completions, plan.row, processing)
    with Tap(model, plan.row, len(plan.prompts), sink):
        generate(model, tokenizer, batch, DecodeSettings(steps, processing.temperature, 0), None, [force])
    return force.records


def _trainer_replay(model, pad: int, plan: TrainerBatchPlan, processing: Processing, sink: CompareSink) -> list[dict]:
    """The trainer's one forward over the micro-batch; the target's positions fed to the sink step by step."""
    import torch

    ids, mask, positions, places = layout([s.prompt + s.completion for s in plan.chunk], plan.padding, pad)
    b, offset = places[plan.index]
    collect = _Collect()
    device = model.device
    with training(model), torch.enable_grad(), Tap(model, b, len(ids), collect):
        logits = model(input_ids=torch.tensor(ids, device=device), position_ids=torch.tensor(positions, device=device),
                       attention_mask=None if mask is None else torch.tensor(mask, device=device),
                       use_cache=False).logits
    rows, cols, tokens = target_index(plan.chunk, places)
    with torch.no_grad():
        lp = processed_logprobs(logits[rows, cols].detach(), processing)
    seq = plan.chunk[plan.index]
    first = sum(len(s.completion) for s in plan.chunk[:plan.index])
    records = [{"token": t, "logprob": float(lp[first + j, t]).hex()} for j, t in enumerate(seq.completion)]
    _feed(collect.points, sink, offset, len(seq.prompt), len(ids[b]), len(seq.completion))
    return records


class _Collect:
    def __init__(self):
        self.points: list = []

    def __call__(self, step: int, point, row) -> None:
        self.points.append((point, row.detach().clone()))


def _feed(points: list, sink: CompareSink, offset: int, prompt_len: int, width: int, steps: int) -> None:
    """Step s's positions of every point (execution order) to the sink: step 0 = the prompt, s = P + s - 1."""
    for step in range(steps):
        lo, hi = (0, prompt_len) if step == 0 else (prompt_len + step - 1, prompt_len + step)
        for point, tensor in points:
            if tensor.dim() >= 1 and tensor.shape[0] == width:  # a per-position tensor of the row
                sink(step, point, tensor[offset + lo: offset + hi])
