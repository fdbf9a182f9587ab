"""Colormaps as a few anchor colours, interpolated linearly in RGB.

The anchors are nine evenly spaced samples (0, 1/8, ..., 1) of the published matplotlib colormaps
"viridis" and "magma" (van der Walt and Smith, 2015); "magma_r" is magma reversed (light = small).
Nine anchors are close enough to the 256-entry tables for a heatmap and a line's colour.
"""

VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]
MAGMA = ["#000004", "#1d1147", "#51127c", "#832681", "#b73779", "#e75263", "#fc8961", "#fec488", "#fcfdbf"]
ANCHORS = {"viridis": VIRIDIS, "magma": MAGMA, "magma_r": MAGMA[::-1]}


def colour_at(name: str, t: float) -> str:
    """The colour at fraction t (clipped to [0, 1]) of the named colormap, as #rrggbb."""
    anchors = ANCHORS[name]
    pos = min(1.0, max(0.0, t)) * (len(anchors) - 1)
    i = min(int(pos), len(anchors) - 2)
    a, b = _rgb(anchors[i]), _rgb(anchors[i + 1])
    w = pos - i
    return "#" + "".join(f"{round(x + (y - x) * w):02x}" for x, y in zip(a, b))


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[k:k + 2], 16) for k in (1, 3, 5))
