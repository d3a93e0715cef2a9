"""`scalelab-train --help` says what the command is and how it is used. Walkthrough: it opened with
"train is powered by Hydra." and 116 lines of config, with no usage line and no word of -m sweeps,
experiment=NAME, where results go, or scalelab compare."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _help() -> str:
    script = Path(sys.executable).with_name("scalelab-train")
    cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from scalelab.train import main; main()"]
    proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_opens_with_the_command_and_its_usage():
    text = _help()
    lines = text.splitlines()
    assert lines[0].startswith("scalelab-train:") and "powered by Hydra" not in text
    head = "\n".join(lines[:10])
    assert "Usage:" in head and "scalelab-train -m " in head and "experiment=NAME" in head
    for needed in ("trainer.devices=N", "data.global_batch_size=B", "strategy=NAME",
                   "outputs/runs/", "outputs/sweeps/", "scalelab compare", "scalelab plan", "scalelab recommend",
                   "--cfg job"):
        assert needed in " ".join(text.split()) or needed in text, needed
    # Hydra's listing of the config groups stays; the 100-line config dump does not
    assert "strategy: " in text and "zero3" in text and "experiment: " in text and "default" in text
    assert "_target_" not in text and len(lines) < 60
