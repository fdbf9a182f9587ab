"""A real browser renders report.html: headless Debian chromium -> PNG -> not blank.

CI installs chromium with scripts/ci_system_deps.sh; where that was impossible the test
skips and says so.
"""

import shutil
import subprocess

import pytest
from report_fixtures import write_run

from nondet.reports import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--hide-scrollbars"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/ci_system_deps.sh installs "
                                             "Debian's chromium; it needs apt-get and root or sudo)")
def test_chromium_renders_the_report(tmp_path):
    import matplotlib.image

    run = write_run(tmp_path / "run", bisect=True, confirm=True)
    html = write_report(run)[1]
    png = tmp_path / "shot.png"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
           "--window-size=1280,2000", html.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and png.is_file(), r.stderr[-2000:]
    img = matplotlib.image.imread(png)[..., :3]
    assert img.shape[:2] == (2000, 1280)
    ink = (img.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert ink > 0.03, f"screenshot looks blank: {ink:.1%} non-white pixels"
    colour = (img.max(axis=2) - img.min(axis=2) > 0.05).mean()  # verdict box, highlights, figures
    assert colour > 0.01, f"no colour drawn: {colour:.2%} saturated pixels"
