"""Start-up cost: a 2-rank gpt_nano DDP job of 30 steps, the platform against a bare torchrun
script on the same model (benchmarks/bare_ddp.py), interleaved, N repetitions.

    .venv/bin/python benchmarks/startup.py [--reps 3] [--steps 30] [--json OUT]

Variants, run in turn within each repetition (the host's speed drifts; interleaving keeps the
ratios fair):
  bare        python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bare_ddp.py
  platform    scalelab-train strategy=ddp trainer.devices=2 model=gpt_nano ... (launcher=local:
              ranks forked from a server that imported the worker once, scalelab.spawn)
  torchrun    the same with launcher=torchrun_local (every rank a fresh interpreter)
Measured: the launching command's start (taken here, before it is spawned) to each mark the job
records (run.json timing.marks for the platform; the bare script prints its own): ranks spawned,
rank process start, imports done, model built, first and last optimizer step, record written,
exit. Prints the medians [min-max] per phase and the two goal ratios (platform / bare: launch to
first step, whole job). benchmarks/run_all.py reuses measure(), ratios(), run_bare() and
run_platform().
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
PY = sys.executable
PHASES = ("ranks_spawned", "rank_process_start", "imports_done", "model_built", "first_step", "last_step",
          "record_written", "exit")


def run_bare(steps: int, args: list[str] | tuple[str, ...] = (), nproc: int = 2) -> dict:
    """One bare torchrun job (benchmarks/bare_ddp.py; `args`: its other flags, e.g. the model
    shape). Returns the launch/end times taken here, the script's marks and its figures (`doc`)."""
    t0 = time.time()
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           str(REPO / "benchmarks" / "bare_ddp.py"), "--steps", str(steps), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    t1 = time.time()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BARE ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"bare script failed ({proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads(line[5:])
    m = doc["marks"]
    return {"launch": t0, "end": t1, **m, "step_s": doc["step_s_median"], "doc": doc}


def run_platform(steps: int, launcher: str, work: Path, n: int | str,
                 overrides: list[str] | tuple[str, ...] = ("strategy=ddp", "trainer.devices=2", "model=gpt_nano")) -> dict:
    """One platform job (`scalelab-train OVERRIDES trainer.max_steps=STEPS launcher=LAUNCHER`,
    no logger, no progress bar) in WORK/LAUNCHER-N. Returns the launch/end times taken here, the
    run.json timing marks and the record itself (`record`)."""
    job = work / f"{launcher}-{n}"
    t0 = time.time()
    proc = subprocess.run([str(Path(PY).parent / "scalelab-train"), *overrides,
                           f"trainer.max_steps={steps}", "logger=none", "trainer.enable_progress_bar=false",
                           f"launcher={launcher}", f"hydra.run.dir={job}"],
                          capture_output=True, text=True, timeout=600, cwd=work)
    t1 = time.time()
    if proc.returncode:
        raise SystemExit(f"platform ({launcher}) failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rec = json.loads((job / "run.json").read_text())
    m = rec["timing"]["marks"]
    return {"launch": t0, "end": t1, **m, "exit": m.get("ranks_exited"), "step_s": rec["step_time_s"]["median"],
            "record": rec}


def _med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


VARIANTS = ("bare", "platform", "torchrun")


def measure(reps: int = 3, steps: int = 30, warm: bool = True) -> dict[str, list[dict]]:
    """The raw measurements: per variant, one dict per repetition (epoch-s marks, "launch" and
    "end" taken here). `warm`: first one unmeasured run of bare and platform (data preparation,
    the host's CPU probe, page cache); a caller that has just run both may skip it."""
    raw: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if warm:
            run_bare(8), run_platform(8, "local", work, -1)
        for rep in range(reps):
            raw["bare"].append(run_bare(steps))
            raw["platform"].append(run_platform(steps, "local", work, rep))
            raw["torchrun"].append(run_platform(steps, "torchrun_local", work, rep))
    for runs in raw.values():          # keep the raw dicts JSON-sized: marks and figures only
        for r in runs:
            r.pop("record", None), r.pop("doc", None)
    return raw


def ratios(raw: dict[str, list[dict]]) -> dict:
    """The goal figures: launch -> first optimizer step and the whole job (launch -> the command's
    end), platform and torchrun launcher over bare, as the ratio of the medians over the
    repetitions ("first", "whole") and each repetition's own ratio ("first_per_rep", ...), plus
    the medians in seconds."""
    out: dict = {}
    for key, mark in (("first", "first_step"), ("whole", "end")):
        secs = {v: [r[mark] - r["launch"] for r in raw[v]] for v in VARIANTS}
        out[f"{key}_s"] = {v: statistics.median(x) for v, x in secs.items()}
        for v in ("platform", "torchrun"):
            name = key if v == "platform" else f"torchrun_{key}"
            out[name] = out[f"{key}_s"][v] / out[f"{key}_s"]["bare"]
            out[f"{name}_per_rep"] = [p / b for p, b in zip(secs[v], secs["bare"])]
    out["step_s"] = {v: statistics.median(r["step_s"] for r in raw[v]) for v in VARIANTS}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", help="write the raw measurements here")
    a = ap.parse_args()
    variants = VARIANTS
    raw = measure(a.reps, a.steps)
    rows = []
    for phase in (*PHASES, "end"):
        cells = []
        for v in variants:
            med, lo, hi = _med([(r.get(phase) - r["launch"]) if r.get(phase) else None for r in raw[v]])
            cells.append("-" if med is None else f"{med:6.2f} [{lo:.2f}-{hi:.2f}]")
        rows.append((phase, *cells))
    print(f"# start-up: 2-rank gpt_nano DDP, {a.steps} steps, {a.reps} interleaved repetitions; seconds from the "
          "launching command's start, median [min-max]")
    print(f"{'mark':<20}" + "".join(f"{v:>24}" for v in variants))
    for r in rows:
        print(f"{r[0]:<20}" + "".join(f"{c:>24}" for c in r[1:]))
    q = ratios(raw)
    print(f"launch -> first step, platform / bare: {q['first']:.2f} (goal <= 1.5); "
          f"torchrun launcher / bare: {q['torchrun_first']:.2f}")
    print(f"whole {a.steps}-step job, platform / bare: {q['whole']:.2f} (goal <= 1.3); "
          f"torchrun launcher / bare: {q['torchrun_whole']:.2f}")
    print("median step (s): " + ", ".join(f"{v} {q['step_s'][v] * 1e3:.1f} ms" for v in variants))
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
