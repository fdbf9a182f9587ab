"""A several-prompt run's merged summary, split back into one mode dict per prompt.

probes/core/diff_prompts.py merges every prompt's diff into one mode (runs, completions and
conditions concatenated, completion ids renumbered). The gate judges each prompt against its
own reference, so it splits the merge here. Pure Python on summary dicts.
"""


def per_prompt(mode: dict) -> list[dict]:
    """A merged several-prompt mode (probes/core/diff_prompts.py) as one mode dict per prompt, each
    with its own reference, completions (ids counted from 0 again) and branch tree, so every
    requirement judges a prompt against itself alone. A one-prompt mode is returned as it is."""
    prompts = mode.get("prompts") or []
    if len(prompts) <= 1:
        return [mode]
    return [_one_prompt(mode, p) for p in prompts]


def _one_prompt(mode: dict, prompt: dict) -> dict:
    pid = prompt["prompt_id"]
    completions = [c for c in mode["completions"] if c.get("prompt_id") == pid]
    offset = min((c["completion_id"] for c in completions), default=0)
    label = f"prompt {pid}" + (f" ({prompt['prompt'][:40]!r})" if prompt.get("prompt") else "")
    return {**mode, "prompt_label": label,
            "runs": [{**r, "completion_id": r["completion_id"] - offset}
                     for r in mode["runs"] if r.get("prompt_id") == pid],
            "completions": [{**c, "completion_id": c["completion_id"] - offset} for c in completions],
            **{key: prompt[key] for key in ("reference_run_id", "branch_tree", "distinct_completions")}}
