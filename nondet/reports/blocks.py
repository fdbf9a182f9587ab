"""The report as data: sections of blocks that the Markdown and HTML renderers both draw.

Inline pieces: a plain `str` (trusted prose), `Code` (a command or identifier), `Model`
(untrusted model text: always escaped), `Strong`. A cell or paragraph is a list of them.
"""

from dataclasses import dataclass, field


@dataclass
class Code:
    text: str  # trusted: commands, module paths, condition ids


@dataclass
class Model:
    text: str  # untrusted model text: escaped and made visible by every renderer


@dataclass
class Strong:
    text: str


Inline = str | Code | Model | Strong


@dataclass
class Para:
    parts: list  # of Inline
    kind: str = "p"  # "p", "verdict", "note", "hint" (an absent section: how to produce it)


@dataclass
class Table:
    header: list[str]
    rows: list[list]  # each cell: an Inline or a list of Inline
    numeric: list[bool] = field(default_factory=list)  # right-align these columns
    wrap: list[bool] = field(default_factory=list)  # HTML: these columns may break long words (module paths)


@dataclass
class Branch:
    """One alternative at a branch point of the tree."""

    piece: str  # untrusted
    count: int
    share: float  # of the runs reaching this branch point
    is_reference: bool
    margin: str  # formatted
    continuation: str  # untrusted: the text right after this piece
    child: "BranchPoint | None" = None


@dataclass
class BranchPoint:
    step: int
    count: int
    prefix: str  # untrusted: the text right before the split
    alternatives: list[Branch]


@dataclass
class TokenDiff:
    """The reference against one divergent completion, aligned at the first differing step."""

    title: list  # of Inline
    step: int
    before: list[str]  # shared pieces before the split (untrusted)
    ref_after: list[str]  # reference pieces from the split on; [0] is the flipped one
    alt_after: list[str]
    ref_label: str
    alt_label: str
    detail: list  # of Inline: margins and logprobs at the split
    cut_before: bool  # earlier shared tokens were left out


@dataclass
class Figure:
    name: str  # file name under figures/
    svg: bytes  # UTF-8 SVG text
    alt: str
    caption: list  # of Inline


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list = field(default_factory=list)
    level: int = 2


@dataclass
class Report:
    title: str
    sections: list[Section]


@dataclass
class CodeBlock:
    lines: list[str]  # trusted shell commands, one per line


def figure_or_hint(name: str, svg: bytes | None, alt: str, caption: list, hint: list) -> list:
    """The figure when there is data for it, else one line saying how to produce it."""
    return [Figure(name, svg, alt, caption)] if svg else [Para(hint, kind="hint")]
