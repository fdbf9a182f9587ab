"""Streams -> summary.json: the diff per kernels mode and, with several prompts, per prompt.

Pure Python over the on-disk stream dicts (no torch), shared by every source.
"""

from nondet.probes.diff import summarize, verdict
from nondet.probes.diff_prompts import merge_prompts
from nondet.rundir.records import Summary


def summarize_modes(streams: list[dict], tokenizer=None, prompts: tuple[str, ...] = ()) -> dict:
    """{"modes": {mode: diff}, "verdict": sentence}; each prompt's runs against its own reference."""
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
    modes = {}
    for mode in dict.fromkeys(s["kernels"] for s in streams):
        of_mode = [s for s in streams if s["kernels"] == mode]
        prompt_ids = list(dict.fromkeys(s.get("prompt_id", 0) for s in of_mode))
        per_prompt = [summarize([s for s in of_mode if s.get("prompt_id", 0) == k], decode) for k in prompt_ids]
        modes[mode] = per_prompt[0] if len(per_prompt) == 1 else merge_prompts(per_prompt, prompt_ids, prompts)
    return {"modes": modes, "verdict": verdict(modes)}


def as_summary(doc: dict) -> Summary:
    """A summarize_modes dict (plus extra sections such as "load") as the typed record."""
    return Summary(modes=doc["modes"], verdict=doc["verdict"],
                   extra={k: v for k, v in doc.items() if k not in ("modes", "verdict")})
