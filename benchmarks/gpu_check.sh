#!/usr/bin/env bash
# GPU truth check (issue 11): hand-written loop vs single, ddp, fsdp, zero2, zero3, tp at world 1,
# and the planner's predictions, in one table. Under 6 minutes on one H200. See benchmarks/gpu_check.py.
#   bash benchmarks/gpu_check.sh [--out DIR]      (add --smoke to check it on a CPU)
# On a GPU host without package-registry access: `source .gpu/env.sh` first (shared/notes/gpu-device.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" benchmarks/gpu_check.py "$@"
