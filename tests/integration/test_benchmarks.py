"""benchmarks/run_all.py end to end (--quick: one repetition, few steps, every part), so the one
benchmark command does not rot. Slow: ~2 minutes on 2 idle cores (about 3.5 under load)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ..conftest import REPO, env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STRATEGIES = ("single", "ddp", "fsdp", "zero1", "zero2", "zero3", "tp", "pipeline")
ROWS = ("throughput", *(f"weak:{s}" for s in STRATEGIES), *(f"states:{s}" for s in STRATEGIES[1:]),
        "startup:first", "startup:torchrun_first", "startup:whole", "startup:torchrun_whole", "sweepcost", "default")


def test_run_all_quick_writes_every_row(tmp_path):
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--quick", "--out", str(out),
                           "--json", str(raw)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert text in proc.stdout                          # the printed table is the written one
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith(("| key ", "|---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 6, line
            rows[cells[0]] = cells
    assert list(rows) == list(ROWS)
    for key, (_, figure, value, detail, goal, load) in rows.items():
        m = re.match(r"^(\d+(?:\.\d+)?)(?: s)?(?: \[(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\])?$", value)
        assert m and float(m.group(1)) > 0, (key, value, detail)
        assert re.match(r"^\d+\.\d\d->\d+\.\d\d$", load), (key, load)
    # what the goals are judged on: a ratio of this machine's own runs, said how it was measured
    for part in ("throughput", "weak", "states", "startup", "sweepcost", "default"):
        assert re.search(rf"^- {part}: ", text, re.M), part
    assert "same work: checked" in rows["throughput"][3]
    # ddp and fsdp hold exactly the ZeRO formula's fp32 Adam bytes (16 Psi, 16 Psi / 2)
    assert rows["states:ddp"][2] == rows["states:fsdp"][2] == "1.000"
    doc = json.loads(raw.read_text())
    assert [p["name"] for p in doc["parts"]] == ["throughput", "weak", "states", "startup", "sweepcost", "default"]
    assert doc["header"]["total_s"] > 0
