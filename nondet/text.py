"""Untrusted model text made visible: one place decides how odd characters look.

Model text (token pieces, completions, prompts) may hold bytes that were not valid UTF-8
(stored as lone surrogates U+DC80..U+DCFF by "surrogateescape"), U+FFFD, control and
invisible format characters (bidi overrides, zero-width). Each becomes a visible escape such
as `\\xff`, `\\ufffd`, `\\n` or `\\u202e`. The report styles those escapes and escapes the
rest for HTML or Markdown (reports/text.py); the terminal shows the same text in quotes.
"""

import unicodedata

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(ch: str) -> str | None:
    """The visible escape for one character, or None when it shows as itself."""
    if ch in _NAMED:
        return _NAMED[ch]
    cp = ord(ch)
    if 0xDC80 <= cp <= 0xDCFF:  # surrogateescape: the original byte
        return f"\\x{cp - 0xDC00:02x}"
    if ch == "\ufffd":
        return "\\ufffd"
    if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"
    return None


def segments(text: str) -> list[tuple[str, bool]]:
    """Split text into (chunk, is_escape) runs; escapes are already spelled out."""
    out: list[tuple[str, bool]] = []
    plain: list[str] = []
    for ch in text:
        esc = _escape_char(ch)
        if esc is None:
            plain.append(ch)
            continue
        if plain:
            out.append(("".join(plain), False))
            plain = []
        out.append((esc, True))
    if plain:
        out.append(("".join(plain), False))
    return out


def visible(text: str) -> str:
    """The text with every odd character spelled as an escape (plain string)."""
    return "".join(chunk for chunk, _ in segments(text))


def quoted(text: str) -> str:
    """visible(text) in quotes, for a terminal line: ' Queens' (in double quotes when it holds a ')."""
    body = visible(text)
    quote = '"' if "'" in body and '"' not in body else "'"
    return f"{quote}{body}{quote}"


def shorten(text: str, width: int, left: bool = False) -> str:
    """Cut to `width` characters with an ellipsis (on the left when `left`)."""
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if left else text[: width - 1] + "…"
