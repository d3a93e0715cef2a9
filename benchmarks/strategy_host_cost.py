"""Host cost per step of each strategy at world size 1, on CPU: the stand-in for a GPU's host-bound steps.

On an H200 at world size 1 the 86M GPT's fsdp, zero2 and zero3 steps were host-bound (issue 11,
run 3: the device busy 27-31 ms of 57 / 47 / 119 ms steps, single 34.5): the host issued hooks,
copies and per-tensor bookkeeping more slowly than the device ran the kernels. That host work is
Python and framework code that runs the same on a CPU. So this runs each strategy on a GPT with
the 86M model's structure (12 layers, 12 heads: the same modules and parameter tensors, so the
same hooks and per-tensor work) but so narrow (width 96, context 32, batch 4) that its compute is
a small part of a step, and compares the steps:

- each job in a fresh process (DeepSpeed cannot initialize twice in one), 1 thread, a world of 1
  (gloo), through scalelab.worker.run with no launcher (tests/host_syncs.py, as host_overhead.py);
- AdamW fused, as a CUDA rank runs it (optim.fused_on_gpu); on CPU torch's default is the
  per-tensor loop, a host cost the GPU runs do not have;
- the variants interleaved over --repeats rounds; per job the median step (run.json
  step_time_s.median, steps after warm-up); the figure is the median over rounds.

Prints per variant: ms/step, single / variant (as gpu_check's "tokens/s / single") and the ms per
step above single (the host time the strategy adds). A CPU ratio is not a GPU ratio (the CPU
also computes, and a GPU's launch cost per kernel differs), but a change that cuts a strategy's
host work shows here first. Run 3's H200 ratios for the same strategies: ddp 0.95, fsdp 0.63,
zero2 0.71, zero3 0.28 (benchmarks/gpu_h200.md).

    .venv/bin/python benchmarks/strategy_host_cost.py [--repeats 3] [--steps 60] [VARIANT ...]
A VARIANT is one quoted string of scalelab-train overrides, e.g. "strategy=zero3
strategy.stage3_fetch_unit=module"; the default set is single, ddp, fsdp, zero2, zero3 and zero3
with DeepSpeed's per-submodule fetch. `single` is always run first in each round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# the 86M GPT's structure (12 layers x 12 heads, byte vocabulary), 8x narrower, short context
SHAPE = ["model=gpt_nano", "model.arch.n_layers=12", "model.arch.n_heads=12", "model.arch.d_model=96",
         "model.arch.seq_len=32", "data.global_batch_size=4"]
RUN = ["trainer.accelerator=cpu", "trainer.devices=1", "logger=csv", "trainer.enable_progress_bar=false",
       "trainer.profile_steps=0", "optim.optimizer.fused=true"]
# ZeRO-3 keeps parameters under stage3_param_persistence_threshold elements (1e5) whole on every
# rank: never gathered or released. At width 96 every tensor here is below it, so the stand-in
# would skip the fetch/release work entirely (it did before this scaling). The threshold is scaled
# by the width squared, (96 / 768)^2, so that the same tensors are partitioned as in the 86M GPT:
# weights and embeddings gathered, biases and LayerNorms persistent.
ZERO3_PERSISTENCE = "strategy.stage3_param_persistence_threshold=1562"
DEFAULT = ["strategy=single", "strategy=ddp", "strategy=fsdp", "strategy=zero2", "strategy=zero3",
           "strategy=zero3 strategy.stage3_fetch_unit=module"]


def one(overrides: list[str]) -> dict:
    """One job in this process; prints its figures as one JSON line."""
    import torch

    from tests.host_syncs import run_job, write_job

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="strategy_host_cost-") as tmp:
        rec = run_job(write_job(Path(tmp) / "job", overrides))
    return {"median_s": rec["step_time_s"]["median"], "status": rec["status"],
            "zero3_fetch": rec.get("zero3_fetch")}


def run_variant(overrides: list[str], timeout: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--one", *overrides], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"job {' '.join(overrides)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per job")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("variants", nargs="*")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.variants)))
        return 0
    variants = ["strategy=single"] + [v for v in (a.variants or DEFAULT) if v != "strategy=single"]
    variants = [f"{v} {ZERO3_PERSISTENCE}" if "zero3" in v and "persistence_threshold" not in v else v
                for v in variants]
    common = [*SHAPE, *RUN, f"trainer.max_steps={a.steps}", f"trainer.warmup_steps={a.warmup}"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    fetch: dict[str, dict | None] = {}
    t0 = time.time()
    for r in range(a.repeats):
        for v in variants:
            res = run_variant([*common, *v.split()], a.timeout)
            times[v].append(res["median_s"])
            fetch[v] = res["zero3_fetch"]
            print(f"round {r + 1}/{a.repeats}: {v}: {res['median_s'] * 1e3:.2f} ms/step", flush=True)
    single = statistics.median(times["strategy=single"])
    rows = []
    print("\n| variant | ms/step | single / variant | ms/step above single | rounds (ms) |\n|---|---|---|---|---|")
    for v in variants:
        m = statistics.median(times[v])
        rows.append({"variant": v, "ms_per_step": m * 1e3, "single_over_variant": single / m,
                     "above_single_ms": (m - single) * 1e3, "rounds_ms": [t * 1e3 for t in times[v]],
                     **({"zero3_fetch": fetch[v]} if fetch[v] else {})})
        print(f"| {v} | {m * 1e3:.2f} | {single / m:.2f} | {(m - single) * 1e3:+.2f} | "
              f"{', '.join(f'{t * 1e3:.1f}' for t in times[v])} |")
    print(json.dumps({"rows": rows, "common_overrides": common, "repeats": a.repeats, "wall_s": time.time() - t0,
                      "method": "each job a fresh process, 1 thread, world 1 (gloo), scalelab.worker.run without a "
                                "launcher; per job run.json step_time_s.median (steps after warm-up); variants "
                                "interleaved per round; figure = median over rounds"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
