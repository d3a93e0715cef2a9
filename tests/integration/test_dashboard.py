"""The dashboard in a real browser: `scalelab compare SWEEP --format html` on the fixture sweep of
tests/unit/test_report.py, opened from the file in headless Chromium (Debian's `chromium`; .ci/run
installs it). The page reports on itself (results/report.py: a hidden <pre> with the traces each
chart drew and every script error, promise rejection, blocked request and console.error); Chromium's
own console log (--enable-logging=stderr) must be empty too. A strict Content-Security-Policy
blocks any request the page would make, and such a block is a console error: a control copy of the
page with one remote image proves the check sees it."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO, env
from ..unit.test_report import make_sweep

pytestmark = pytest.mark.integration

# chart id -> traces, worked out from the fixture (see tests/unit/test_report.py for each one's data)
EXPECTED = {"efficiency_strong": 3,   # ddp b16, fsdp b16, ideal
            "efficiency_weak": 2,     # ddp 16/rank, ideal
            "throughput": 4,          # ddp b16, ddp b32, fsdp b16, single b16
            "memory": 4,              # params, grads, optimizer state, activations + runtime
            "loss": 8,                # every completed run
            "lr_scaling": 2,          # lr_rule none, linear
            "breakdown": 3,           # compute, transfer, wait
            "planner_step": 2, "planner_memory": 2}   # measured, predicted (the GPU run)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        exe = shutil.which(name)
        if exe and subprocess.run([exe, "--version"], capture_output=True, timeout=60).returncode == 0:
            return exe
    pytest.skip("chromium is not installed or does not run (.ci/run installs it: apt-get install chromium)")


def _browse(exe: str, page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def _selfcheck(dom: str) -> dict:
    m = re.search(r'<pre id="scalelab-selfcheck"[^>]*>(.*?)</pre>', dom, re.S)
    assert m and m.group(1).strip(), "the page never finished drawing (no self-check written)"
    return json.loads(m.group(1))


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("dashboard")
    sweep = make_sweep(tmp / "sweep")
    out = tmp / "report.html"
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), "--format", "html",
                           "--out", str(out)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


def test_no_request_can_leave_the_file(report):
    page = report.read_text()
    assert re.search(r'<meta http-equiv="Content-Security-Policy" content="default-src \'none\';', page)
    assert not re.search(r"<(script|link|img|iframe|source|embed)\b[^>]*\b(src|href)\s*=", page, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", page)  # no remote CSS resource either


def test_every_chart_renders_with_no_console_error(report, tmp_path):
    exe = _chromium()
    proc = _browse(exe, report, tmp_path, "--dump-dom")
    check = _selfcheck(proc.stdout)
    assert check["errors"] == []
    assert _console(proc.stderr) == []
    assert check["charts"] == {cid: {"data": n, "rendered": n} for cid, n in EXPECTED.items()}


def test_a_blocked_request_would_be_seen(report, tmp_path):
    """Control: the same page plus one remote image. The CSP blocks it, and both the page's own
    check and Chromium's console log report it, so the test above would fail on a leak."""
    exe = _chromium()
    leaky = tmp_path / "leaky.html"
    leaky.write_text(report.read_text().replace("<h1>", '<img src="https://example.invalid/x.png"><h1>', 1))
    proc = _browse(exe, leaky, tmp_path, "--dump-dom")
    console = " ".join(_console(proc.stderr))
    assert "example.invalid" in console and "Content Security Policy" in console
    assert _selfcheck(proc.stdout)["charts"]["loss"]["rendered"] == EXPECTED["loss"]


def test_screenshot_is_not_blank(report, tmp_path):
    import numpy as np
    from PIL import Image

    exe = _chromium()
    shot = tmp_path / "dashboard.png"
    proc = _browse(exe, report, tmp_path, "--window-size=1400,2600", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000, proc.stderr[-2000:]
    assert _console(proc.stderr) == []
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2600)
    px = np.asarray(img.resize((350, 650)), dtype=np.int32).reshape(-1, 3)
    drawn = 1 - (px.min(axis=1) > 245).mean()
    assert 0.05 < drawn < 0.9                               # drawn on, not a blank or solid page
    assert len(np.unique(px, axis=0)) > 200                 # lines, bars, text: many colours
    # the strategies' colours (ddp, fsdp: lines, counted at full size) and the first colour after
    # the four strategies' (the memory, breakdown and planner bars) are drawn in the charts
    from scalelab.results.report import PALETTE

    full = np.asarray(img, dtype=np.int32).reshape(-1, 3)
    for pixels, color, least in ((full, PALETTE[0], 1000), (full, PALETTE[1], 500), (px, PALETTE[4], 2000)):
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        assert (np.abs(pixels - np.array(rgb)).sum(axis=1) < 40).sum() > least, rgb
    shutil.copy(shot, report.parent / "dashboard.png")      # kept with the report for a look by hand
