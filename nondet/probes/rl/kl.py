"""Exact per-token KL(sampler || trainer) from both sides' whole processed distributions.

    KL_t = sum_v p_s(v) * (log p_s(v) - log p_t(v)),   p_s = exp(sampler log-distribution)

over the vocabulary of the step that drew token t. The k1/k2/k3 estimators (nondet.rl.compare)
see only the sampled token; this is the quantity they estimate, available only where both
sides run in-process. Truncated entries (-inf on the sampler side) carry no mass and add 0;
a token the sampler could draw but the trainer's truncation removed gives +inf. When every
logprob of the two rows is bit-identical each term is p * 0, so the KL is exactly 0.
"""


ROWS = 256  # tokens per block: fp64 temporaries of [ROWS, vocab], not [micro-batch tokens, vocab]


def exact_kl(sampler_logprobs, trainer_logprobs):
    """[tokens, vocab] log-distributions (any float dtype, same device) -> [tokens] float64 KL."""
    import torch

    blocks = [_block(sampler_logprobs[i:i + ROWS], trainer_logprobs[i:i + ROWS])
              for i in range(0, sampler_logprobs.shape[0], ROWS)]
    return torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.float64)


def _block(sampler_logprobs, trainer_logprobs):
    import torch

    s, t = sampler_logprobs.double(), trainer_logprobs.double()
    held = s > float("-inf")  # where the sampler's processed distribution has mass
    terms = torch.where(held, s.exp() * (s - t), torch.zeros_like(s))  # fp64: no cancellation noise
    return terms.sum(-1)
