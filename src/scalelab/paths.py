"""Where the project's config, experiments and caches live."""
from __future__ import annotations

import os
from pathlib import Path

# src/scalelab/paths.py -> repo root (the project is installed editable; see Makefile).
REPO_ROOT = Path(__file__).resolve().parents[2]


def conf_dir() -> Path:
    return Path(os.environ.get("SCALELAB_CONF_DIR", REPO_ROOT / "conf")).resolve()


def cache_dir() -> Path:
    """Prepared datasets and JIT-built ops; override with SCALELAB_CACHE."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalelab"
    return Path(os.environ.get("SCALELAB_CACHE", default)).resolve()
