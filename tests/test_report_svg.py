"""The report's SVG writer: ticks, scales, escaping, colormaps, hatching (nondet/reports/svg*.py)."""

import math
from xml.etree import ElementTree

import pytest

from nondet.reports.colormaps import colour_at
from nondet.reports.svg import Box, Key, Panel, plot_box
from nondet.reports.svg_axes import (Linear, Log, Symlog, fmt_power, fmt_tick, log_ticks, nice_ticks, symlog_ticks,
                                     ticks_within)
from nondet.reports.svg_canvas import Canvas, esc, text_width

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("lo, hi", [(0, 3.36), (-0.5, 29.5), (0.13, 0.91), (-3.6, -0.62), (0, 1e-7), (7, 7)])
def test_nice_ticks_are_round_even_and_cover_the_range(lo, hi):
    ticks = nice_ticks(lo, hi)
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1 and 2 <= len(ticks) <= 7
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 9) in (1, 2, 2.5, 5)
    assert ticks[0] <= lo and ticks[-1] >= hi


def test_integer_ticks_are_whole_numbers():
    assert nice_ticks(0, 3.36, integer=True) == [0, 1, 2, 3, 4]
    assert all(t == int(t) for t in nice_ticks(0, 1.2, integer=True))
    assert ticks_within(-0.5, 8.5, 12, integer=True) == list(range(9))


@pytest.mark.parametrize("lo, hi", [(0.00097, 0.0442), (0.0078, 0.045), (1e-9, 3.0), (0.01, 0.01)])
def test_log_ticks_cover_the_range_in_round_steps(lo, hi):
    ticks = log_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and len(ticks) <= 8
    assert all(f"{t:.0e}"[0] in "125" for t in ticks)
    assert ticks == sorted(set(ticks))


def test_log_and_symlog_map_monotonically_from_the_axis():
    log = Log(1e-4, 1e-1)
    fracs = [log.frac(v) for v in (1e-4, 1e-3, 1e-2, 1e-1)]
    assert fracs == pytest.approx([0, 1 / 3, 2 / 3, 1])
    sym = Symlog(1e-6, 0.0, 1.0)
    values = [0.0, 1e-7, 1e-6, 1e-4, 1e-2, 1.0]
    fracs = [sym.frac(v) for v in values]
    assert fracs[0] == 0 and fracs[-1] == 1 and fracs == sorted(set(fracs))
    assert symlog_ticks(1e-6, 1.0)[0] == 0.0  # a bit-identical 0 has its tick at the axis


def test_a_flipped_panel_puts_the_first_row_on_top():
    box = Box(10, 20, 110, 220)
    rows = Panel(Canvas(200, 240), box, Linear(0, 1), Linear(-0.5, 3.5), flip_y=True)
    assert rows.py(-0.5) == box.top and rows.py(3.5) == box.bottom
    up = Panel(Canvas(200, 240), box, Linear(0, 1), Linear(0, 10))
    assert up.py(0) == box.bottom and up.py(10) == box.top and up.px(1) == box.right


def test_tick_labels():
    assert [fmt_tick(v) for v in (0.0, 2.5, 10.0, 0.001)] == ["0", "2.5", "10", "0.001"]
    assert [fmt_power(v) for v in (0.0, 1e-3, 5e-2, 1.0)] == ["0", "1e-3", "5e-2", "1e0"]


def test_text_is_escaped_and_odd_characters_made_visible():
    assert esc('<script>alert("x")</script> & \'y\'') == \
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;y&#x27;"
    assert esc("a\x00b\udcff") == "a\\u0000b\\xff"  # XML cannot hold NUL or a lone surrogate
    canvas = Canvas(100, 50)
    canvas.text(5, 5, "<b>layer & </b>")
    root = ElementTree.fromstring(canvas.to_bytes())
    assert [t.text for t in root.iter(f"{SVG}text")] == ["<b>layer & </b>"]
    assert b"<b>" not in canvas.to_bytes()


def test_colormap_endpoints_and_middle():
    assert colour_at("viridis", 0) == "#440154" and colour_at("viridis", 1) == "#fde725"
    assert colour_at("magma_r", 0) == "#fcfdbf" and colour_at("magma_r", 1) == "#000004"
    assert colour_at("viridis", -3) == "#440154" and colour_at("viridis", 7) == "#fde725"  # clipped
    assert colour_at("viridis", 0.5) == "#21918c"  # an anchor itself
    assert colour_at("viridis", 1 / 32) == "#450c5e"  # a quarter of the way from #440154 to #472d7b


def test_a_hatched_bar_fills_with_a_pattern_it_defines():
    canvas = Canvas(200, 100)
    panel = Panel(canvas, Box(0, 0, 200, 100), Linear(-1, 1), Linear(0, 4))
    panel.bar(0, 3, 0.8, "#2471a3", hatch=True)
    root = ElementTree.fromstring(canvas.to_bytes())
    pattern = root.find(f"{SVG}defs/{SVG}pattern")
    assert pattern is not None
    fills = [r.get("fill") for r in root.iter(f"{SVG}rect")]
    assert f"url(#{pattern.get('id')})" in fills and "#2471a3" in fills


def test_a_plain_bar_spans_its_data_range():
    canvas = Canvas(200, 100)
    panel = Panel(canvas, Box(0, 0, 200, 100), Linear(0, 2), Linear(0, 4))
    panel.bar(1, 2, 1.0, "#c0392b", bottom=1)
    bar = [r for r in ElementTree.fromstring(canvas.to_bytes()).iter(f"{SVG}rect") if r.get("fill") == "#c0392b"][0]
    assert [float(bar.get(k)) for k in ("x", "y", "width", "height")] == [50, 25, 100, 50]
    assert ElementTree.fromstring(canvas.to_bytes()).find(f"{SVG}defs") is None  # no pattern when not hatched


def test_plot_box_leaves_room_for_the_longest_label_and_a_legend():
    region = Box(0, 0, 840, 384)
    short = plot_box(region, ytick_labels=["0", "1"], ylabel=True)
    long = plot_box(region, ytick_labels=["model.layers.10.mlp"], ylabel=True)
    assert long.left - short.left == pytest.approx(text_width("model.layers.10.mlp", 11) - text_width("0", 11))
    beside = plot_box(region, ytick_labels=["0"], right=150)
    assert beside.right == plot_box(region, ytick_labels=["0"]).right - 150
    assert plot_box(region, ytick_labels=["0"], title=True).top > short.top


def test_legend_rows_name_their_marks():
    canvas = Canvas(400, 200)
    panel = Panel(canvas, Box(40, 20, 300, 180), Linear(0, 1), Linear(0, 1))
    panel.legend([Key("a & b", "#c0392b"), Key("token differs", "#333333", "marker", "cross"),
                  Key("step 0", "#440154", "line", "dot")], "right")
    root = ElementTree.fromstring(canvas.to_bytes())
    assert [t.text for t in root.iter(f"{SVG}text")] == ["a & b", "token differs", "step 0"]
    assert all(float(t.get("x")) > 300 for t in root.iter(f"{SVG}text"))  # beside the plot, not over it
    assert len(root.findall(f"{SVG}circle")) == 1 and len(root.findall(f"{SVG}line")) == 3  # x: 2 lines


def test_a_long_tick_label_is_cut_at_its_start_and_the_plot_keeps_its_width():
    region = Box(0, 0, 840, 384)
    path = "model.layers.11." + "very_long_module_name." * 10 + "q_proj"
    box = plot_box(region, ytick_labels=[path])
    assert box.width > 500
    canvas = Canvas(840, 384)
    Panel(canvas, box, Linear(0, 1), Linear(-0.5, 0.5), flip_y=True).frame([], [(0, path)])
    label = next(ElementTree.fromstring(canvas.to_bytes()).iter(f"{SVG}text")).text
    assert label.startswith("…") and label.endswith("q_proj") and len(label) < 40
