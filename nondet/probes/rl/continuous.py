"""The RL sampler side under continuous batching: `nondet rl --load continuous`.

All prompts go into transformers' continuous-batching engine at once (the probe's stepped
engine, probes/continuous/engine.py): FIFO scheduling, chunked prefill mixed with other
requests' decode tokens in one ragged batch, paged KV cache, as RL frameworks' HF samplers
run. Each request samples for itself: a forward hook on the model takes the logits the engine
keeps (one row per request that predicts a token this step, in the engine's order), computes
the processed distribution (temperature, top-k, top-p: processed.py) over the step's rows,
draws each request's token with its own generator (seed + prompt index), records its logprob
bits, and hands the engine one-hot logits so its argmax takes the drawn token. One condition
per kernels mode, `<kernels>/sampler/continuous`; under the mode, engine_kernels applies the
batch-invariant ops inside the engine (attention per request where its path allows).
"""

from nondet.probes.core.pieces import token_piece
from nondet.probes.core.replay import eos_ids, finish_reason
from nondet.probes.core.source import Emit, Planned
from nondet.probes.rl.processed import Processing, processed_logprobs
from nondet.probes.rl.sampler import RLSamplerSource
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord

REQUEST_PREFIX = "rl-"  # request ids rl-<prompt index>


def condition_id(kernels: str) -> str:
    return f"{kernels}/sampler/continuous"


class EngineSampler:
    """Forward hook: samples each request's token from the kept logits rows and forces it."""

    def __init__(self, seeds: list[int], processing: Processing, keep_distributions: bool) -> None:
        import torch

        self.processing, self.keep = processing, keep_distributions
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.steps: list[list[dict]] = [[] for _ in seeds]
        self.distributions: list[list] = [[] for _ in seeds]
        self.rows: list[int] = []  # prompt index of each logits row of the coming forward

    def __call__(self, module, args, out):
        import torch

        from nondet.errors import NonFiniteLogitsError

        logits = out.logits  # [1, rows, vocab]: the rows the engine keeps (logits_indices)
        assert logits.shape[1] == len(self.rows), "one kept logits row per request predicting a token"
        logprobs = processed_logprobs(logits[0].float(), self.processing)  # [rows, vocab] fp32
        held = logprobs.detach().cpu()
        forced = torch.full_like(logits, float("-inf"))
        for r, i in enumerate(self.rows):
            if bool(held[r].isnan().any()):  # NaN / +inf logits: torch.multinomial would raise an internal error
                raise NonFiniteLogitsError(len(self.steps[i]), r)
            token = int(torch.multinomial(held[r].exp(), 1, generator=self.generators[i]))
            self.steps[i].append({"token": token, "logprob": float(held[r, token]).hex()})
            if self.keep:
                self.distributions[i].append(held[r])
            forced[0, r, token] = 0.0
        out.logits = forced
        return out


class RLContinuousSamplerSource(RLSamplerSource):
    """The sampler side in transformers' continuous-batching engine: every prompt at once.
    Construction, open (prompt ids, fingerprint), summarize and close are the batched sampler's."""

    kind = "rl-continuous"

    def plan(self) -> list[Planned]:
        return [Planned(condition_id(mode), "sampler: continuous batching, every prompt at once", mode, mode)
                for mode in self.config.kernels]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        mode = planned.plan
        sampler = self._sample(mode)
        for i, steps in enumerate(sampler.steps):
            emit(self._stream(mode, i, steps))
            if self.config.exact_kl and steps:
                import torch

                self.distributions[(mode, i)] = torch.stack(sampler.distributions[i])
        return ConditionRecord(condition_id=planned.condition_id, kernels=mode, batch_size=len(self.prompt_ids),
                               positions=None, fillers="none", label=planned.label, load=self.kind,
                               extra={"side": "sampler"})

    def _sample(self, mode: str) -> EngineSampler:
        from nondet.probes.continuous.engine import ContinuousEngine
        from nondet.probes.continuous.source import engine_kernels

        c = self.config
        sampler = EngineSampler([c.seed + i for i in range(len(self.prompt_ids))],
                                Processing(c.temperature, c.top_k, c.top_p), c.exact_kl)
        engine = ContinuousEngine(self.loaded.model, self._settings())
        try:
            with engine_kernels(mode, engine):
                run_all(engine, self.prompt_ids, c.max_new_tokens, sampler)
        finally:
            engine.close()
        return sampler

    def _settings(self):
        from nondet.probes.continuous.engine import EngineSettings

        c, longest = self.config, max(map(len, self.prompt_ids))
        return EngineSettings(c.max_new_tokens, tuple(eos_ids(self.loaded.model, self.loaded.tokenizer)),
                              max_requests=len(self.prompt_ids), max_len=longest + c.max_new_tokens + 1,
                              max_batch_tokens=max(512, 2 * longest), plain="batch-invariant" in c.kernels)

    def _stream(self, mode: str, i: int, steps: list[dict]) -> StreamRecord:
        tok = self.loaded.tokenizer
        tokens = [s["token"] for s in steps]
        return StreamRecord(
            run_id=next(self.run_ids), condition_id=condition_id(mode), kernels=mode, position=i,
            is_reference=True, prompt_id=i, prompt_tokens=len(self.prompt_ids[i]),
            finish=finish_reason(tokens, eos_ids(self.loaded.model, tok)), text=tok.decode(tokens),
            steps=[StepRecord(token=s["token"], piece=token_piece(tok, s["token"]), logprob=s["logprob"])
                   for s in steps],
            extra={"side": "sampler", "prompt_ids": self.prompt_ids[i], "load": "continuous"})


def run_all(engine, prompts: list[list[int]], max_new_tokens: int, sampler: EngineSampler) -> None:
    """Every prompt into the engine at once; step it until all finish, the hook sampling."""
    processor = engine.processor
    hook = engine.model.register_forward_hook(sampler)
    try:
        for i, ids in enumerate(prompts):
            engine.manager.add_request(ids, request_id=f"{REQUEST_PREFIX}{i}", max_new_tokens=max_new_tokens)
        finished: set[str] = set()
        limit = 4 * len(prompts) * (max(map(len, prompts)) + max_new_tokens) + 64
        for _ in range(limit):
            if len(finished) == len(prompts):
                return
            if processor.prepare_next_batch():
                finished |= _step(processor, engine.model, sampler)
        raise AssertionError("the continuous-batching engine did not finish every request")
    finally:
        hook.remove()
        processor.reset()
        queue = engine.manager.output_router.output_queue
        while not queue.empty():
            queue.get_nowait()


def _step(processor, model, sampler: EngineSampler) -> set[str]:
    """One engine step; returns the ids of the requests that finished in it."""
    batch = processor.inputs_and_outputs.requests_in_batch
    sampler.rows = [int(f.state.request_id[len(REQUEST_PREFIX):]) for f in batch if f.has_new_token]
    processor._generation_step(model)
    processor.update_batch()
    return {f.state.request_id for f in batch if f.state.status.name == "FINISHED"}
