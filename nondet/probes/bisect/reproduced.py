"""Did bisect's replay reproduce the probe's run? bisect.json's "reference_reproduced",
"reference_bits_reproduced" and "replay", shared by every axis whose reference is a probe stream
(a static batch, a speculative condition, a tensor-parallel degree's prompt alone).

An attribution holds for the replay it was made on; these keys say whether that replay is the
probe's (the same tokens, then the same logprob bits) and on which KV cache it ran, so the
terminal and the report can say so in one line (verdict.replay_line) where it is not.
"""

from nondet.probes.core.replay import DecodeSettings


def reproduced(replayed: list[dict], streams: list[dict], reference_run_id: int) -> dict:
    """reference_reproduced: the replayed reference's tokens equal the probe's reference stream's;
    reference_bits_reproduced: their logprob bits too, over the steps replayed (the same numerics: threads,
    versions, device and the KV cache's length alike). None where the probe kept no reference stream.
    replayed: the replay's reference steps ({"token", "logprob"} per step)."""
    ref = next((s for s in streams if s["run_id"] == reference_run_id), None)
    if ref is None:
        return {"reference_reproduced": None, "reference_bits_reproduced": None}
    probe_steps = ref["steps"][: len(replayed)]
    replayed = replayed[: len(probe_steps)]
    return {"reference_reproduced": [s["token"] for s in probe_steps] == [s["token"] for s in replayed],
            "reference_bits_reproduced": ([(s["token"], s["logprob"]) for s in probe_steps]
                                          == [(s["token"], s["logprob"]) for s in replayed])}


def replay_record(settings: DecodeSettings, probe: dict) -> dict:
    """bisect.json "replay": the KV cache the replay decoded on, and whether the probe's steps were compiled
    (then its bits are Inductor's and an eager replay is not expected to give them)."""
    return {"kv_cache": settings.kv_cache, "cache_tokens": settings.cache_tokens,
            "probe_compiled": bool(probe.get("compile_backend"))}
