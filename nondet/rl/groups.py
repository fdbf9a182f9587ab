"""GRPO-style sample groups of a `nondet rl` run: the sampler streams that share one prompt.

GRPO scores each sample against the others of its group (same prompt): when every sample of a
group is the same completion, each gets the group's mean reward, every advantage is 0 and the
group teaches nothing. That is what a deterministic setup gives when every request gets one
default seed (SGLang issue 15481: seeds ignored on /v1/completions). A group is two or more
sampler streams of one kernels mode with the same prompt token ids (a prompt repeated in
--prompts, rollouts of one prompt, or repeated requests to --endpoint); a prompt sampled once
is no group.

    {"groups": [GROUP, ...], "identical_groups": 1}
    GROUP = {"kernels": "external", "prompt": "Tell me about ...", "prompt_ids": [0, 2, 5],
             "size": 3, "distinct": 1, "identical": true}

"prompt" is the prompt's first 60 characters, or its first token ids where the run has no
text (--rollouts); "prompt_ids" are the streams' prompt_id (line of --prompts or --rollouts).
Pure Python: the summary, the CLI and the report read it without torch.
"""

PROMPT_CHARS = 60  # enough to tell prompts apart in a terminal line or a table cell


def sample_groups(streams: list[dict], prompts=()) -> dict:
    """Groups of >= 2 sampler streams per (kernels, prompt token ids), from on-disk stream dicts.

    prompts: the run's prompt set (config's "prompts", indexed by prompt_id); empty for rollouts."""
    members: dict[tuple, list[dict]] = {}
    for s in streams:
        if s.get("side") == "sampler":
            members.setdefault((s["kernels"], tuple(s["prompt_ids"])), []).append(s)
    groups = [_group(kernels, ids, of, prompts) for (kernels, ids), of in members.items() if len(of) >= 2]
    return {"groups": groups, "identical_groups": sum(g["identical"] for g in groups)}


def _group(kernels: str, token_ids: tuple, streams: list[dict], prompts) -> dict:
    completions = {tuple(st["token"] for st in s["steps"]) for s in streams}
    first = min(s["prompt_id"] for s in streams)
    return {"kernels": kernels, "prompt": prompt_label(prompts, first, token_ids),
            "prompt_ids": sorted(s["prompt_id"] for s in streams), "size": len(streams),
            "distinct": len(completions), "identical": len(completions) == 1}


def prompt_label(prompts, prompt_id: int, token_ids: tuple) -> str:
    """The prompt's first characters; its first token ids when the run holds no text for it."""
    if prompt_id < len(prompts or ()):
        return _text(prompts[prompt_id])[:PROMPT_CHARS]
    shown = ", ".join(map(str, token_ids))
    return f"token ids [{shown[:PROMPT_CHARS]}{'...' if len(shown) > PROMPT_CHARS else ''}]"


def _text(prompt) -> str:
    """Plain text as it is; a chat (config.json's {"messages": [...]}) as its "role: content" turns."""
    if isinstance(prompt, dict):
        return " | ".join(f"{m['role']}: {m['content']}" for m in prompt.get("messages", ()))
    return str(prompt)


def warning(rl: dict) -> str | None:
    """One line when a group's samples are all identical, from summary.json's "rl" (None when none is)."""
    groups = (rl.get("sample_groups") or {}).get("groups", [])
    flagged = [g for g in groups if g["identical"]]
    if not flagged:
        return None
    big = max(flagged, key=lambda g: g["size"])
    # top-k 1 is greedy: identical samples are expected there, not a seeding bug
    greedy = (rl.get("processing") or {}).get("top_k") == 1
    cause = "--top-k 1 is greedy" if greedy else "the requests likely share one seed"
    return (f"{len(flagged)} of {len(groups)} sample groups: every sample identical ({big['size']} samples of one "
            f"prompt gave 1 completion); {cause}; GRPO's advantage is 0 for such a group")
