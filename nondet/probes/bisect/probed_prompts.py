"""A probe run's prompts and fillers as its probe tokenized them, for bisect's replay.

Plain text is tokenized with the BOS the tokenizer adds (core/chat.py prompt_ids); a run directory
probed before that change was tokenized without special tokens. Its config.json holds the texts only,
but streams.jsonl records each stream's `prompt_tokens`, so the replay needs no guess: every prompt's
ids now are compared with that count. Equal: the texts are replayed as they are. One fewer for each
plain prompt whose ids now begin with the tokenizer's BOS (chat-formatted ones equal): the run predates
the BOS, and its prompts and fillers are replayed without special tokens, as that probe fed them. Any
other count: another tokenizer than the probe's, whose replay would not be the probe's input, so bisect
stops with one line (RunDirError, exit 4). A stream without `prompt_tokens` is not checked.
"""

from nondet.errors import RunDirError
from nondet.probes.core.chat import TemplatedText, prompt_ids
from nondet.rundir.files import STREAMS


class ProbedWithoutBos(TemplatedText):
    """Plain text of a run probed before plain prompts got their BOS: tokenized, as then, without special tokens."""


def as_probed(tokenizer, texts: list[str], fillers: list[str], streams: list[dict]) -> tuple[list[str], list[str]]:
    """(texts, fillers) whose ids have the count streams.jsonl records for every prompt; RunDirError where none do."""
    recorded = sorted({(s.get("prompt_id", 0), s["prompt_tokens"]) for s in streams
                       if s.get("prompt_tokens") is not None})
    now = {k: prompt_ids(tokenizer, texts[k]) for k, _ in recorded}
    if all(len(now[k]) == n for k, n in recorded):
        return texts, fillers
    before = [t if isinstance(t, TemplatedText) else ProbedWithoutBos(t) for t in texts]
    if all(_bos_dropped(tokenizer, now[k], prompt_ids(tokenizer, before[k]), n) for k, n in recorded):
        return before, [ProbedWithoutBos(f) for f in fillers]
    k, n = next((k, n) for k, n in recorded if len(now[k]) != n)
    raise RunDirError(f"{STREAMS} records prompt {k} as {n} tokens and the model's tokenizer gives it {len(now[k])} "
                      "now: not the tokenizer the probe ran with, so bisect cannot replay the probe's input; rerun "
                      "`nondet probe` with this model and bisect that run")


def _bos_dropped(tokenizer, now: list[int], before: list[int], count: int) -> bool:
    """The ids without special tokens have the recorded count and are the ids now, less a leading BOS (or equal)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return len(before) == count and (before == now or (bos is not None and now == [bos, *before]))
