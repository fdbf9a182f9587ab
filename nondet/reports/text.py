"""Untrusted model text safe in HTML and Markdown; how odd characters look is decided
in nondet/text.py (escapes such as `\\xff`), which the terminal uses too."""

import html
import re

from nondet.text import segments, visible


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
