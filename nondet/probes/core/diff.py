"""Diff token streams against the reference: first divergences, distinct completions, branches.

Pure Python on the run-directory records (no torch), so reports and tests can use it.
A stream is a dict with "run_id", "condition_id", "position", "is_reference" and "steps"
(each step: "token", "logprob" as float.hex, "margin" as float.hex, "piece").

A stream whose finish is "stopped" (--fail-fast cut its call at its settled verdict, core/settled.py)
is known only as far as it went: its end is not a divergence, a stopped run that still agrees with
the reference counts as the reference's completion, and the branch tree follows it only that far.
"""

import math
from collections import Counter
from typing import Callable

from nondet.probes.core.settled import STOPPED
from nondet.verdict import verdict  # noqa: F401 (the summary's sentence; worded in nondet/verdict.py)

Decode = Callable[[list[int]], str]
PREFIX_CHARS = 80  # characters of shared prefix shown before a branch point


def tokens_of(stream: dict) -> tuple[int, ...]:
    return tuple(step["token"] for step in stream["steps"])


def is_stopped(stream: dict) -> bool:
    """Cut by --fail-fast before its own end (EOS or the token limit)."""
    return stream.get("finish") == STOPPED


def first_token_divergence(ref: dict, run: dict) -> int | None:
    """First step where the tokens differ (or one stream ends first, unless it was stopped there);
    None if identical as far as both go."""
    a, b = tokens_of(ref), tokens_of(run)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    shorter = run if len(b) < len(a) else ref
    return None if len(a) == len(b) or is_stopped(shorter) else min(len(a), len(b))


def completion_of(ref: dict, run: dict) -> tuple[int, ...]:
    """The completion a run counts as: its tokens, or the reference's for a stopped run that agrees
    with it as far as it went."""
    tokens = tokens_of(run)
    if is_stopped(run) and first_token_divergence(ref, run) is None:
        return tokens_of(ref)
    return tokens


def first_numeric_divergence(ref: dict, run: dict) -> int | None:
    """First step where the chosen token's logprob bits (or the token) differ. A NaN logprob is never the
    same bits as another, itself included (as NaN != NaN): the recorders refuse non-finite logits, and if one
    still reaches here, 'nan' == 'nan' must not read as a bit-identical run."""
    for i, (x, y) in enumerate(zip(ref["steps"], run["steps"])):
        if x["token"] != y["token"] or x["logprob"] != y["logprob"] or _is_nan(x["logprob"]):
            return i
    return first_token_divergence(ref, run)


def _is_nan(bits: str | None) -> bool:
    """A logprob as float.hex ('nan' for NaN) or None (the source gave none) -> is it NaN."""
    try:
        return math.isnan(float.fromhex(bits))
    except (TypeError, ValueError):  # None, or a string that is no float.hex: not a NaN
        return False


def versus_reference(ref: dict, run: dict) -> dict:
    """One run of an axis (speculative, prefill) against its prompt's reference, at batch size 1."""
    return {"condition_id": run["condition_id"], "kernels": run["kernels"], "prompt_id": run.get("prompt_id", 0),
            "run_id": run["run_id"], "reference_run_id": ref["run_id"],
            "distinct_completions": 1 if tokens_of(ref) == completion_of(ref, run) else 2,
            "first_token_divergence": first_token_divergence(ref, run),
            "first_numeric_divergence": first_numeric_divergence(ref, run)}


def references(streams: list[dict]) -> dict[tuple[str, int], dict]:
    """{(kernels, prompt_id): the reference stream} of a run directory's streams."""
    return {(s["kernels"], s.get("prompt_id", 0)): s for s in streams if s["is_reference"]}


def summarize(streams: list[dict], decode: Decode | None = None) -> dict:
    """The diff of one kernels mode's streams (the reference is the stream flagged is_reference)."""
    decode = decode or _join_pieces(streams)
    ref = next(s for s in streams if s["is_reference"])
    completion_ids = _completion_ids(streams, ref)
    runs = [_run_row(ref, s, completion_ids[completion_of(ref, s)]) for s in streams]
    counts = Counter(completion_of(ref, s) for s in streams)
    stopped = sum(is_stopped(s) for s in streams)
    return {
        "kernels": ref.get("kernels", "default"),
        "reference_run_id": ref["run_id"],
        "n_runs": len(streams),
        "n_conditions": len({s["condition_id"] for s in streams}),
        "distinct_completions": len(counts),
        "most_common_count": max(counts.values()),
        "first_token_divergence": earliest(r["first_token_divergence"] for r in runs),
        "first_numeric_divergence": earliest(r["first_numeric_divergence"] for r in runs),
        "runs": runs,
        "conditions": _condition_rows(runs),
        "completions": _completions(streams, completion_ids, counts, ref, decode),
        "branch_tree": branch_tree(streams, decode),
        **({"stopped_runs": stopped} if stopped else {}),
    }


def branch_tree(streams: list[dict], decode: Decode, start: int = 0) -> dict | None:
    """The first step >= start where these streams split, grouped by next token; recursive."""
    step = _split_step(streams, start)
    if step is None:
        return None
    groups: dict[int | None, list[dict]] = {}
    for s in _followed(streams, step):
        groups.setdefault(_token_at(s, step), []).append(s)
    alternatives = [_alternative(tok, members, step, decode)
                    for tok, members in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    prefix = decode(list(tokens_of(_followed(streams, step)[0])[:step]))
    return {"step": step, "count": len(streams), "prefix_text": prefix[-PREFIX_CHARS:],
            "alternatives": alternatives}


def _alternative(token, members: list[dict], step: int, decode: Decode) -> dict:
    first = members[0]
    has_step = step < len(first["steps"])
    return {
        "token": token,
        "piece": first["steps"][step].get("piece", "") if has_step else "<end>",
        "count": len(members),
        "margin": first["steps"][step].get("margin") if has_step else None,
        "is_reference": any(m["is_reference"] for m in members),
        "child": branch_tree(members, decode, step + 1) if has_step else None,
    }


def _split_step(streams: list[dict], start: int) -> int | None:
    longest = max(len(s["steps"]) for s in streams)
    for step in range(start, longest):
        if len({_token_at(s, step) for s in _followed(streams, step)}) > 1:
            return step
    return None


def _followed(streams: list[dict], step: int) -> list[dict]:
    """The streams known at `step`: all but those stopped before it."""
    return [s for s in streams if step < len(s["steps"]) or not is_stopped(s)]


def _token_at(stream: dict, step: int) -> int | None:
    return stream["steps"][step]["token"] if step < len(stream["steps"]) else None


def _completion_ids(streams: list[dict], ref: dict) -> dict[tuple, int]:
    counts = Counter(completion_of(ref, s) for s in streams)
    ordered = sorted(counts, key=lambda t: (t != tokens_of(ref), -counts[t]))
    return {tokens: i for i, tokens in enumerate(ordered)}


def _run_row(ref: dict, s: dict, completion_id: int) -> dict:
    return {
        "run_id": s["run_id"], "condition_id": s["condition_id"], "position": s["position"],
        "is_reference": s["is_reference"],
        **({"stopped": True} if is_stopped(s) else {}),
        "first_token_divergence": first_token_divergence(ref, s),
        "first_numeric_divergence": first_numeric_divergence(ref, s),
        "completion_id": completion_id,
    }


def _condition_rows(runs: list[dict]) -> list[dict]:
    by_condition: dict[str, list[dict]] = {}
    for r in runs:
        by_condition.setdefault(r["condition_id"], []).append(r)
    return [{
        "condition_id": cid,
        "n_runs": len(rows),
        "distinct_completions": len({r["completion_id"] for r in rows}),
        "first_token_divergence": earliest(r["first_token_divergence"] for r in rows),
        "first_numeric_divergence": earliest(r["first_numeric_divergence"] for r in rows),
    } for cid, rows in by_condition.items()]


def _completions(streams, completion_ids, counts, ref, decode) -> list[dict]:
    out = []
    for tokens, cid in sorted(completion_ids.items(), key=lambda kv: kv[1]):
        out.append({"completion_id": cid, "count": counts[tokens],
                    "is_reference": tokens == tokens_of(ref),
                    "text": decode(list(tokens)), "tokens": list(tokens)})
    return out


def earliest(values) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _join_pieces(streams: list[dict]) -> Decode:
    """Text of token ids without a tokenizer (a server's runs): a whole completion is the text its stream
    recorded (the server's own: a piece may be `token_id:N` or half a UTF-8 character), a prefix its pieces."""
    pieces = {st["token"]: st.get("piece", "") for s in streams for st in s["steps"]}
    texts = {tokens_of(s): s["text"] for s in streams if isinstance(s.get("text"), str)}
    return lambda tokens: texts.get(tuple(tokens)) or "".join(pieces.get(t, "") for t in tokens)
