"""A logits processor that records each target row's step and, when sampling, picks tokens.

It sits at the end of transformers' logits-processor list, so it sees the fp32 logits of
every step exactly as generate's greedy argmax will. Statistics are computed one row at a
time, with the same [1, vocab] shape every time, so our own measurement adds no batch
variance. With temperature > 0 it samples each row with that request's own generator and
masks the others, so generate's greedy argmax takes the sampled token: RNG effects stay
apart from numeric ones (the target uses the same seed in every condition).
"""

TOP_K = 5


class StepRecorder:
    def __init__(self, target_rows, batch_size: int, temperature: float, seed: int,
                 filler_seed_offset: int = 1):
        import torch

        self.target_rows = tuple(target_rows)
        self.temperature = temperature
        self.steps: dict[int, list[dict]] = {r: [] for r in self.target_rows}
        self.generators = None
        if temperature > 0:
            self.generators = [torch.Generator().manual_seed(
                seed if r in self.target_rows else seed + filler_seed_offset + r)
                for r in range(batch_size)]

    def __call__(self, input_ids, scores):
        import torch

        chosen = self._choose(scores)
        for row in self.target_rows:
            self.steps[row].append(step_record(scores[row:row + 1].float(), int(chosen[row])))
        if self.generators is None:
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), chosen] = 0.0
        return forced

    def _choose(self, scores):
        import torch

        if self.generators is None:
            return torch.argmax(scores, dim=-1)
        picks = []
        for row, gen in enumerate(self.generators):
            probs = torch.softmax(scores[row:row + 1].float() / self.temperature, dim=-1)
            picks.append(int(torch.multinomial(probs.cpu(), 1, generator=gen)))
        return torch.tensor(picks, device=scores.device)


def step_record(logits_row, token: int) -> dict:
    """logits_row: [1, vocab] fp32 -> token, exact logprob, top-5, top1-top2 logit margin."""
    import torch

    logprobs = torch.log_softmax(logits_row, dim=-1)[0]
    top_logits, top_ids = torch.topk(logits_row[0], TOP_K + 1)
    top = [[int(i), float(logprobs[i]).hex()] for i in top_ids[:TOP_K].tolist()]
    return {
        "token": token,
        "logprob": float(logprobs[token]).hex(),
        "top": top,
        "margin": float(top_logits[0] - top_logits[1]).hex(),
    }
