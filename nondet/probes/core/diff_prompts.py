"""Several target prompts in one run: each is diffed against itself alone, then merged.

The merged summary has the shape of one prompt's (diff.summarize), so the report, the
gate and bisect read it the same way:
- runs, conditions and completions are concatenated; completion ids are renumbered to stay
  unique, and each completion carries its prompt_id; a condition holding several prompts
  (every row a target) is one row: its runs summed, its distinct completions the worst
  prompt's, its divergences the earliest;
- distinct_completions is the worst prompt's count, so "1" still means every prompt gave
  one completion under every condition (the sum would count the prompts themselves);
- first divergences are the earliest over prompts; the branch tree is that of the prompt
  whose tokens split first;
- `prompts` keeps each prompt's own figures and branch tree.
"""

from nondet.probes.core.diff import earliest
from nondet.prompt import Prompt
from nondet.prompt import record as prompt_record

PER_PROMPT_KEYS = ("n_runs", "distinct_completions", "first_token_divergence", "first_numeric_divergence",
                   "reference_run_id", "branch_tree")


def merge_prompts(summaries: list[dict], prompt_ids: list[int], texts: tuple[Prompt, ...] = ()) -> dict:
    """One mode's summary over several prompts; summaries[i] is prompt prompt_ids[i] alone,
    texts[prompt_id] its prompt (its text shown in tables, a chat's messages kept; empty when unknown)."""
    runs, completions = [], []
    for prompt_id, s in zip(prompt_ids, summaries):
        offset = len(completions)
        runs += [{**r, "prompt_id": prompt_id, "completion_id": r["completion_id"] + offset} for r in s["runs"]]
        completions += [{**c, "prompt_id": prompt_id, "completion_id": c["completion_id"] + offset}
                        for c in s["completions"]]
    first_split = _first_split(summaries)
    conditions = _merge_conditions([c for s in summaries for c in s["conditions"]])
    stopped = sum(s.get("stopped_runs", 0) for s in summaries)
    return {
        **({"stopped_runs": stopped} if stopped else {}),
        "kernels": summaries[0]["kernels"],
        "reference_run_id": summaries[0]["reference_run_id"],
        "n_prompts": len(summaries),
        "prompts_diverged": sum(s["distinct_completions"] > 1 for s in summaries),
        "prompts_bits_differ": sum(s["first_numeric_divergence"] is not None for s in summaries),
        "n_runs": sum(s["n_runs"] for s in summaries),
        "n_conditions": len(conditions),  # a batch holding several prompts counts once
        "distinct_completions": max(s["distinct_completions"] for s in summaries),
        "most_common_count": max(s["most_common_count"] for s in summaries),
        "first_token_divergence": earliest(s["first_token_divergence"] for s in summaries),
        "first_numeric_divergence": earliest(s["first_numeric_divergence"] for s in summaries),
        "runs": runs,
        "conditions": conditions,
        "completions": completions,
        "branch_tree": first_split["branch_tree"] if first_split else None,
        "branch_prompt_id": prompt_ids[summaries.index(first_split)] if first_split else None,
        "prompts": [{"prompt_id": k, **prompt_record(texts[k] if k < len(texts) else ""),
                     **{key: s[key] for key in PER_PROMPT_KEYS}}
                    for k, s in zip(prompt_ids, summaries)],
    }


def _first_split(summaries: list[dict]) -> dict | None:
    """The summary of the prompt whose tokens diverge earliest (None if none diverges)."""
    split = [s for s in summaries if s["first_token_divergence"] is not None]
    return min(split, key=lambda s: s["first_token_divergence"]) if split else None


def _merge_conditions(rows: list[dict]) -> list[dict]:
    """One row per condition id, in order of first appearance (a batch of several prompts shows
    up in each of its prompts' summaries)."""
    merged: dict[str, dict] = {}
    for c in rows:
        m = merged.get(c["condition_id"])
        merged[c["condition_id"]] = dict(c) if m is None else {
            **m, "n_runs": m["n_runs"] + c["n_runs"],
            "distinct_completions": max(m["distinct_completions"], c["distinct_completions"]),
            "first_token_divergence": earliest((m["first_token_divergence"], c["first_token_divergence"])),
            "first_numeric_divergence": earliest((m["first_numeric_divergence"], c["first_numeric_divergence"]))}
    return list(merged.values())
