"""The rl axis's requirement check: one trainer micro-batch size against the sampler.

A pair is one entry of an rl run's summary.json `rl.pairs` (nondet/rl/summary.py). Pure Python.
"""


def rl_message(pair: dict, require: str, value: float | None) -> str | None:
    """None when the pair meets the policy, else why not: counts, where, |dlogp| and the k3 KL."""
    differ = pair["n_tokens"] - pair["n_identical"]
    if require == "identical" and differ:
        return _rl_detail(f"{differ} of {pair['n_tokens']} sampled tokens' logprob bits differ from the "
                          f"sampler's at micro-batch {pair['micro_batch']}", pair)
    name, kl = _rl_kl(pair)
    if require == "max-kl" and not kl <= value:  # NaN fails too
        return _rl_detail(f"{name} {kl:.3g} > {value:g} at micro-batch {pair['micro_batch']} "
                          f"({differ} of {pair['n_tokens']} tokens' bits differ)", pair)
    return None


def _rl_kl(pair: dict) -> tuple[str, float]:
    """The KL max-kl judges: the exact mean per-token KL(sampler || trainer) where the sampler's
    full distributions were kept (in process), else the k3 estimate over the sampled tokens."""
    if pair.get("kl_exact") is not None:
        return "exact KL", pair["kl_exact"]
    return "k3 KL", pair["kl_k3"]


def _rl_detail(head: str, pair: dict) -> str:
    firsts = [(f, i) for i, f in enumerate(pair.get("first_diff") or []) if f is not None]
    where = ""
    if firsts:
        step, seq = min(firsts)
        where = f", first at token {step} of sequence {seq} (prompt {pair['prompt_ids'][seq]})"
    return (f"{head}{where}; max |dlogp| {pair['dlogp_max']:.3g}, k3 KL {pair['kl_k3']:.3g}, "
            f"{pair['ratio_outside_0.2']:.1%} of ratios outside 1 +- 0.2")
