"""summary.json's "prefill" section: each prefill form (core/prefill.py) against one-pass prefill.

Pure Python over the on-disk stream dicts (no torch). Per condition (one prompt, one form, one
size, one kernels mode) and per form and size over the prompts: whether the tokens and the
logprob bits left the prompt's reference (its whole prompt prefilled in one forward), and where.
"""

from nondet.probes.core.diff import earliest, references, versus_reference


def prefill_section(streams: list[dict], forms: tuple[str, ...] = ()) -> dict:
    """forms: the forms asked for ("chunk:64"); one no prompt could run (a size >= every prompt's
    length leaves the generate call nothing to prefill) is listed under not_run."""
    refs = references(streams)
    rows = [_condition(refs[(s["kernels"], s.get("prompt_id", 0))], s)
            for s in streams if not s["is_reference"] and s.get("prefill")]
    keys = list(dict.fromkeys((r["kernels"], r["kind"], r["size"]) for r in rows))
    ran = {f"{kind}:{size}" for _, kind, size in keys}
    return {"batch_size": 1, "conditions": rows,
            "by_form": [_form([r for r in rows if (r["kernels"], r["kind"], r["size"]) == key]) for key in keys],
            "not_run": [f for f in forms if not f.endswith(":auto") and f not in ran]}


def _condition(ref: dict, run: dict) -> dict:
    kind, _, size = run["prefill"].partition(":")
    size = int(size) if size.isdigit() else size  # "25%": a server's prefix of unknown length (server/prefix.py)
    return {**versus_reference(ref, run), "kind": kind, "size": size, "prompt_tokens": run.get("prompt_tokens")}


def _form(rows: list[dict]) -> dict:
    """One form and size under one kernels mode, over its prompts: the earliest divergence and counts."""
    return {
        "kernels": rows[0]["kernels"], "kind": rows[0]["kind"], "size": rows[0]["size"], "n_prompts": len(rows),
        "distinct_completions": max(r["distinct_completions"] for r in rows),
        "prompts_diverged": sum(r["first_token_divergence"] is not None for r in rows),
        "prompts_bits_differ": sum(r["first_numeric_divergence"] is not None for r in rows),
        "first_token_divergence": earliest(r["first_token_divergence"] for r in rows),
        "first_numeric_divergence": earliest(r["first_numeric_divergence"] for r in rows),
    }
