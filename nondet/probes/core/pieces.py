"""Decode one token to the text it stands for, keeping bytes that are not valid UTF-8 visible.

A byte-level BPE token can be half of a multi-byte character; `tokenizer.decode([id])` turns
that into U+FFFD and the bytes are lost. Here such bytes survive as lone surrogates
("surrogateescape"), which the run directory stores exactly and reports render as `\\xNN`.
"""

import functools
import re

_SENTENCEPIECE_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-character table, inverted (char -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_piece(tokenizer, token_id: int) -> str:
    """The token's text; undecodable bytes as surrogate escapes, never U+FFFD."""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    raw = _token_bytes(tokenizer.convert_ids_to_tokens(token_id))
    return text if raw is None else raw.decode("utf-8", errors="surrogateescape")


def _token_bytes(token: str | None) -> bytes | None:
    if token is None:
        return None
    match = _SENTENCEPIECE_BYTE.match(token)
    if match:
        return bytes([int(match.group(1), 16)])
    table = _byte_level_decoder()
    if all(ch in table for ch in token):
        return bytes(table[ch] for ch in token)
    return None
