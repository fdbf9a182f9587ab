"""A real browser renders report.html: headless Debian chromium -> PNG -> not blank.

CI installs chromium with scripts/ci_system_deps.sh; where that was impossible the test
skips and says so. The screenshot is read by a small PNG decoder below (zlib and numpy), so
the test needs no imaging library.
"""

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from report_fixtures import write_run

from nondet.reports import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--hide-scrollbars"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/ci_system_deps.sh installs "
                                             "Debian's chromium; it needs apt-get and root or sudo)")
def test_chromium_renders_the_report(tmp_path):
    run = write_run(tmp_path / "run", bisect=True, confirm=True)
    html = write_report(run)[1]
    png = tmp_path / "shot.png"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
           "--window-size=1280,2000", html.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and png.is_file(), r.stderr[-2000:]
    img = read_png(png.read_bytes())[..., :3] / 255.0
    assert img.shape[:2] == (2000, 1280)
    ink = (img.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert ink > 0.03, f"screenshot looks blank: {ink:.1%} non-white pixels"
    colour = (img.max(axis=2) - img.min(axis=2) > 0.05).mean()  # verdict box, highlights, figures
    assert colour > 0.01, f"no colour drawn: {colour:.2%} saturated pixels"


def read_png(data: bytes) -> np.ndarray:
    """Pixels (height, width, channels) of an 8-bit, non-interlaced RGB or RGBA PNG, as uint8."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, pos = {}, 8
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunks[kind] = chunks.get(kind, b"") + data[pos + 8:pos + 8 + length]  # IDAT: the pieces in order
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0, "only 8-bit RGB / RGBA, not interlaced"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(chunks[b"IDAT"])
    rows, prior = [], bytes(width * bpp)
    for r in range(height):
        start = r * (width * bpp + 1)
        prior = _unfilter(raw[start], raw[start + 1:start + 1 + width * bpp], prior, bpp)
        rows.append(prior)
    return np.frombuffer(b"".join(rows), np.uint8).reshape(height, width, bpp)


def _unfilter(kind: int, line: bytes, prior: bytes, bpp: int) -> bytes:
    """One scanline with its PNG filter undone (0 none, 1 sub, 2 up, 3 average, 4 Paeth)."""
    if kind == 0:
        return line
    if kind == 2:
        return ((np.frombuffer(line, np.uint8).astype(np.uint16) + np.frombuffer(prior, np.uint8)) % 256
                ).astype(np.uint8).tobytes()
    if kind == 1:  # each byte adds the one bpp to its left: a running sum per channel
        sums = np.frombuffer(line, np.uint8).reshape(-1, bpp).astype(np.int64).cumsum(axis=0) % 256
        return sums.astype(np.uint8).tobytes()
    out = bytearray(line)
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        b, c = prior[i], prior[i - bpp] if i >= bpp else 0
        if kind == 3:
            out[i] = (out[i] + (a + b) // 2) & 255
            continue
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return bytes(out)


def test_read_png_undoes_every_filter():
    """A 3 x 2 RGB image whose rows use filters 0 to 4 in turn decodes to its pixels."""
    pixels = np.array([[[10, 200, 30], [250, 5, 60], [7, 8, 9]], [[1, 2, 3], [255, 0, 128], [90, 91, 92]],
                       [[12, 34, 56], [78, 90, 12], [34, 56, 78]], [[0, 0, 0], [255, 255, 255], [1, 1, 1]],
                       [[100, 50, 25], [25, 50, 100], [5, 5, 5]]], np.uint8)
    lines, prior = [], np.zeros(9, np.int64)
    for kind, row in enumerate(pixels.reshape(5, 9).astype(np.int64)):
        left = np.concatenate([[0, 0, 0], row[:-3]])
        up_left = np.concatenate([[0, 0, 0], prior[:-3]])
        predict = [np.zeros(9, np.int64), left, prior, (left + prior) // 2, _paeth(left, prior, up_left)][kind]
        lines.append(bytes([kind]) + ((row - predict) % 256).astype(np.uint8).tobytes())
        prior = row
    ihdr = struct.pack(">IIBBBBB", 3, 5, 8, 2, 0, 0, 0)
    png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"".join(lines)))
           + _chunk(b"IEND", b""))
    assert (read_png(png) == pixels).all()


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
