"""Turn a server's completion into diffable steps, at the best level the answers allow.

- "logprobs": the server returned per-token logprobs. One step per server token; its id is
  the server's token id when the piece reads "token_id:N" (vLLM's return_tokens_as_token_ids),
  otherwise a stable 31-bit hash of the piece. `logprob` is the server's value, stored exactly;
  `margin` is top1 - top2 logprob, which equals the logit margin.
- "tokenizer": text only, tokenized here with the tokenizer given by --tokenizer.
- "text": text only, no tokenizer: one step per word (a run of non-space characters with the
  whitespace before it), ids hashed from the word. Branch points are then word positions.
A probe compares all its runs at one level: the lowest any of its answers allows.
"""

import hashlib
import re

LEVELS = ("logprobs", "tokenizer", "text")  # best first
_WORDS = re.compile(r"\s*\S+|\s+")


def level_of(tokens: list | None, tokenizer) -> str:
    if tokens is not None:
        return "logprobs"
    return "tokenizer" if tokenizer is not None else "text"


def lowest(levels) -> str:
    return max(levels, key=LEVELS.index)


def steps_at(level: str, text: str, tokens: list | None, tokenizer) -> list[dict]:
    if level == "logprobs":
        return [_logprob_step(piece, value, top) for piece, value, top in tokens]
    if level == "tokenizer":
        from nondet.probes.core.pieces import token_piece

        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [_plain_step(i, token_piece(tokenizer, i)) for i in ids]
    return [_plain_step(piece_id(w), w) for w in _WORDS.findall(text)]


def piece_id(piece: str) -> int:
    if piece.startswith("token_id:") and piece[9:].isdigit():
        return int(piece[9:])
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


def _logprob_step(piece: str, value: float | None, top: list) -> dict:
    margin = top[0][1] - top[1][1] if len(top) >= 2 else None
    return {"token": piece_id(piece), "piece": piece, "logprob": _hex(value),
            "top": [[piece_id(p), _hex(v)] for p, v in top], "margin": _hex(margin)}


def _plain_step(token: int, piece: str) -> dict:
    return {"token": token, "piece": piece, "logprob": None, "top": [], "margin": None}


def _hex(value: float | None) -> str | None:
    return None if value is None else float(value).hex()
