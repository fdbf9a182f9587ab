"""The RL trainer side: teacher-forced forwards over prompt + completion, as trainers run them.

Per kernels mode and micro-batch size, one condition: the sequences the sampler produced (or
the rollouts) in micro-batches, padded right or left (position ids from the mask, as
trainers pass them) or packed (the micro-batch's sequences concatenated into one row, position
ids restarting per sequence, attention kept within each sequence: packed.py),
in train mode (`model.train()`, as a training step runs it) with nothing random left in it
(train_mode.py: drop rates 0, still-random modules in eval mode, else refused) and autograd on. The
logits that predicted each sampled token go through the sampler's processed distribution
(the same temperature and truncation, probes/rl/processed.py) and the sampled
token's logprob is kept as float.hex. Then loss = -mean(logprob) and `loss.backward()`
runs under the same kernels; the condition record says whether every gradient was finite.
Where the sampler kept its processed distributions (in-process), each token's exact
KL(sampler || trainer) is computed here and stored per stream (extra "kl", float.hex).

check_forward, which rl/run.py calls once the model loads (before the sampler), checks the forward on one
short sequence of the run's tokens: train mode is made random-free once per model (train_mode.py), and
`--padding packed` is refused where the model lets packed sequences see each other (packed.py).
"""

import itertools
from dataclasses import dataclass

from nondet.probes.core.kernels_mode import kernels_mode
from nondet.probes.core.source import Emit, Opened, Planned
from nondet.probes.rl.kl import exact_kl
from nondet.probes.rl.packed import packed, refuse_leaky_packing
from nondet.probes.rl.processed import Processing, processed_logprobs
from nondet.probes.rl.train_mode import PROBE_LEN, training
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord, Summary


@dataclass(frozen=True)
class Sequence:
    prompt_id: int  # the sampler stream's prompt_id (or the rollout's index)
    prompt: tuple[int, ...]
    completion: tuple[int, ...]


@dataclass(frozen=True)
class TrainerPlan:
    kernels: str
    micro_batch: int
    padding: str  # right | left | packed


class RLTrainerSource:
    kind = "rl-trainer"

    def __init__(self, config, loaded, run_ids, sequences: dict[str, list[Sequence]],
                 distributions: dict | None = None) -> None:
        self.config = config  # RLConfig
        self.loaded = loaded
        self.run_ids = run_ids
        self.sequences = sequences  # kernels mode -> the sequences to teacher-force under it
        self.distributions = distributions or {}  # (kernels, prompt_id) -> sampler's [tokens, vocab] log-dist

    def open(self) -> Opened:
        from nondet.probes.core.numerics import fingerprint

        return Opened(fingerprint(self.loaded.description, ",".join(self.config.kernels)))

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        c = self.config
        return [Planned(condition_id(mode, mb, c.padding), f"trainer mb={mb} {layout_label(c.padding)}", mode,
                        TrainerPlan(mode, mb, c.padding)) for mode in c.kernels for mb in c.micro_batches]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        plan: TrainerPlan = planned.plan
        seqs = self.sequences[plan.kernels]
        grads = []
        model = self.loaded.model
        with training(model), kernels_mode(plan.kernels, model):
            for start in range(0, len(seqs), plan.micro_batch):
                chunk = seqs[start:start + plan.micro_batch]
                logprobs, kls, grad = self._micro_batch(chunk, plan)
                grads.append(grad)
                for row, (seq, lps, kl) in enumerate(zip(chunk, logprobs, kls)):
                    emit(self._stream(planned.condition_id, plan, row, seq, lps, kl))
        return ConditionRecord(condition_id=planned.condition_id, kernels=plan.kernels, batch_size=plan.micro_batch,
                               positions=None, fillers="none", label=planned.label, load=self.kind,
                               extra={"side": "trainer", "micro_batch": plan.micro_batch, "padding": plan.padding,
                                      **grad_summary(grads)})

    def summarize(self, streams: list[dict]) -> Summary:
        return Summary(modes={})  # nondet rl's summary pairs both sides: nondet.rl.summary

    def close(self) -> None:
        pass

    def _micro_batch(self, chunk: list[Sequence], plan: TrainerPlan) -> tuple[list, list, dict | None]:
        """Forward (and backward) of one micro-batch -> per sequence its tokens' logprobs and exact KLs
        (None where the sampler's distributions are not at hand), gradient facts."""
        import torch

        model = self.loaded.model
        ids, mask, positions, places = layout([s.prompt + s.completion for s in chunk], plan.padding,
                                              pad_token(self.loaded.tokenizer))
        ids, positions = torch.tensor(ids, device=model.device), torch.tensor(positions, device=model.device)
        mask = None if mask is None else torch.tensor(mask, device=model.device)  # packed: none, positions say it
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        rows, cols, tokens = target_index(chunk, places)  # the logits row that predicted each sampled token
        c = self.config
        lp_all = processed_logprobs(logits[rows, cols], Processing(c.temperature, c.top_k, c.top_p))
        lp = lp_all.gather(-1, torch.tensor(tokens, device=model.device)[:, None])[:, 0]  # [n_tokens] fp32
        kl = self._kl(chunk, plan.kernels, lp_all)
        grad = backward(model, lp) if c.backward else None
        return split(chunk, lp.detach().cpu().tolist()), split(chunk, kl), grad

    def _kl(self, chunk: list[Sequence], kernels: str, lp_all) -> list[float] | None:
        """Exact KL(sampler || trainer) per token of the micro-batch, or None without the sampler's distributions."""
        held = [self.distributions.get((kernels, s.prompt_id)) for s in chunk]
        if any(h is None for h in held):
            return None
        import torch

        with torch.no_grad():
            sampler = torch.cat(held).to(lp_all.device)  # [n_tokens, vocab], the order target_index gives
            return exact_kl(sampler, lp_all.detach()).cpu().tolist()

    def _stream(self, cid: str, plan: TrainerPlan, row: int, seq: Sequence, lps: list[float],
                kl: list[float] | None) -> StreamRecord:
        extra = {"side": "trainer", "micro_batch": plan.micro_batch, "padding": plan.padding}
        if kl is not None:
            extra["kl"] = [float(x).hex() for x in kl]  # exact per-token KL(sampler || trainer), bits kept
        return StreamRecord(
            run_id=next(self.run_ids), condition_id=cid, kernels=plan.kernels, position=row, is_reference=False,
            prompt_id=seq.prompt_id, prompt_tokens=len(seq.prompt), finish="length",
            steps=[StepRecord(token=t, logprob=float(lp).hex()) for t, lp in zip(seq.completion, lps)], extra=extra)


def condition_id(kernels: str, micro_batch: int, padding: str) -> str:
    return f"{kernels}/trainer/mb{micro_batch}/{padding}"


def layout_label(padding: str) -> str:
    return "packed" if padding == "packed" else f"{padding}-padded"


def layout(rows: list[tuple[int, ...]], padding: str, pad: int) -> tuple[list, list | None, list, list]:
    """(ids, mask or None, position ids, (row, offset) of each sequence) of one micro-batch."""
    if padding == "packed":
        ids, positions, places = packed(rows)
        return ids, None, positions, places
    ids, mask, offsets = padded(rows, padding, pad)
    positions = [[max(0, c - 1) for c in itertools.accumulate(m)] for m in mask]  # real tokens count from 0
    return ids, mask, positions, list(enumerate(offsets))


def split(chunk: list[Sequence], values: list | None) -> list:
    """Flat per-token values of a micro-batch -> one list per sequence (None stays None per sequence)."""
    if values is None:
        return [None] * len(chunk)
    out, at = [], 0
    for s in chunk:
        out.append(values[at:at + len(s.completion)])
        at += len(s.completion)
    return out


def padded(rows: list[tuple[int, ...]], padding: str, pad: int) -> tuple[list, list, list[int]]:
    """(ids, mask, offset of each row's first real token) of a right- or left-padded micro-batch."""
    width = max(map(len, rows))
    offsets = [width - len(r) if padding == "left" else 0 for r in rows]
    ids = [[pad] * o + list(r) + [pad] * (width - len(r) - o) for r, o in zip(rows, offsets)]
    mask = [[0] * o + [1] * len(r) + [0] * (width - len(r) - o) for r, o in zip(rows, offsets)]
    return ids, mask, offsets


def target_index(chunk: list[Sequence], places: list[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
    """Completion token j of a sequence at (row b, offset o) sits at o + P + j; the logits one before predict it."""
    rows, cols, tokens = [], [], []
    for s, (b, o) in zip(chunk, places):
        for j, t in enumerate(s.completion):
            rows.append(b)
            cols.append(o + len(s.prompt) + j - 1)
            tokens.append(t)
    return rows, cols, tokens


def backward(model, logprobs) -> dict:
    """loss = -mean(logprob); backward; whether every gradient is finite, and their global norm."""
    import torch

    (-logprobs.mean()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))) if grads else 0.0
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    model.zero_grad(set_to_none=True)
    return {"finite": finite and bool(grads), "norm": norm}


def grad_summary(grads: list[dict | None]) -> dict:
    done = [g for g in grads if g is not None]
    if not done:
        return {"backward": False}
    return {"backward": True, "grad_finite": all(g["finite"] for g in done),
            "grad_norm_max": max(g["norm"] for g in done)}


def check_forward(model, tokens: list[int], padding: str, kernels: tuple[str, ...]) -> None:
    """The train-mode forward made random-free (refused where it cannot be), and packed rows keeping sequences
    apart on this model (else --padding packed is refused); both on a short sequence of the run's own tokens."""
    if not tokens:
        return  # nothing to teacher-force
    with training(model, tokens[:PROBE_LEN]):
        if padding == "packed":
            refuse_leaky_packing(model, tokens, kernels)


def repeated(tokens: list[int], n: int = 12) -> list[int]:
    """n ids from tokens, repeated where they are fewer ([] from none)."""
    return (tokens * n)[:n] if tokens else []


def pad_token(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad or 0
