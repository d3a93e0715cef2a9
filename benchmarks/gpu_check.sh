#!/usr/bin/env bash
# GPU truth check (issue 11): hand-written loop vs single, ddp, fsdp, zero2, zero3, tp at world 1,
# and the planner's predictions, in one table. Under 6 minutes on one H200. See benchmarks/gpu_check.py.
#   bash benchmarks/gpu_check.sh [--out DIR]      (add --smoke to check it on a CPU)
# On a GPU host without package-registry access: `source .gpu/env.sh` first (shared/notes/gpu-device.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
# .venv's python where it has a CUDA torch (or for --smoke); else the env's python3 (.gpu/env.sh's,
# whose packed packages a CPU-only .venv carried along would shadow); gpu_check.py refuses a CPU torch
if [ -x .venv/bin/python ] && { [[ " $* " == *" --smoke "* ]] || .venv/bin/python -c \
    'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }; then
  PY=.venv/bin/python
fi
exec "$PY" benchmarks/gpu_check.py "$@"
