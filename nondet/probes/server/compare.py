"""Turn a server's completion into diffable steps, at the best level the answers allow.

- "logprobs": the server returned per-token logprobs. One step per server token; its id is
  token_id's: from what the server says identifies the token (its bytes, its id, its piece).
  `logprob` is the server's value, stored exactly;
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


def steps_at(level: str, text: str, tokens: list | None, tokenizer, ids: list | None = None) -> list[dict]:
    """ids: per token [its id, [its tops' ids]] as responses.py reads them; None: ids from the pieces."""
    if level == "logprobs":
        ids = ids or [[piece_id(t[0]), [piece_id(p) for p, _ in t[2]]] for t in tokens]
        return [_logprob_step(piece, value, top, i) for (piece, value, top), i in zip(tokens, ids)]
    if level == "tokenizer":
        from nondet.probes.core.pieces import token_piece

        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [_plain_step(i, token_piece(tokenizer, i)) for i in ids]
    return [_plain_step(piece_id(w), w) for w in _WORDS.findall(text)]


def token_id(piece: str, raw: bytes | None = None, server_id: int | None = None) -> int:
    """A server token's id, from what the server says identifies it. Byte-fallback tokens (Llama-2, Mistral)
    all read "\ufffd" as pieces, so the piece alone would make different tokens one.
    - "token_id:N": N (vLLM's return_tokens_as_token_ids; any bytes given are those of the label);
    - bytes where given: hashed as a piece's UTF-8 is, so the same token keeps one id whether a server
      sends its bytes or not (--against across engines);
    - the server's id where the piece lost the token's bytes ("\ufffd" in it): ids are per tokenizer, so
      only where the piece says nothing (llama.cpp sends bytes beside its ids anyway);
    - else the piece."""
    if piece.startswith("token_id:") and piece[9:].isdigit():
        return int(piece[9:])
    if raw is not None:
        return _hash(raw)
    if server_id is not None and "\ufffd" in piece:
        return server_id
    return piece_id(piece)


def piece_id(piece: str) -> int:
    if piece.startswith("token_id:") and piece[9:].isdigit():
        return int(piece[9:])
    return _hash(piece.encode("utf-8", "surrogatepass"))


def _hash(raw: bytes) -> int:
    """A stable 31-bit id of a token's bytes."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=4).digest(), "big") >> 1


def _logprob_step(piece: str, value: float | None, top: list, ids: list) -> dict:
    margin = top[0][1] - top[1][1] if len(top) >= 2 else None
    return {"token": ids[0], "piece": piece, "logprob": _hex(value),
            "top": [[i, _hex(v)] for (_, v), i in zip(top, ids[1])], "margin": _hex(margin)}


def _plain_step(token: int, piece: str) -> dict:
    return {"token": token, "piece": piece, "logprob": None, "top": [], "margin": None}


def _hex(value: float | None) -> str | None:
    return None if value is None else float(value).hex()
