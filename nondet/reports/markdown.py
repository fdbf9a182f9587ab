"""Report -> GitHub-flavoured Markdown (PR comment, CI step summary); figures as files beside it.

Untrusted model text only ever appears inside code spans (literal: no HTML, no emphasis),
with odd characters spelled as escapes (see text.py).
"""

import re

from nondet.reports.blocks import (BranchPoint, Code, CodeBlock, Figure, Model, Para, Report, Strong, Table,
                                   TokenDiff)
from nondet.reports.text import md_code, md_plain
from nondet.rundir.files import FIGURES
from nondet.text import shorten


def render_markdown(report: Report, figure_dir: str = FIGURES) -> str:
    out = [f"# {md_plain(report.title)}", ""]
    for section in report.sections:
        out += [f"{'#' * section.level} {md_plain(section.title)}", ""]
        for block in section.blocks:
            out += _block(block, figure_dir) + [""]
    return "\n".join(out).rstrip() + "\n"


def _inline(part, in_table: bool = False) -> str:
    if isinstance(part, list):
        return "".join(_inline(p, in_table) for p in part)
    if isinstance(part, (Code, Model)):
        return md_code(part.text, in_table)
    if isinstance(part, Strong):
        return f"**{md_plain(part.text, in_table)}**"
    return md_plain(str(part), in_table)


def _block(block, figure_dir: str) -> list[str]:
    if isinstance(block, Para):
        text = _inline(block.parts)
        return [f"**{text}**" if block.kind == "verdict" else text]
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, BranchPoint):
        return _branch_point(block, 0)
    if isinstance(block, TokenDiff):
        return _token_diff(block)
    if isinstance(block, Figure):
        return [f"![{md_plain(block.alt)}]({figure_dir}/{block.name})", "", _inline(block.caption)]
    if isinstance(block, CodeBlock):
        body = "\n".join(block.lines)
        fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", body)), default=0))
        return [f"{fence}sh", body, fence]
    raise TypeError(f"no Markdown for {type(block).__name__}")


def _table(t: Table) -> list[str]:
    numeric = t.numeric or [False] * len(t.header)
    lines = ["| " + " | ".join(md_plain(h, True) for h in t.header) + " |",
             "| " + " | ".join("---:" if n else "---" for n in numeric) + " |"]
    lines += ["| " + " | ".join(_inline(c, True) for c in row) + " |" for row in t.rows]
    return lines


def _branch_point(p: BranchPoint, depth: int) -> list[str]:
    pad = "  " * depth
    lines = [f"{pad}- step {p.step}, {p.count} runs, after {md_code(shorten(p.prefix, 60, left=True))}"]
    for a in p.alternatives:
        ref = ", reference" if a.is_reference else ""
        lines.append(f"{pad}  - {md_code(a.piece)} × {a.count} ({a.share:.0%}{ref}), margin {md_plain(a.margin)}, "
                     f"then {md_code(shorten(a.continuation, 50))}")
        if a.child is not None:
            lines += _branch_point(a.child, depth + 2)
    return lines


def _token_diff(d: TokenDiff) -> list[str]:
    before = ("…" if d.cut_before else "") + "".join(d.before)
    head = f"| | before | step {d.step} | after |"
    rows = [f"| {label} | {md_code(before, True)} | **{md_code(after[0] if after else '', True)}** | "
            f"{md_code(''.join(after[1:]), True)} |"
            for label, after in ((d.ref_label, d.ref_after), (d.alt_label, d.alt_after))]
    return [_inline(d.title), "", head, "| --- | ---: | --- | --- |", *rows, "", _inline(d.detail)]
