"""Sampler vs trainer logprobs of the same sampled tokens, as RL people read them.

    from nondet.rl import compare
    metrics = compare(batch["sampler_logprobs"], trainer_logprobs, batch["completion_mask"])
    logger.log(metrics)                        # plain Python numbers, one key each

With r = exp(logp_trainer - logp_sampler), the importance ratio of a token the sampler drew,
the KL(sampler || trainer) estimators are those of J. Schulman, "Approximating KL
Divergence" (2020, http://joschu.net/blog/kl-approx.html), samples x ~ sampler:
    k1 = -log r                (unbiased, high variance, can be negative per token)
    k2 = (log r)^2 / 2         (biased, low variance, >= 0)
    k3 = (r - 1) - log r       (unbiased, low variance, >= 0)
each the mean over the tokens the mask keeps. All three are exactly 0 when every logprob is
bit-identical, which is what batch-invariant kernels on both sides give (true on-policy).

Pure numpy: accepts numpy arrays, torch tensors (any device, any float dtype) or nested lists
(ragged lists are right-padded and masked). Bit-identity is compared after an exact upcast
to float64, so -0.0 and 0.0 count as different bits, as do two NaNs with different payloads.
"""

import numpy as np

EPSILONS = (0.1, 0.2)  # importance-ratio clip ranges [1 - eps, 1 + eps] reported (PPO's usual)


def compare(sampler_logprobs, trainer_logprobs, mask=None) -> dict:
    """Metrics of the tokens where mask is true (None: every token); arrays are [sequences, tokens].

    Returns {"n_tokens", "n_identical", "frac_identical", "dlogp_max", "dlogp_mean", "dlogp_p95",
    "ratio_outside_0.1", "ratio_outside_0.2", "kl_k1", "kl_k2", "kl_k3", "seqs_differ",
    "first_diff"}: counts are ints, metrics floats (NaN when no token is kept), and
    "first_diff" lists per sequence the first kept token index whose bits differ (None: none).
    ValueError when the shapes disagree.
    """
    s, t, keep = _aligned(sampler_logprobs, trainer_logprobs, mask)
    same = s.view(np.uint64) == t.view(np.uint64)
    first = [_first(row_same, row_keep) for row_same, row_keep in zip(same, keep)]
    return {**token_metrics(s[keep], t[keep], same[keep]),
            "seqs_differ": sum(f is not None for f in first), "first_diff": first}


def token_metrics(s: np.ndarray, t: np.ndarray, same: np.ndarray) -> dict:
    """Metrics over flat float64 arrays of kept tokens (s: sampler, t: trainer, same: bits equal)."""
    n = int(s.size)
    with np.errstate(all="ignore"):  # -inf logprobs (a token truncation removed) give inf, not warnings
        log_r = np.where(same, 0.0, t - s)  # log importance ratio per token (0 where bits match, -inf too)
        ratio = np.exp(log_r)
        dlogp = np.abs(log_r)
        out = {"n_tokens": n, "n_identical": int(same.sum()), "frac_identical": _mean(same.astype(float)),
               "dlogp_max": float(dlogp.max()) if n else float("nan"), "dlogp_mean": _mean(dlogp),
               "dlogp_p95": float(np.percentile(dlogp, 95)) if n else float("nan")}
        for eps in EPSILONS:
            outside = (ratio < 1 - eps) | (ratio > 1 + eps)
            out[f"ratio_outside_{eps}"] = _mean(outside.astype(float))
        out["kl_k1"] = _mean(-log_r)
        out["kl_k2"] = _mean(log_r * log_r / 2)
        out["kl_k3"] = _mean((ratio - 1) - log_r)
    return out


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def _first(row_same: np.ndarray, row_keep: np.ndarray) -> int | None:
    differs = np.flatnonzero(row_keep & ~row_same)
    return int(differs[0]) if differs.size else None


def _aligned(sampler, trainer, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sampler, trainer) as float64 [rows, cols] and the bool mask, padding ragged lists."""
    s, s_mask = _array(sampler, "sampler_logprobs")
    t, t_mask = _array(trainer, "trainer_logprobs")
    if s.shape != t.shape:
        raise ValueError(f"sampler_logprobs has shape {s.shape} but trainer_logprobs {t.shape}")
    keep = s_mask & t_mask
    if mask is not None:
        m, m_mask = _array(mask, "mask")
        if m.shape != s.shape:
            raise ValueError(f"mask has shape {m.shape} but the logprobs {s.shape}")
        keep &= m_mask & (m != 0)
    return s, t, keep


def _array(x, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A float64 [rows, cols] array and where it holds values (False only in a ragged list's padding)."""
    if hasattr(x, "detach"):  # a torch tensor: exact upcast on its device first (bf16 has no numpy type)
        x = x.detach().double().cpu().numpy()
    if isinstance(x, (list, tuple)) and x and all(isinstance(r, (list, tuple, np.ndarray)) for r in x):
        width = max((len(r) for r in x), default=0)
        out = np.zeros((len(x), width))
        held = np.zeros((len(x), width), dtype=bool)
        for i, row in enumerate(x):
            out[i, :len(row)] = np.asarray(row, dtype=np.float64)
            held[i, :len(row)] = True
        return out, held
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be [sequences, tokens], got {arr.ndim} dimensions")
    return arr, np.ones(arr.shape, dtype=bool)
