"""An SVG document in pixels: shapes and text appended in drawing order, serialised to UTF-8 bytes.

Every string that reaches the markup goes through `esc`: figure labels hold model-derived names
(module paths, op classes, completion labels), and a `<` or `&` in one must stay text. Characters
XML cannot hold (NUL, lone surrogates) are spelled as visible escapes first, as the report does.
"""

from xml.sax.saxutils import escape

from nondet.text import visible

FONT = "sans-serif"
CHAR_WIDTH = 0.6  # average glyph advance of a sans-serif face, in font sizes: errs wide, so nothing clips


def esc(text) -> str:
    """Text or an attribute value, safe inside SVG markup."""
    return escape(visible(str(text)), {'"': "&quot;", "'": "&#x27;"})


def text_width(text: str, size: float) -> float:
    """Estimated width in px of one line of text (no font metrics without a renderer)."""
    return CHAR_WIDTH * size * len(visible(text))


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _attrs(**kw) -> str:
    """key=value pairs as SVG attributes: stroke_width -> stroke-width; None values left out."""
    return "".join(f' {k.replace("_", "-")}="{_num(v) if isinstance(v, float) else esc(v)}"'
                   for k, v in kw.items() if v is not None)


class Canvas:
    def __init__(self, width: float, height: float):
        self.width, self.height = width, height
        self._defs: dict[str, str] = {}
        self._body: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str = "none", **kw) -> None:
        self._body.append(f"<rect{_attrs(x=x, y=y, width=max(w, 0.0), height=max(h, 0.0), fill=fill, **kw)}/>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#000", **kw) -> None:
        self._body.append(f"<line{_attrs(x1=x1, y1=y1, x2=x2, y2=y2, stroke=stroke, **kw)}/>")

    def polyline(self, points: list[tuple[float, float]], stroke: str, width: float = 1.0) -> None:
        pts = " ".join(f"{_num(x)},{_num(y)}" for x, y in points)
        self._body.append(f'<polyline points="{pts}"{_attrs(fill="none", stroke=stroke, stroke_width=width)}'
                          ' stroke-linejoin="round"/>')

    def circle(self, x: float, y: float, r: float, fill: str, stroke: str | None = None) -> None:
        self._body.append(f"<circle{_attrs(cx=x, cy=y, r=r, fill=fill, stroke=stroke)}/>")

    def text(self, x: float, y: float, text: str, size: float = 11.0, anchor: str = "start",
             rotate: float = 0.0, weight: str | None = None, middle: bool = True) -> None:
        """One line of text at (x, y); `middle`: y is its vertical centre, else its baseline."""
        turn = f' transform="rotate({_num(rotate)} {_num(x)} {_num(y)})"' if rotate else ""
        dy = ' dy="0.35em"' if middle else ""
        self._body.append(f"<text{_attrs(x=float(x), y=float(y), font_size=float(size), text_anchor=anchor)}"
                          f"{_attrs(font_weight=weight)}{dy}{turn}>{esc(text)}</text>")

    def hatch(self, stroke: str = "#ffffff") -> str:
        """A fill of diagonal lines (//), defined once per colour; returns its url(#...) reference."""
        pid = "hatch-" + stroke.lstrip("#")
        self._defs[pid] = (f'<pattern id="{esc(pid)}" patternUnits="userSpaceOnUse" width="7" height="7">'
                           f'<path d="M-1,1 L1,-1 M0,7 L7,0 M6,8 L8,6"{_attrs(stroke=stroke, stroke_width=1.2)}/>'
                           "</pattern>")
        return f"url(#{pid})"

    def to_bytes(self) -> bytes:
        defs = f"<defs>{''.join(self._defs.values())}</defs>\n" if self._defs else ""
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(self.width)}" height="{_num(self.height)}" '
                f'viewBox="0 0 {_num(self.width)} {_num(self.height)}" font-family="{FONT}">\n')
        background = f'<rect width="{_num(self.width)}" height="{_num(self.height)}" fill="#ffffff"/>\n'
        return (head + defs + background + "\n".join(self._body) + "\n</svg>\n").encode("utf-8")
