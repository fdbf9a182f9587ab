"""A logits processor that records each target row's step and, when sampling, picks tokens.

It sits at the end of transformers' logits-processor list, so it sees the fp32 logits of
every step exactly as generate's greedy argmax will. Each step it gathers, for all target
rows at once and on the logits' device, the chosen token, its log-softmax, the top-6 logits
and their ids ([rows] / [rows, 6] tensors, kept as tensors); they become Python numbers and
float.hex strings once, when `steps` is read (normally once per generate call). No
per-row, per-step Python work and no device sync per step.

Batch variance of the measurement itself: log_softmax and topk reduce each row on its own
over the vocabulary, so [rows, vocab] gives every row the bits [1, vocab] gives it (checked
bit for bit against the per-row path, `step_record`, in tests/test_probe_recorder.py; under
the batch-invariant mode log_softmax is the mode's row-blocked kernel, row-independent by
construction). With temperature > 0 it samples each row with that request's own generator
and masks the others, so generate's greedy argmax takes the sampled token: RNG effects stay
apart from numeric ones (the target uses the same seed in every condition).

The `shared` sampler is the other way, on purpose: one generator for the whole batch, seeded once
per call and drawn row after row, as transformers' batched sampling after torch.manual_seed and a
server that ignores per-request seeds draw. A row's random numbers then depend on how many rows
drew before it, so its samples depend on the batch even where its logits do not.

Non-finite logits: a target row whose logits hold NaN or +inf (a model overflowing float16) would
record token 0 and logprob 'nan' every step, the same in every condition. That is a finding, not a
measurement: each step also keeps a per-row flag (on the device, no sync), read when the steps are
converted, and the sampler checks the probabilities it already copied to the host; both raise
NonFiniteLogitsError. -inf entries are masked vocabulary, a valid distribution, and pass.
"""

from nondet.errors import NonFiniteLogitsError

TOP_K = 5
SAMPLERS = ("per-request", "shared")  # each request its own seeded generator | one for the batch


class StepRecorder:
    def __init__(self, target_rows, batch_size: int, temperature: float, seed: int,
                 filler_seed_offset: int = 1, sampler: str = "per-request", model_dtype=None):
        import torch

        self.target_rows = tuple(target_rows)
        self.temperature = temperature
        self.model_dtype = model_dtype  # named in a NonFiniteLogitsError's message when the caller knows it
        self._steps: dict[int, list[dict]] = {r: [] for r in self.target_rows}
        # per step: (tokens [R], logprob [R], top ids [R,5], top lp [R,5], margin [R], non-finite [R])
        self._pending: list[tuple] = []
        self._rows = None  # target rows as an index tensor on the logits' device (first step)
        self.generators = None
        self.shared = None  # the batch's one generator (sampler "shared")
        if temperature > 0 and sampler == "shared":
            self.shared = torch.Generator().manual_seed(seed)
        elif temperature > 0:
            self.generators = [torch.Generator().manual_seed(
                seed if r in self.target_rows else seed + filler_seed_offset + r)
                for r in range(batch_size)]

    @property
    def steps(self) -> dict[int, list[dict]]:
        """{target row: [step dict, ...]}: the pending tensors converted to exact bits now."""
        if self._pending:
            self._flush()
        return self._steps

    def keep_first(self, steps: int) -> None:
        """Forget the steps past the first `steps`: generate ran them and then undid them (a stop check
        read a step late, core/deferred_stop.py), so they are not in the tokens it returned."""
        del self._pending[max(0, steps - self._converted()):]  # an undone step is not recorded: never checked
        for row, kept in self.steps.items():
            self._steps[row] = kept[:steps]

    def latest(self) -> tuple:
        """(tokens [R], logprobs [R] fp32, step index) of the last step recorded, as tensors on the logits'
        device (a step not yet converted), for a stopping criterion that reads each step (core/settled.py)."""
        tokens, logprobs = self._pending[-1][:2]
        return tokens, logprobs, self._converted() + len(self._pending) - 1

    def __call__(self, input_ids, scores):
        import torch

        chosen = self._choose(scores)
        if self._rows is None:
            self._rows = torch.tensor(self.target_rows, device=scores.device)
        logits = scores.index_select(0, self._rows).float()
        self._pending.append((*gather_step(logits, chosen[self._rows]), non_finite_rows(logits)))
        if self.generators is None and self.shared is None:
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), chosen] = 0.0
        return forced

    def _choose(self, scores):
        import torch

        if self.shared is not None:  # every row from the one stream, row 0 first
            probs = torch.softmax(scores.float() / self.temperature, dim=-1).cpu()
            self._check_probs(probs, 0)
            return torch.multinomial(probs, 1, generator=self.shared)[:, 0].to(scores.device)
        if self.generators is None:
            return torch.argmax(scores, dim=-1)
        picks = []
        for row, gen in enumerate(self.generators):
            probs = torch.softmax(scores[row:row + 1].float() / self.temperature, dim=-1).cpu()
            self._check_probs(probs, row)
            picks.append(int(torch.multinomial(probs, 1, generator=gen)))
        return torch.tensor(picks, device=scores.device)

    def _check_probs(self, probs, first_row: int) -> None:
        """probs [rows, vocab] on the host, rows from `first_row`: softmax turns a NaN or +inf logit into NaN
        probabilities, which torch.multinomial would reject with an internal error. Checked on the host copy
        sampling makes anyway, so no extra device sync."""
        bad = probs.isnan().any(dim=-1).nonzero()
        if len(bad):
            raise NonFiniteLogitsError(self._converted() + len(self._pending), first_row + int(bad[0]),
                                       self.model_dtype)

    def _converted(self) -> int:
        """How many steps are already converted to records (every target row has as many)."""
        return len(self._steps[self.target_rows[0]]) if self.target_rows else 0

    def _flush(self) -> None:
        """Every pending step of every target row -> step dicts, one stack and one copy per field."""
        import torch

        fields = [torch.stack(f).cpu().tolist() for f in zip(*self._pending)]  # each [steps, R(, 5)]
        self._pending = []
        self._check_flags(fields[-1])
        for tokens, logprob, top_ids, top_lp, margin, _ in zip(*fields):
            for i, row in enumerate(self.target_rows):
                self._steps[row].append(_as_record(tokens[i], logprob[i], top_ids[i], top_lp[i], margin[i]))

    def _check_flags(self, flags: list[list[bool]]) -> None:
        """flags [steps, R] of the steps being converted: the first non-finite target row stops the run."""
        for offset, per_row in enumerate(flags):
            if any(per_row):
                raise NonFiniteLogitsError(self._converted() + offset, self.target_rows[per_row.index(True)],
                                           self.model_dtype)


def non_finite_rows(logits):
    """logits [R, vocab] -> [R] bool, True where a row holds NaN or +inf. `x < inf` is False for exactly
    those two and True for -inf (a masked entry): one comparison and one reduction, on the logits' device."""
    return ~(logits < float("inf")).all(dim=-1)


def gather_step(logits, tokens) -> tuple:
    """logits [R, vocab] fp32, tokens [R] -> (tokens, logprob [R], top ids [R,5], top logprobs [R,5],
    top1-top2 logit margin [R]), all tensors on the logits' device."""
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)  # [R, vocab]
    top_logits, top_ids = torch.topk(logits, TOP_K + 1, dim=-1)  # [R, 6]
    ids = top_ids[:, :TOP_K]
    return (tokens, logprobs.gather(1, tokens[:, None])[:, 0], ids, logprobs.gather(1, ids),
            top_logits[:, 0] - top_logits[:, 1])


def _as_record(token: int, logprob: float, top_ids: list, top_lp: list, margin: float) -> dict:
    """One step's numbers (fp32 values as exact Python floats) -> the record's dict."""
    return {"token": token, "logprob": logprob.hex(), "top": [[i, lp.hex()] for i, lp in zip(top_ids, top_lp)],
            "margin": margin.hex()}


def step_record(logits_row, token: int, step: int | None = None, row: int | None = None,
                model_dtype=None) -> dict:
    """logits_row: [1, vocab] fp32 -> token, exact logprob, top-5, top1-top2 logit margin.

    The per-row path: the speculative source records raw logits with it, and the test holds
    StepRecorder's batched records to it bit for bit. step (0-based decode step), row (batch row) and
    model_dtype only name where, in the NonFiniteLogitsError of a row that is not finite."""
    import torch

    # the continuous and speculative sources record through here: refused as StepRecorder refuses (they pass
    # the step and row they know; one more sync beside this function's own float() reads)
    if bool(non_finite_rows(logits_row)[0]):
        raise NonFiniteLogitsError(step, row, model_dtype)
    logprobs = torch.log_softmax(logits_row, dim=-1)[0]
    top_logits, top_ids = torch.topk(logits_row[0], TOP_K + 1)
    top = [[int(i), float(logprobs[i]).hex()] for i in top_ids[:TOP_K].tolist()]
    return {
        "token": token,
        "logprob": float(logprobs[token]).hex(),
        "top": top,
        "margin": float(top_logits[0] - top_logits[1]).hex(),
    }
