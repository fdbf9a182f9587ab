"""summary.json "tensor_parallel": batch variance at each degree, and each degree against the reference.

Pure Python over the on-disk stream dicts (each carries "tp" and "tp_reference"; no torch).
The run's main diff (summary "modes") compares every stream with the reference degree's
prompt alone at batch size 1. This section splits that in two, per kernels mode:
- by_degree: the streams of one degree against that degree's own batch-1 reference: the
  batch variance a deployment at that degree shows;
- vs_reference: each degree's batch-1 reference against the reference degree's: what changing
  the TP degree alone does (first token / logprob-bits divergence; None = bitwise equal).
"""

from nondet.probes.core.summarize import summarize_modes

FIELDS = ("n_runs", "distinct_completions", "first_token_divergence", "first_numeric_divergence")


def tp_section(streams: list[dict], degrees: tuple[int, ...], prompts: tuple[str, ...] = ()) -> dict:
    reference = min(degrees)
    modes = {}
    for mode in dict.fromkeys(s["kernels"] for s in streams):
        of_mode = [s for s in streams if s["kernels"] == mode]
        modes[mode] = {"by_degree": [_by_degree(of_mode, d, prompts) for d in degrees if _has(of_mode, d)],
                       "vs_reference": [_vs_reference(of_mode, reference, d, prompts) for d in degrees
                                        if d != reference and _has(of_mode, d) and _has(of_mode, reference)]}
    return {"degrees": list(degrees), "reference_degree": reference, "modes": modes}


def _has(streams: list[dict], degree: int) -> bool:
    return any(s.get("tp") == degree and s.get("tp_reference") for s in streams)


def _by_degree(streams: list[dict], degree: int, prompts) -> dict:
    """One degree's streams, each prompt against its own batch-1 stream at this degree."""
    own = [{**s, "is_reference": bool(s.get("tp_reference"))} for s in streams if s.get("tp") == degree]
    return {"tp": degree, **_figures(own, prompts)}


def _vs_reference(streams: list[dict], reference: int, degree: int, prompts) -> dict:
    """Degree's batch-1 streams against the reference degree's (which stay the reference)."""
    refs = [{**s, "is_reference": s.get("tp") == reference} for s in streams
            if s.get("tp_reference") and s.get("tp") in (reference, degree)]
    figures = _figures(refs, prompts)
    return {"tp": degree, "against": reference, "first_token_divergence": figures["first_token_divergence"],
            "first_numeric_divergence": figures["first_numeric_divergence"],
            "bitwise_equal": figures["first_numeric_divergence"] is None}


def _figures(streams: list[dict], prompts) -> dict:
    mode = next(iter(summarize_modes(streams, None, prompts)["modes"].values()))
    return {k: mode.get(k) for k in FIELDS}
