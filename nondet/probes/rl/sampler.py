"""The RL sampler side: sampled completions of a prompt set, batched, left-padded.

Per kernels mode the prompts run in batches of `sampler_batch` through the probe's one
generate call (probes/core/replay.py). A logits processor samples every request from the
processed distribution (temperature, top-k, top-p) with its own generator, seeded
seed + prompt index, so a prompt draws the same way in any batch and mode; it records each
sampled token's logprob over that distribution, bits kept (float.hex), as vLLM's processed
logprobs are. One StreamRecord per prompt; its prompt_id indexes the prompt set.

With `exact_kl` the source also keeps, in memory, each sampled token's whole processed
log-distribution ([tokens, vocab] fp32 on the CPU, 4 bytes x vocab per token): the trainer
side computes the exact KL(sampler || trainer) against it and only the
per-token KL reaches the run directory (probes/rl/kl.py).
"""

from dataclasses import dataclass

from nondet.probes.core.batch import Batch
from nondet.probes.core.chat import prompt_token_ids
from nondet.probes.core.kernels_mode import kernels_mode
from nondet.probes.core.numerics import fingerprint
from nondet.probes.core.pieces import token_piece
from nondet.probes.core.replay import DecodeSettings, eos_ids, finish_reason, generate, truncate_at_eos
from nondet.probes.core.source import Emit, Opened, Planned
from nondet.probes.rl.processed import Processing, processed_logprobs
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord, Summary


@dataclass(frozen=True)
class SamplerBatch:
    kernels: str
    index: int  # which batch of the prompt set
    prompt_ids: tuple[int, ...]  # indices into the prompt set, one per row


class SampleRecorder:
    """A logits processor: each row samples its own token; the step's logprob is recorded."""

    def __init__(self, seeds: list[int], processing: Processing, keep_distributions: bool = False,
                 model_dtype=None) -> None:
        import torch

        self.processing = processing
        self.model_dtype = model_dtype  # named in a NonFiniteLogitsError's message when the caller knows it
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.steps: dict[int, list[dict]] = {r: [] for r in range(len(seeds))}
        self.keep = keep_distributions  # the exact KL needs every step's whole processed distribution
        self.distributions: dict[int, list] = {r: [] for r in range(len(seeds))}  # row -> [vocab] fp32 (CPU)

    def keep_first(self, steps: int) -> None:
        """Forget the steps past the first `steps` (generate ran and undid them: core/deferred_stop.py)."""
        for row in self.steps:
            self.steps[row] = self.steps[row][:steps]
            self.distributions[row] = self.distributions[row][:steps]

    def __call__(self, input_ids, scores):  # scores: [rows, vocab] fp32 logits of this step
        import torch

        logprobs = processed_logprobs(scores, self.processing)
        chosen = [self._sample(logprobs[r].exp().cpu(), r, g) for r, g in enumerate(self.generators)]
        held = logprobs.detach().float().cpu() if self.keep else None  # one device->host copy a step
        for row, token in enumerate(chosen):
            self.steps[row].append({"token": token, "logprob": float(logprobs[row, token]).hex()})
            if held is not None:
                self.distributions[row].append(held[row])
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), chosen] = 0.0  # generate's argmax takes the sampled token
        return forced

    def _sample(self, probs, row: int, generator) -> int:
        """One row's token from its probabilities (on the host). A NaN or +inf logit leaves NaN probabilities,
        which torch.multinomial would reject with an internal error: refused here, on the host copy sampling
        makes anyway (no extra device sync)."""
        import torch

        from nondet.errors import NonFiniteLogitsError

        if bool(probs.isnan().any()):
            raise NonFiniteLogitsError(len(self.steps[row]), row, self.model_dtype)
        return int(torch.multinomial(probs, 1, generator=generator))


class RLSamplerSource:
    kind = "rl-sampler"

    def __init__(self, config, loaded, run_ids) -> None:
        self.config = config  # RLConfig
        self.loaded = loaded  # LoadedModel, shared with the trainer side
        self.run_ids = run_ids  # itertools.count shared by both sides: run ids unique in the run directory
        self.prompt_ids: list[list[int]] = []
        self.distributions: dict[tuple[str, int], object] = {}  # (kernels, prompt_id) -> [tokens, vocab] fp32

    def open(self) -> Opened:
        tok = self.loaded.tokenizer
        self.prompt_ids = [prompt_token_ids(tok, p) for p in self.config.prompts]  # a Chat: its template's ids
        return Opened(fingerprint(self.loaded.description, ",".join(self.config.kernels)))

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        size, n = self.config.sampler_batch, len(self.prompt_ids)
        batches = [tuple(range(s, min(s + size, n))) for s in range(0, n, size)]
        return [Planned(f"{mode}/sampler/bs{size}/b{i}", f"sampler bs={size} batch {i}", mode,
                        SamplerBatch(mode, i, rows)) for mode in self.config.kernels for i, rows in enumerate(batches)]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        plan: SamplerBatch = planned.plan
        steps = self._sample(plan)
        for row, prompt_id in enumerate(plan.prompt_ids):
            emit(self._stream(plan, row, prompt_id, steps[row]))
        return ConditionRecord(condition_id=planned.condition_id, kernels=plan.kernels,
                               batch_size=len(plan.prompt_ids), positions=list(range(len(plan.prompt_ids))),
                               fillers="none", label=planned.label, load=self.kind, extra={"side": "sampler"})

    def summarize(self, streams: list[dict]) -> Summary:
        return Summary(modes={})  # nondet rl's summary pairs both sides: nondet.rl.summary

    def close(self) -> None:
        pass

    def _sample(self, plan: SamplerBatch) -> dict[int, list[dict]]:
        c, model, tok = self.config, self.loaded.model, self.loaded.tokenizer
        batch = left_padded([self.prompt_ids[i] for i in plan.prompt_ids], pad_id(tok))
        recorder = SampleRecorder([c.seed + i for i in plan.prompt_ids], Processing(c.temperature, c.top_k, c.top_p),
                                  keep_distributions=c.exact_kl, model_dtype=getattr(model, "dtype", None))
        with kernels_mode(plan.kernels, model):
            generate(model, tok, batch, DecodeSettings(c.max_new_tokens, c.temperature, c.seed), recorder)
        eos = eos_ids(model, tok)
        kept = {row: truncate_at_eos(steps, eos) for row, steps in recorder.steps.items()}
        if c.exact_kl:
            self._keep_distributions(plan, recorder, kept)
        return kept

    def _keep_distributions(self, plan: SamplerBatch, recorder: SampleRecorder, kept: dict) -> None:
        import torch

        for row, prompt_id in enumerate(plan.prompt_ids):
            rows = recorder.distributions[row][:len(kept[row])]
            if rows:
                self.distributions[(plan.kernels, prompt_id)] = torch.stack(rows)

    def _stream(self, plan: SamplerBatch, row: int, prompt_id: int, steps: list[dict]) -> StreamRecord:
        tok = self.loaded.tokenizer
        tokens = [s["token"] for s in steps]
        return StreamRecord(
            run_id=next(self.run_ids), condition_id=f"{plan.kernels}/sampler/bs{self.config.sampler_batch}/b{plan.index}",
            kernels=plan.kernels, position=row, is_reference=True, prompt_id=prompt_id,
            prompt_tokens=len(self.prompt_ids[prompt_id]), finish=finish_reason(tokens, eos_ids(self.loaded.model, tok)),
            text=tok.decode(tokens),
            steps=[StepRecord(token=s["token"], piece=token_piece(tok, s["token"]), logprob=s["logprob"])
                   for s in steps],
            extra={"side": "sampler", "prompt_ids": self.prompt_ids[prompt_id]})


def left_padded(rows: list[list[int]], pad: int) -> Batch:
    """Prompts of unequal length, left-padded as generate needs; every row is a target."""
    width = max(map(len, rows))
    return Batch([[pad] * (width - len(r)) + r for r in rows], [[0] * (width - len(r)) + [1] * len(r) for r in rows],
                 tuple(range(len(rows))))


def pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad or 0
