"""Streams -> summary.json: the diff per kernels mode and, with several prompts, per prompt.

Pure Python over the on-disk stream dicts (no torch), shared by every source.
"""

from nondet.probes.core.confidence import mode_confidence
from nondet.probes.core.diff import summarize, verdict
from nondet.probes.core.diff_prompts import merge_prompts
from nondet.probes.core.flip_cause import flip_causes
from nondet.prompt import Prompt
from nondet.rundir.records import Summary


def summarize_modes(streams: list[dict], tokenizer=None, prompts: tuple[Prompt, ...] = ()) -> dict:
    """{"modes": {mode: diff}, "verdict": sentence}; each prompt's runs against its own reference."""
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
    modes = {}
    for mode in dict.fromkeys(s["kernels"] for s in streams):
        of_mode = [s for s in streams if s["kernels"] == mode]
        prompt_ids = list(dict.fromkeys(s.get("prompt_id", 0) for s in of_mode))
        per_prompt = [summarize([s for s in of_mode if s.get("prompt_id", 0) == k], decode) for k in prompt_ids]
        modes[mode] = per_prompt[0] if len(per_prompt) == 1 else merge_prompts(per_prompt, prompt_ids, prompts)
        modes[mode]["confidence"] = mode_confidence(of_mode)
        routing = routing_changes(of_mode)
        if routing is not None:
            modes[mode]["routing"] = routing
        causes = flip_causes(of_mode)
        if causes:
            modes[mode]["flip_causes"] = causes
    return {"modes": modes, "verdict": verdict(modes)}


def routing_changes(streams: list[dict]) -> dict | None:
    """A mixture of experts' runs: in how many did some token go to other experts than in its prompt's
    reference, and where first ({"runs_changed", "runs", "first": {"step", "layer"}}); None when the
    streams carry no routing (a dense model, a server)."""
    if not any("experts" in step for s in streams for step in s.get("steps", [])[:1]):
        return None
    refs = {s.get("prompt_id", 0): s for s in streams if s["is_reference"]}
    changed, first = 0, None
    others = [s for s in streams if not s["is_reference"]]
    for s in others:
        where = _first_routing_change(refs[s.get("prompt_id", 0)]["steps"], s["steps"])
        if where is not None:
            changed += 1
            first = where if first is None else min(first, where)
    return {"runs_changed": changed, "runs": len(others),
            "first": None if first is None else {"step": first[0], "layer": first[1]}}


def _first_routing_change(ref_steps: list[dict], steps: list[dict]) -> tuple[int, int] | None:
    for step, (a, b) in enumerate(zip(ref_steps, steps)):
        for layer, (x, y) in enumerate(zip(a.get("experts", []), b.get("experts", []))):
            if x != y:
                return step, layer
        if a.get("token") != b.get("token"):
            return None  # past a token flip the histories differ: routing is no longer comparable
    return None


def as_summary(doc: dict) -> Summary:
    """A summarize_modes dict (plus extra sections such as "load") as the typed record."""
    return Summary(modes=doc["modes"], verdict=doc["verdict"],
                   extra={k: v for k, v in doc.items() if k not in ("modes", "verdict")})


def sampling_section(config, sampler: str) -> dict:
    """{"sampling": ...} for summary.json when the probe sampled (verdict.sampler_lines words the
    sampler's flips by it): temperature, seed and how the requests drew; {} when greedy."""
    if config.temperature <= 0:
        return {}
    return {"sampling": {"temperature": config.temperature, "seed": config.seed, "sampler": sampler}}
