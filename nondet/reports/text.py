"""Untrusted model text made visible and safe: one place decides how odd characters look.

Model text (token pieces, completions) may hold bytes that were not valid UTF-8 (stored as
lone surrogates U+DC80..U+DCFF by "surrogateescape"), U+FFFD, control and invisible
format characters (bidi overrides, zero-width). Each becomes a visible escape such as
`\\xff`, `\\ufffd`, `\\n` or `\\u202e`; renderers style those escapes and HTML-escape the rest.
"""

import html
import re
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


def html_text(text: str) -> str:
    """HTML for untrusted text: escaped, with escapes wrapped in <span class="esc">."""
    parts = []
    for chunk, is_esc in segments(text):
        body = html.escape(chunk, quote=True)
        parts.append(f'<span class="esc">{body}</span>' if is_esc else body)
    return "".join(parts)


def md_code(text: str, in_table: bool = False) -> str:
    """A Markdown code span holding untrusted text literally (no HTML, no emphasis)."""
    body = visible(text)
    if in_table:
        body = body.replace("|", "\\|")
    if not body:
        return "`∅`"
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body[0] in "` " or body[-1] in "` " else ""
    if pad and body.strip(" ") == "":
        body = body.replace(" ", "␠")
        pad = ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_plain(text: str, in_table: bool = False) -> str:
    """Markdown for trusted plain text: neutralise HTML and, in tables, pipes."""
    body = html.escape(visible(text), quote=False)
    return body.replace("|", "\\|") if in_table else body


def shorten(text: str, width: int, left: bool = False) -> str:
    """Cut to `width` characters with an ellipsis (on the left when `left`)."""
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if left else text[: width - 1] + "…"
