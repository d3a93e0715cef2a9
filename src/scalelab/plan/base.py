"""What every planner module shares: the error for bad input and where the configs live."""
from __future__ import annotations

import os
from pathlib import Path


class PlanError(ValueError):
    """Bad planner input. The message is one line naming the value and the valid choices."""


def conf_dir() -> Path:
    """The repo's top-level conf/ (SCALELAB_CONF_DIR wins; then the source checkout; then ./conf)."""
    env = os.environ.get("SCALELAB_CONF_DIR")
    if env:
        return Path(env).resolve()
    # src/scalelab/plan/base.py -> parents[3] is the repo root of an editable/source checkout.
    repo_conf = Path(__file__).resolve().parents[3] / "conf"
    if repo_conf.is_dir():
        return repo_conf
    return (Path.cwd() / "conf").resolve()
