"""Report -> one self-contained HTML file: inline CSS, figures as data: URIs, no script.

Every string is HTML-escaped here (model text additionally made visible by text.py), and a
Content-Security-Policy forbids scripts and any fetch, so a page that escaped something
wrongly still could not run or load anything.
"""

import base64
from html import escape

from nondet.reports.blocks import (BranchPoint, Code, CodeBlock, Figure, Model, Para, Report, Strong, Table,
                                   TokenDiff)
from nondet.reports.text import html_text
from nondet.text import shorten

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
:root { --fg:#1d2327; --muted:#5f6b73; --line:#d5dde3; --bg-soft:#f5f8fa; --ref:#1e8449; --alt:#c0392b; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.55em; margin: 0 0 .4em; }
h2 { font-size: 1.25em; margin: 1.8em 0 .5em; padding-bottom: .2em; border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05em; margin: 1.4em 0 .4em; }
nav { font-size: .85em; color: var(--muted); margin-bottom: 1em; }
nav a { color: var(--muted); margin-right: .9em; text-decoration: none; border-bottom: 1px dotted var(--line); }
p { margin: .5em 0; }
p.verdict { font-size: 1.2em; font-weight: 600; padding: .7em 1em; border-left: 5px solid var(--alt);
            background: #fdf2f1; border-radius: 4px; }
p.note { color: var(--muted); font-size: .92em; }
p.hint { padding: .5em .9em; background: var(--bg-soft); border: 1px dashed var(--line); border-radius: 4px; }
code, .mono, .tok, pre { font-family: ui-monospace, "SF Mono", Menlo, Consolas, "DejaVu Sans Mono", monospace;
                         font-size: .88em; }
code { background: var(--bg-soft); padding: .05em .3em; border-radius: 3px; overflow-wrap: anywhere; }
pre { background: var(--bg-soft); padding: .8em 1em; border-radius: 4px; overflow-x: auto; white-space: pre-wrap; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { border: 1px solid var(--line); padding: .3em .6em; text-align: left; vertical-align: top; }
td.wrap { overflow-wrap: anywhere; min-width: 12em; }  /* a long module path breaks instead of widening the table */
th { background: var(--bg-soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.esc { color: #8e44ad; background: #f4ecf7; border-radius: 2px; padding: 0 .1em; font-weight: 600; }
.model { white-space: pre-wrap; overflow-wrap: anywhere; }
.tok { white-space: pre-wrap; border: 1px solid #e3e8ec; border-radius: 3px; padding: 0 1px; margin: 0 1px 0 0;
       display: inline; line-height: 1.9; }
.tok.ctx { color: var(--muted); }
.tok.flip { font-weight: 700; border-width: 2px; }
.tok.flip.ref { border-color: var(--ref); background: #e9f7ef; color: var(--ref); }
.tok.flip.alt { border-color: var(--alt); background: #fdedec; color: var(--alt); }
.diff { border: 1px solid var(--line); border-radius: 6px; padding: .6em .9em; margin: .8em 0; break-inside: avoid; }
.diff table { width: 100%; margin: .4em 0; }
.diff th { width: 9em; white-space: nowrap; }
.diff .detail { font-size: .88em; color: var(--muted); }
.tree ul { list-style: none; margin: .2em 0 .2em .6em; padding-left: 1.1em; border-left: 2px solid var(--line); }
.tree li { margin: .35em 0; }
.tree .sub { margin-top: .3em; }
td code { white-space: nowrap; }
.bp-head { font-size: .9em; color: var(--muted); }
.bar { display: inline-block; height: .7em; background: #95a5a6; border-radius: 2px; vertical-align: middle;
       margin-right: .4em; min-width: 2px; }
li.ref > .bar { background: var(--ref); }
.count { font-weight: 700; }
.cont { color: var(--muted); }
figure { margin: .8em 0; break-inside: avoid; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { font-size: .88em; color: var(--muted); margin-top: .3em; }
@media print {
  body { font-size: 11pt; }
  main { max-width: none; padding: 0; }
  nav { display: none; }
  h2, h3 { break-after: avoid; }
  table, .diff, figure { break-inside: avoid; }
  .table-wrap { overflow: visible; }
}
"""


def render_html(report: Report) -> str:
    nav = " ".join(f'<a href="#{escape(s.anchor)}">{escape(s.title)}</a>' for s in report.sections if s.level == 2)
    body = "\n".join(_section(s) for s in report.sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(report.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
            f"<h1>{escape(report.title)}</h1>\n<nav>{nav}</nav>\n{body}\n</main>\n</body>\n</html>\n")


def _section(s) -> str:
    tag = f"h{s.level}"
    blocks = "\n".join(_block(b) for b in s.blocks)
    return f'<section id="{escape(s.anchor)}">\n<{tag}>{escape(s.title)}</{tag}>\n{blocks}\n</section>'


def _inline(part) -> str:
    if isinstance(part, list):
        return "".join(_inline(p) for p in part)
    if isinstance(part, Code):
        return f"<code>{escape(part.text)}</code>"
    if isinstance(part, Model):
        return f'<code class="model">{html_text(part.text)}</code>'
    if isinstance(part, Strong):
        return f"<strong>{escape(part.text)}</strong>"
    return escape(str(part))


def _block(block) -> str:
    if isinstance(block, Para):
        return f'<p class="{escape(block.kind)}">{_inline(block.parts)}</p>'
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, BranchPoint):
        return f'<div class="tree">{_branch_point(block)}</div>'
    if isinstance(block, TokenDiff):
        return _token_diff(block)
    if isinstance(block, Figure):
        # an <img>, not inline <svg>: the figure stays its own document (no shared ids or CSS), and an
        # SVG loaded as an image runs no script and fetches nothing, whatever a label in it held
        data = base64.b64encode(block.svg).decode("ascii")
        return (f'<figure><img src="data:image/svg+xml;base64,{data}" alt="{escape(block.alt)}">'
                f"<figcaption>{_inline(block.caption)}</figcaption></figure>")
    if isinstance(block, CodeBlock):
        return f"<pre>{escape(chr(10).join(block.lines))}</pre>"
    raise TypeError(f"no HTML for {type(block).__name__}")


def _table(t: Table) -> str:
    numeric = t.numeric or [False] * len(t.header)
    head = "".join(f"<th>{escape(h)}</th>" for h in t.header)
    wrap = t.wrap or [False] * len(t.header)
    cls = [" class=num" if n else " class=wrap" if w else "" for n, w in zip(numeric, wrap)]
    rows = "".join("<tr>" + "".join(f"<td{c}>{_inline(cell)}</td>" for cell, c in zip(row, cls)) + "</tr>\n"
                   for row in t.rows)
    return f'<div class="table-wrap"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}</tbody></table></div>'


def _tok(piece: str, cls: str = "") -> str:
    return f'<span class="tok{" " + cls if cls else ""}">{html_text(piece)}</span>'


def _branch_point(p: BranchPoint) -> str:
    head = (f'<span class="bp-head">step {p.step} · {p.count} runs · after</span> '
            f'<code class="model">{html_text(shorten(p.prefix, 80, left=True))}</code>')
    items = []
    for a in p.alternatives:
        cls = "ref" if a.is_reference else "alt"
        width = max(2.0, 120 * a.share)
        ref = " · reference" if a.is_reference else ""
        child = f'<div class="sub">{_branch_point(a.child)}</div>' if a.child is not None else ""
        items.append(f'<li class="{cls}"><span class="bar" style="width:{width:.0f}px"></span>'
                     f'{_tok(a.piece, "flip " + cls)} <span class="count">× {a.count}</span> '
                     f"({a.share:.0%}{ref}) · margin {escape(a.margin)} · "
                     f'<span class="cont">then </span><code class="model cont">{html_text(shorten(a.continuation, 60))}'
                     f"</code>{child}</li>")
    return f"{head}<ul>{''.join(items)}</ul>"


def _token_diff(d: TokenDiff) -> str:
    lead = '<span class="tok ctx">…</span>' if d.cut_before else ""
    before = lead + "".join(_tok(p, "ctx") for p in d.before)
    rows = []
    for label, after, cls in ((d.ref_label, d.ref_after, "ref"), (d.alt_label, d.alt_after, "alt")):
        flip = _tok(after[0], "flip " + cls) if after else '<span class="tok flip">(ended)</span>'
        rest = "".join(_tok(p) for p in after[1:])
        rows.append(f"<tr><th>{escape(label)}</th><td>{before}{flip}{rest}</td></tr>")
    return (f'<div class="diff"><p>{_inline(d.title)}</p><table>{"".join(rows)}</table>'
            f'<p class="detail">{_inline(d.detail)}</p></div>')
