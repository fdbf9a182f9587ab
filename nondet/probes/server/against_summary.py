"""summary.json "against": two deployments of one model, compared per side and across.

Pure Python over the on-disk stream dicts of `nondet probe --endpoint A --against B`
(sources/against.py), already re-stepped to one comparison level. Each side is judged against
its own request sent alone (does this deployment agree with itself under load?); across, B's
answer alone is compared with A's answer alone, the probe's reference (do the two deployments
agree?), and every answer of either side counts toward the distinct completions. Two different
engines ("cross_engine": traffic/engines.py) are expected to differ from step 0: the verdict
says so first, and calls only each side's own divergence under load batch variance.
"""

from nondet.probes.core.diff import earliest, first_numeric_divergence, first_token_divergence, tokens_of
from nondet.probes.server.engines import different_engines
from nondet.verdict import cross_engine_clause

SIDES = ("A", "B")
NO_BITS = "logprobs are compared only where both servers return them"  # why "first_logprob_divergence" is null


def against_section(streams: list[dict], endpoints: dict[str, str], level: str,
                    engines: dict[str, str | None] | None = None) -> dict:
    """{"reference", "compare_level", "cross_engine", "sides": [per side], "across": {...}};
    `endpoints`: side -> URL; `engines`: side -> the engine its server names (None: unrecognized)."""
    by_side = {name: [s for s in streams if s.get("side") == name] for name in SIDES}
    engines = engines or {}
    return {"reference": "side A's request sent alone (run 0)", "compare_level": level,
            "cross_engine": different_engines(engines.get("A"), engines.get("B")),
            "sides": [_side(name, endpoints[name], engines.get(name), by_side[name], level) for name in SIDES],
            "across": _across(by_side, level)}


def _side(name: str, endpoint: str, engine: str | None, streams: list[dict], level: str) -> dict:
    alone = _alone(streams)
    rows = [s for s in streams if s is not alone]
    bits = level == "logprobs" and alone is not None
    return {"side": name, "endpoint": endpoint, "engine": engine, "n_runs": len(streams),
            "prompt_tokens": alone.get("prompt_tokens") if alone else None,
            "distinct_completions": len({tokens_of(s) for s in streams}),
            "first_token_divergence": earliest(first_token_divergence(alone, s) for s in rows) if alone else None,
            "first_numeric_divergence": earliest(first_numeric_divergence(alone, s) for s in rows) if bits else None}


def _across(by_side: dict[str, list[dict]], level: str) -> dict:
    a, b = _alone(by_side["A"]), _alone(by_side["B"])
    every = by_side["A"] + by_side["B"]
    both = {tokens_of(s) for s in by_side["A"]} & {tokens_of(s) for s in by_side["B"]}
    pair = a is not None and b is not None
    return {"distinct_completions": len({tokens_of(s) for s in every}), "completions_on_both_sides": len(both),
            "first_token_divergence": first_token_divergence(a, b) if pair else None,  # alone vs alone
            "first_token_divergence_any": earliest(first_token_divergence(a, s) for s in by_side["B"]) if a else None,
            "first_logprob_divergence": first_numeric_divergence(a, b) if pair and level == "logprobs" else None,
            "logprobs_na": None if level == "logprobs" else NO_BITS}


def _alone(streams: list[dict]) -> dict | None:
    """The side's request sent alone (request index 0), None if it never answered."""
    return next((s for s in streams if s.get("request_index") == 0), None)


def against_verdict(section: dict) -> str:
    """summary.json's sentence for two deployments: across first, then each side under load. Two
    engines are named a cross-engine comparison first, so that a difference from step 0 is not read
    as batch variance."""
    across, what = section["across"], "engines" if section.get("cross_engine") else "deployments"
    if across["first_token_divergence"] is not None:
        head = (f"the {what} differ: B's answer alone leaves A's at token {across['first_token_divergence']}; "
                f"{across['distinct_completions']} distinct completions over both sides")
    elif across["first_logprob_divergence"] is not None:
        head = (f"same tokens alone on both {what}, but logprob bits differ from step "
                f"{across['first_logprob_divergence']}")
    elif across["logprobs_na"]:
        head = f"same text alone on both {what} (no logprobs to compare bits)"
    else:
        head = f"the {what} agree alone: same tokens, bit-identical logprobs"
    sides = "; ".join(f"{s['side']}: {s['distinct_completions']} distinct over {s['n_runs']} runs"
                      for s in section["sides"])
    head += _prompt_lengths(section["sides"])
    if section.get("cross_engine"):
        return f"{cross_engine_clause(section)}; {head}; batch variance within each engine: {sides}"
    return f"{head}; {sides}"


def _prompt_lengths(sides: list[dict]) -> str:
    """Two servers that read the prompt as different token counts (another tokenizer, a BOS token)."""
    a, b = (s.get("prompt_tokens") for s in sides)
    return f" (the prompt was {a} tokens on A, {b} on B)" if a is not None and b is not None and a != b else ""
