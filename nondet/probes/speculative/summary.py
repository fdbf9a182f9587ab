"""summary.json's "speculative" section: each speculative condition against plain greedy.

Pure Python over the on-disk stream dicts (no torch). Per condition (one form, one prompt,
one kernels mode) and per form (over prompts): distinct completions vs plain greedy, first
token and first numeric divergence, acceptance rate, tokens/s with and without speculation.
"""

from nondet.probes.core.diff import earliest, references, versus_reference


def speculative_section(streams: list[dict], forms: list[str]) -> dict:
    refs = references(streams)
    rows = [_condition(refs[(s["kernels"], s.get("prompt_id", 0))], s)
            for s in streams if not s["is_reference"] and s.get("speculative")]
    keys = list(dict.fromkeys((r["kernels"], r["speculative"]) for r in rows))
    return {"forms": forms, "batch_size": 1, "conditions": rows,
            "by_form": [_form([r for r in rows if (r["kernels"], r["speculative"]) == key]) for key in keys]}


def _condition(ref: dict, run: dict) -> dict:
    return {
        **versus_reference(ref, run), "speculative": run["speculative"],
        "acceptance_rate": run.get("acceptance_rate"),
        "drafted": sum(run.get("drafted") or []), "accepted": sum(run.get("accepted") or []),
        "rounds": len(run.get("drafted") or []), "tokens": len(run["steps"]),
        "seconds": run.get("seconds"), "tokens_per_s": run.get("tokens_per_s"),
        "reference_tokens": len(ref["steps"]), "reference_seconds": ref.get("seconds"),
        "reference_tokens_per_s": ref.get("tokens_per_s"),
        # No draft, no speculation: the run was plain decoding plus the drafter's overhead, so its
        # tokens/s against plain greedy is not a speculative gain (None, and said where it is shown).
        "speedup": _ratio(run.get("tokens_per_s"), ref.get("tokens_per_s")) if sum(run.get("drafted") or []) else None,
    }


def _form(rows: list[dict]) -> dict:
    """One form under one kernels mode, over its prompts: the worst prompt and the totals."""
    drafted = sum(r["drafted"] for r in rows)
    tps = _rate(rows, "tokens", "seconds")
    ref_tps = _rate(rows, "reference_tokens", "reference_seconds")
    return {
        "kernels": rows[0]["kernels"], "speculative": rows[0]["speculative"], "n_prompts": len(rows),
        "distinct_completions": max(r["distinct_completions"] for r in rows),
        "prompts_diverged": sum(r["first_token_divergence"] is not None for r in rows),
        "prompts_bits_differ": sum(r["first_numeric_divergence"] is not None for r in rows),
        "first_token_divergence": earliest(r["first_token_divergence"] for r in rows),
        "first_numeric_divergence": earliest(r["first_numeric_divergence"] for r in rows),
        "drafted": drafted,
        "acceptance_rate": round(sum(r["accepted"] for r in rows) / drafted, 4) if drafted else None,
        "tokens_per_s": tps, "reference_tokens_per_s": ref_tps, "speedup": _ratio(tps, ref_tps) if drafted else None,
        **_round_cost(rows),
    }


def _round_cost(rows: list[dict]) -> dict:
    """The speedup split in two: speedup = tokens_per_round / round_cost, where round_cost is one
    verification round's time (its drafts included) in plain greedy steps. Acceptance sets the first
    and depends on the token stream (two kernels modes decode different streams); the kernels' cost
    sets the second, so comparing round costs compares the modes at equal acceptance."""
    rounds = sum(r["rounds"] for r in rows)
    seconds = sum(r["seconds"] or 0 for r in rows)
    plain_step = _per(sum(r["reference_seconds"] or 0 for r in rows), sum(r["reference_tokens"] for r in rows))
    per_round = _per(seconds, rounds)
    return {"rounds": rounds, "tokens_per_round": _per(sum(r["tokens"] for r in rows), rounds, 3),
            "round_cost": round(per_round / plain_step, 3) if per_round and plain_step else None}


def _per(total: float, count: int, digits: int | None = None) -> float | None:
    if not count or not total:
        return None
    return total / count if digits is None else round(total / count, digits)


def _rate(rows: list[dict], tokens: str, seconds: str) -> float | None:
    total = sum(r[seconds] or 0 for r in rows)
    return round(sum(r[tokens] for r in rows) / total, 2) if total > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None
