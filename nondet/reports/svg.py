"""Plot panels on an SVG canvas: a box with x and y scales, its frame, ticks, labels, title and
legend, and the marks the report's figures draw in data coordinates (bars, lines, markers, heatmap
cells). Figures lay out a panel with `plot_box`, which leaves room for the labels it will hold.

    canvas = Canvas(840, 384)
    box = plot_box(Box(0, 0, 840, 384), ytick_labels=["0", "10"], xlabel=True, ylabel=True, title=True)
    panel = Panel(canvas, box, Linear(0, 5), Linear(0, 10))
    panel.bar(1, 7, 0.8, fill="#c0392b"); panel.frame(...); canvas.to_bytes()
"""

import math
from dataclasses import dataclass

from nondet.reports.colormaps import colour_at
from nondet.reports.svg_axes import Linear
from nondet.reports.svg_canvas import Canvas, text_width
from nondet.text import shorten

TICK, LABEL, TITLE, LEGEND = 11.0, 12.0, 13.0, 10.5  # font sizes, px
PAD, TICK_LEN = 6.0, 4.0
INK, GRID = "#333333", "#555555"
SWATCH = 18.0  # legend: the width of a colour sample
TICK_CHARS = 36  # a longer tick label (a condition id, a module path) keeps its end: the plot keeps its width


@dataclass(frozen=True)
class Box:
    left: float
    top: float
    right: float
    bottom: float

    @property
    def width(self) -> float:
        return self.right - self.left

    @property
    def height(self) -> float:
        return self.bottom - self.top


@dataclass(frozen=True)
class Key:
    """One legend row: kind "box" (a bar's colour), "line" (with an optional marker) or "marker"."""

    label: str
    colour: str
    kind: str = "box"
    marker: str | None = None
    hatch: bool = False


def tick_label(text: str) -> str:
    return shorten(text, TICK_CHARS, left=True)


def legend_width(keys: list[Key]) -> float:
    return SWATCH + 6 + max((text_width(k.label, LEGEND) for k in keys), default=0)


def rotated_height(labels: list[str], degrees: float, size: float = TICK) -> float:
    """How far x tick labels turned by `degrees` reach below the axis."""
    a = math.radians(abs(degrees))
    return max((text_width(tick_label(s), size) * math.sin(a) + size * math.cos(a) for s in labels), default=size)


def plot_box(region: Box, *, ytick_labels: list[str], xtick_labels: list[str] = (), xrotate: float = 0.0,
             xlabel: bool = False, ylabel: bool = False, title: bool = False, right: float = 0.0) -> Box:
    """The plot area inside `region` that leaves room for tick labels, axis labels, the title, and
    `right` px of anything beside the plot (a legend, a colorbar)."""
    tick_w = max((text_width(tick_label(s), TICK) for s in ytick_labels), default=0)
    below = rotated_height(list(xtick_labels), xrotate) if xrotate else TICK
    return Box(left=region.left + PAD + (LABEL + PAD if ylabel else 0) + tick_w + TICK_LEN + 4,
               top=region.top + PAD + (TITLE + 2 * PAD if title else 0),
               right=region.right - 2 * PAD - right,
               bottom=region.bottom - PAD - (LABEL + PAD if xlabel else 0) - below - TICK_LEN - 4)


class Panel:
    """One plot: `x` and `y` scales over `box`; `flip_y` puts y's low end at the top (rows of a table)."""

    def __init__(self, canvas: Canvas, box: Box, x, y, flip_y: bool = False):
        self.canvas, self.box, self.x, self.y, self.flip_y = canvas, box, x, y, flip_y

    def px(self, v: float) -> float:
        return self.box.left + self.x.frac(v) * self.box.width

    def py(self, v: float) -> float:
        f = self.y.frac(v)
        return self.box.top + f * self.box.height if self.flip_y else self.box.bottom - f * self.box.height

    # -- marks ------------------------------------------------------------------------------

    def bar(self, x: float, height: float, width: float, fill: str, bottom: float = 0.0, hatch: bool = False,
            edge: str = "#ffffff", opacity: float | None = None) -> None:
        """A vertical bar centred on x from `bottom` to `bottom + height` (stack by raising bottom)."""
        left, right = self.px(x - width / 2), self.px(x + width / 2)
        top, base = sorted((self.py(bottom + height), self.py(bottom)))
        self.canvas.rect(left, top, right - left, base - top, fill, stroke=edge, fill_opacity=opacity)
        if hatch:
            self.canvas.rect(left, top, right - left, base - top, self.canvas.hatch(edge))

    def barh(self, y: float, length: float, height: float, fill: str) -> None:
        """A horizontal bar centred on y from 0 to `length`."""
        top, base = sorted((self.py(y - height / 2), self.py(y + height / 2)))
        self.canvas.rect(self.px(0), top, self.px(length) - self.px(0), base - top, fill)

    def line(self, xs, ys, colour: str, width: float = 1.5, marker: str | None = None) -> None:
        points = [(self.px(a), self.py(b)) for a, b in zip(xs, ys)]
        self.canvas.polyline(points, colour, width)
        for a, b in zip(xs, ys) if marker else ():
            self.marker(a, b, marker, colour)

    def marker(self, x: float, y: float, kind: str, colour: str) -> None:
        draw_marker(self.canvas, self.px(x), self.py(y), kind, colour)

    def cell(self, col: int, row: int, fill: str) -> None:
        """The unit square centred on (col, row): a heatmap cell."""
        self.canvas.rect(self.px(col - 0.5), self.py(row - 0.5), self.px(col + 0.5) - self.px(col - 0.5),
                         self.py(row + 0.5) - self.py(row - 0.5), fill)

    def outline(self, x0: float, y0: float, x1: float, y1: float, colour: str, width: float = 2.5) -> None:
        (left, right), (top, bottom) = sorted((self.px(x0), self.px(x1))), sorted((self.py(y0), self.py(y1)))
        self.canvas.rect(left, top, right - left, bottom - top, stroke=colour, stroke_width=width)

    def vline(self, x: float, note: str = "") -> None:
        """A dashed vertical line across the plot, its note left of it near the top."""
        at = self.px(x)
        self.canvas.line(at, self.box.top, at, self.box.bottom, GRID, stroke_dasharray="5 3")
        if note:
            self.canvas.text(at - 4, self.box.top + TICK, note, TICK, anchor="end")

    def note(self, x: float, y: float, text: str, dy: float = 0.0, dx: float = 0.0, anchor: str = "middle") -> None:
        """Text at a data point, moved by (dx, dy) px (a number on top of a bar: dy < 0)."""
        self.canvas.text(self.px(x) + dx, self.py(y) + dy, text, TICK, anchor=anchor)

    # -- axes ---------------------------------------------------------------------------------

    def frame(self, xticks: list[tuple[float, str]], yticks: list[tuple[float, str]], xlabel: str = "",
              ylabel: str = "", title: str = "", xrotate: float = 0.0) -> None:
        """The box's outline, outward ticks with their labels, the axis labels and the title."""
        b, c = self.box, self.canvas
        xticks, yticks = [(v, tick_label(s)) for v, s in xticks], [(v, tick_label(s)) for v, s in yticks]
        c.rect(b.left, b.top, b.width, b.height, stroke=INK)
        for v, s in xticks:
            c.line(self.px(v), b.bottom, self.px(v), b.bottom + TICK_LEN, INK)
            if xrotate:
                c.text(self.px(v) + 3, b.bottom + TICK_LEN + 6, s, TICK, anchor="end", rotate=xrotate)
            else:
                c.text(self.px(v), b.bottom + TICK_LEN + 4 + TICK / 2, s, TICK, anchor="middle")
        for v, s in yticks:
            c.line(b.left - TICK_LEN, self.py(v), b.left, self.py(v), INK)
            c.text(b.left - TICK_LEN - 3, self.py(v), s, TICK, anchor="end")
        below = rotated_height([s for _, s in xticks], xrotate) if xrotate else TICK
        if xlabel:
            c.text((b.left + b.right) / 2, b.bottom + TICK_LEN + 4 + below + PAD + LABEL / 2, xlabel, LABEL,
                   anchor="middle")
        if ylabel:
            widest = max((text_width(s, TICK) for _, s in yticks), default=0)
            at = b.left - TICK_LEN - 4 - widest - PAD - LABEL / 2
            c.text(at, (b.top + b.bottom) / 2, ylabel, LABEL, anchor="middle", rotate=-90)
        if title:
            self.title(title)

    def title(self, text: str) -> None:
        """Centred over the plot, shifted (and shrunk) to stay on the canvas."""
        c, b = self.canvas, self.box
        size = min(TITLE, (c.width - 2 * PAD) / max(1, text_width(text, 1)))
        half = text_width(text, size) / 2
        centre = min(max((b.left + b.right) / 2, PAD + half), c.width - PAD - half)
        c.text(centre, b.top - PAD - size / 2, text, size, anchor="middle")

    def legend(self, keys: list[Key], where: str = "right") -> None:
        """Beside the plot ("right") or inside a corner ("upper left", "upper right", "lower right")."""
        b, width, row = self.box, legend_width(keys), LEGEND + 6
        height = row * len(keys)
        left = {"right": b.right + 10, "upper left": b.left + 8}.get(where, b.right - 8 - width)
        top = b.bottom - 6 - height if where.startswith("lower") else b.top + (0 if where == "right" else 6)
        for i, k in enumerate(keys):
            mid = top + row * (i + 0.5)
            draw_key(self.canvas, left, mid, k)
            self.canvas.text(left + SWATCH + 6, mid, k.label, LEGEND)


def draw_key(c: Canvas, left: float, mid: float, k: Key) -> None:
    """A legend row's sample of the mark it names."""
    if k.kind == "box":
        c.rect(left, mid - 5, SWATCH, 10, k.colour)
        if k.hatch:
            c.rect(left, mid - 5, SWATCH, 10, c.hatch("#ffffff"))
    if k.kind == "line":
        c.line(left, mid, left + SWATCH, mid, k.colour, stroke_width=1.5)
    if k.marker:
        draw_marker(c, left + SWATCH / 2, mid, k.marker, k.colour)


def draw_marker(c: Canvas, x: float, y: float, kind: str, colour: str) -> None:
    """"dot" (small), "circle", "hollow" (white inside), "cross" (an x)."""
    if kind == "cross":
        c.line(x - 5, y - 5, x + 5, y + 5, colour, stroke_width=1.8)
        c.line(x - 5, y + 5, x + 5, y - 5, colour, stroke_width=1.8)
        return
    radius = {"dot": 2.5, "circle": 4.5, "hollow": 4.5}[kind]
    c.circle(x, y, radius, "#ffffff" if kind == "hollow" else colour, colour if kind == "hollow" else None)


def colorbar(c: Canvas, box: Box, cmap: str, vmin: float, vmax: float, ticks: list[float], label: str,
             fmt=lambda v: f"{v:g}") -> None:
    """A vertical colour scale filling `box` (low at the bottom), its ticks and label on the right."""
    steps = 48
    for i in range(steps):
        top = box.bottom - (i + 1) * box.height / steps
        c.rect(box.left, top, box.width, box.height / steps + 0.5, colour_at(cmap, (i + 0.5) / steps))
    c.rect(box.left, box.top, box.width, box.height, stroke=INK)
    scale = Panel(c, box, Linear(0, 1), Linear(vmin, vmax))
    for v in ticks:
        c.line(box.right, scale.py(v), box.right + TICK_LEN, scale.py(v), INK)
        c.text(box.right + TICK_LEN + 3, scale.py(v), fmt(v), TICK)
    widest = max((text_width(fmt(v), TICK) for v in ticks), default=0)
    c.text(box.right + TICK_LEN + 3 + widest + PAD + LABEL / 2, (box.top + box.bottom) / 2, label, LABEL,
           anchor="middle", rotate=-90)


def colorbar_width(ticks: list[str]) -> float:
    """Room a colorbar beside a plot takes: the strip, its tick labels and its label."""
    return 14 + 16 + TICK_LEN + 3 + max((text_width(s, TICK) for s in ticks), default=0) + PAD + LABEL + PAD

