"""summary.json of `nondet rl`: every trainer condition paired with the sampler of its kernels mode.

    {"modes": {}, "verdict": "...", "rl": {"pairs": [PAIR, ...], "processing": {...},
                                           "sample_groups": {"groups": [...], "identical_groups": 0}}}
    PAIR = {"kernels": "default", "sampler": "default", "micro_batch": 4, "padding": "right",
            "trainer_condition": "default/trainer/mb4/right", "backward": true, "grad_finite": true,
            **compare() metrics,          # n_tokens, frac_identical, dlogp_*, ratio_outside_*, kl_k*, first_diff
            "kl_exact": 0.0, "kl_exact_max": 0.0}  # exact KL(sampler || trainer) per token: mean, max
                                                    # (None: the sampler's distributions were not in-process)

Streams are matched by prompt_id; the trainer's tokens are the sampler's (asserted). Rollouts
(kernels "external") pair with the trainer under every mode. "sample_groups": the sampler
streams sharing a prompt, and those whose samples are all identical (nondet.rl.groups).
Pure Python + numpy.
"""

from nondet.rl.compare import compare
from nondet.rl.groups import sample_groups

EXTERNAL = "external"


def rl_summary(streams: list[dict], conditions: list[dict], config: dict) -> dict:
    """The summary document (the Summary record's fields) from on-disk stream and condition dicts."""
    samplers = _sampler_logprobs(streams)
    pairs = [_pair(c, streams, samplers) for c in conditions if c.get("side") == "trainer"]
    processing = {k: config.get(k) for k in ("temperature", "top_k", "top_p")}
    groups = sample_groups(streams, config.get("prompts") or ())
    return {"modes": {}, "verdict": verdict(pairs),
            "rl": {"pairs": pairs, "processing": processing, "sample_groups": groups}}


def _sampler_logprobs(streams: list[dict]) -> dict[str, dict[int, tuple[list, list]]]:
    """kernels -> prompt_id -> (tokens, logprobs as floats) of the sampler side."""
    out: dict[str, dict[int, tuple[list, list]]] = {}
    for s in streams:
        if s.get("side") == "sampler":
            out.setdefault(s["kernels"], {})[s["prompt_id"]] = _tokens_logprobs(s)
    return out


def _tokens_logprobs(stream: dict) -> tuple[list, list]:
    return [st["token"] for st in stream["steps"]], [float.fromhex(st["logprob"]) for st in stream["steps"]]


def _pair(cond: dict, streams: list[dict], samplers: dict) -> dict:
    mode = cond["kernels"]
    sampler_mode = mode if mode in samplers else EXTERNAL
    sampler = samplers.get(sampler_mode, {})
    trainer = sorted((s for s in streams if s["condition_id"] == cond["condition_id"]), key=lambda s: s["prompt_id"])
    s_lp, t_lp, kls = [], [], []
    for stream in trainer:
        kls.append(stream.get("kl"))
        tokens, lps = _tokens_logprobs(stream)
        s_tokens, s_lps = sampler[stream["prompt_id"]]
        assert tokens == s_tokens, "the trainer teacher-forces the sampler's tokens"
        s_lp.append(s_lps)
        t_lp.append(lps)
    metrics = {**compare(s_lp, t_lp), **exact_kl_metrics(kls)} if t_lp else {}
    facts = {k: cond.get(k) for k in ("micro_batch", "padding", "backward", "grad_finite", "grad_norm_max")}
    return {"kernels": mode, "sampler": sampler_mode, "trainer_condition": cond["condition_id"], **facts,
            "prompt_ids": [s["prompt_id"] for s in trainer], **metrics}


def exact_kl_metrics(per_stream: list[list[str] | None]) -> dict:
    """Mean and max of the trainer streams' exact per-token KLs (float.hex); None where any stream has none."""
    if not per_stream or any(k is None for k in per_stream):
        return {"kl_exact": None, "kl_exact_max": None}
    values = [float.fromhex(x) for k in per_stream for x in k]
    if not values:
        return {"kl_exact": None, "kl_exact_max": None}
    return {"kl_exact": sum(values) / len(values), "kl_exact_max": max(values)}


def verdict(pairs: list[dict]) -> str:
    """One sentence per kernels mode: on-policy (every bit equal) or how far off."""
    parts = []
    for mode in dict.fromkeys(p["kernels"] for p in pairs):
        of_mode = [p for p in pairs if p["kernels"] == mode and p.get("n_tokens")]
        if not of_mode:
            continue
        sizes = ", ".join(str(p["micro_batch"]) for p in of_mode)
        if all(p["n_identical"] == p["n_tokens"] for p in of_mode):
            parts.append(f"{mode} kernels: true on-policy, all {of_mode[0]['n_tokens']} sampled tokens' logprobs "
                         f"bit-identical at micro-batch {sizes}, KL exactly 0")
        else:
            worst = min(of_mode, key=lambda p: p["frac_identical"])
            parts.append(f"{mode} kernels: off-policy, {worst['frac_identical']:.1%} of logprobs bit-identical at "
                         f"micro-batch {worst['micro_batch']} (max |dlogp| {worst['dlogp_max']:.3g}, "
                         f"k3 KL {worst['kl_k3']:.3g})")
    return "; ".join(parts) or "no trainer tokens to compare"
