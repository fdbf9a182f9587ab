"""The processed distribution both RL sides take logprobs over.

vLLM's "processed" logprobs are those of the distribution it samples from: logits divided by
the temperature, truncated by top-k and top-p, renormalised. Sampler and trainer both call
`processed_logprobs` on fp32 logits rows, so the same arithmetic runs on both sides and any
difference comes from the logits, i.e. from the kernels. Row-wise ops only: [rows, vocab].
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Processing:
    temperature: float  # > 0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off


def processed_logprobs(logits, p: Processing):
    """logits [rows, vocab] fp32 -> log-probabilities [rows, vocab] fp32 (-inf where truncated)."""
    import torch

    x = logits.float() / p.temperature
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        x = _top_p(x, p.top_p)
    return torch.log_softmax(x, dim=-1)


def _top_p(x, top_p: float):
    """Keep the smallest set of most likely tokens whose probability reaches top_p (the crossing one kept)."""
    import torch

    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability mass of the tokens ranked above
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))
