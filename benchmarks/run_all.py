"""Every benchmark of this repo in one command and one table (under 10 minutes on the 2-core CPU
machine; `--quick`: a 1-repetition smoke run of every part, about 2 minutes).

    .venv/bin/python benchmarks/run_all.py [--quick] [--out FILE.md] [--json FILE.json] [--budget S]

Parts, in this order (each row of the table names its part in `key`):
  throughput  platform / hand-written DDP (benchmarks/bare_ddp.py) samples/s: gpt_small, 2 ranks x
              micro-batch 8, 30 steps (5 warm-up), interleaved pairs (order alternating) x 3
  weak, states  one `scalelab-train -m` sweep: single, ddp, fsdp, zero1, zero2, zero3, tp, pipeline
              at 1 and 2 ranks, gpt_nano, 8 samples per rank: weak-scaling efficiency from the
              run.json files, and model-state bytes per rank against the ZeRO paper's formula and
              the planner's (src/scalelab/plan/model_states.py)
  startup     benchmarks/startup.py's measurement (its measure()/ratios()), 2 repetitions
  sweepcost   a 4-job gpt_nano sweep's wall time / 4 against the same jobs as lone commands
  default     the wall time of `scalelab-train -m experiment=default` (what `make run` runs), with
              fewer steps when the full run would not fit the budget (the table says so)
Every job: logger=none, trainer.enable_progress_bar=false, outputs under a temporary folder
(`--keep DIR` keeps them there instead). The host's speed drifts: every ratio is taken between
runs made next to each other, and each row carries the 1-minute load average at the start and the
end of its part (os.getloadavg). Exit status 1 when a part failed (its row says why).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import startup  # noqa: E402  (benchmarks/startup.py: run_bare, run_platform, measure, ratios)

PY = sys.executable
TRAIN = str(Path(PY).parent / "scalelab-train")
QUIET = ("logger=none", "trainer.enable_progress_bar=false")
WEAK_STRATEGIES = ("single", "ddp", "fsdp", "zero1", "zero2", "zero3", "tp", "pipeline")
# The bare script's flags for each model config (conf/model/*.yaml arch)
SHAPES = {"gpt_small": dict(layers=4, width=256, heads=4, seq_len=128),
          "gpt_nano": dict(layers=2, width=64, heads=4, seq_len=64)}


@dataclass
class Settings:
    quick: bool
    thr_model: str = "gpt_small"
    thr_steps: int = 30
    thr_warmup: int = 5
    thr_pairs: int = 3
    thr_cap_s: float = 240.0        # the throughput part stops adding pairs past this
    weak_steps: int = 30
    weak_warmup: int = 5
    startup_reps: int = 2
    startup_steps: int = 30
    cost_steps: int = 20
    cost_lone: tuple = (("single", 1), ("single", 2), ("ddp", 1), ("ddp", 2))
    default_steps: int = 30          # the experiment's own; cut to fit the budget (said so)
    default_cap_s: float = 180.0     # "if the default experiment alone takes more than ~3 min"

    @classmethod
    def make(cls, quick: bool) -> "Settings":
        if not quick:
            return cls(quick=False)
        return cls(quick=True, thr_model="gpt_nano", thr_steps=12, thr_warmup=2, thr_pairs=1, thr_cap_s=60,
                   weak_steps=10, weak_warmup=2, startup_reps=1, startup_steps=10, cost_steps=10,
                   cost_lone=(("single", 1),), default_steps=6, default_cap_s=60)


@dataclass
class Row:
    key: str
    figure: str
    value: str
    detail: str = ""
    goal: str = ""
    load: str = ""


@dataclass
class Part:
    name: str
    method: str = ""
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    load: tuple = ()
    data: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ helpers
def load1() -> float:
    return os.getloadavg()[0]


def fmt_range(xs: list[float], nd: int = 2) -> str:
    """median [min-max] (just the value for one)."""
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"{med:.{nd}f}"
    return f"{med:.{nd}f} [{min(xs):.{nd}f}-{max(xs):.{nd}f}]"


def train(args: list[str], cwd: Path, multirun: bool = False, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    """Run scalelab-train ARGS (+ no logger, no progress bar); (wall seconds, process)."""
    cmd = [TRAIN, *(["-m"] if multirun else []), *args, *QUIET]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd)
    wall = time.perf_counter() - t0
    if check and proc.returncode:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise RuntimeError(f"`scalelab-train {' '.join(args)}` exited {proc.returncode}: {tail}")
    return wall, proc


def records(sweep_dir: Path) -> list[dict]:
    out = []
    for p in sorted(sweep_dir.glob("*/run.json"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0):
        out.append(json.loads(p.read_text()))
    return out


def n_params(model: str) -> int:
    import torch

    from scalelab.models.gpt import GPT, GPTConfig

    s = SHAPES[model]
    with torch.device("meta"):
        net = GPT(GPTConfig(n_layers=s["layers"], n_heads=s["heads"], d_model=s["width"], seq_len=s["seq_len"]))
    return sum(p.numel() for p in net.parameters())


def kib(b: float) -> str:
    return f"{b / 1024:.0f} KiB"


# ------------------------------------------------------------------------------------------ parts
def part_throughput(st: Settings, work: Path, part: Part) -> None:
    model, sh = st.thr_model, SHAPES[st.thr_model]
    overrides = ["strategy=ddp", "trainer.devices=2", f"model={model}", "data.global_batch_size=16",
                 f"trainer.warmup_steps={st.thr_warmup}"]
    bare_args = ["--layers", str(sh["layers"]), "--width", str(sh["width"]), "--heads", str(sh["heads"]),
                 "--seq-len", str(sh["seq_len"]), "--batch", "16", "--warmup", str(st.thr_warmup), "--threads", "1"]
    pairs, problems, walls = [], [], []
    steady = (st.thr_warmup, st.thr_steps)
    t_part = time.perf_counter()
    want_params = n_params(model)
    for i in range(st.thr_pairs):
        t_pair = time.perf_counter()
        got = {}
        for side in (("platform", "bare") if i % 2 == 0 else ("bare", "platform")):
            if side == "platform":
                r = startup.run_platform(st.thr_steps, "local", work, f"thr{i}", overrides)
                walls.append(r["end"] - r["launch"])
                rec = r["record"]
                got["platform"] = (rec["throughput"]["samples_per_s"], rec["step_time_s"]["median"])
                steady = (rec["step_time_s"]["warmup_steps_excluded"],
                          rec["steps"] - rec["step_time_s"]["profiled_steps_excluded"])
                # like for like: the same work on both sides
                m = rec["model"]
                checks = {"micro-batch 8": rec["per_device_batch_size"] == 8 and rec["accumulate_grad_batches"] == 1,
                          "model shape": (m["n_layers"], m["d_model"], m["n_heads"], m["seq_len"])
                          == (sh["layers"], sh["width"], sh["heads"], sh["seq_len"]),
                          "n_params": m["n_params"] == want_params,
                          "AdamW": rec["config"]["optim"]["optimizer"]["_target_"] == "torch.optim.AdamW",
                          "1 thread/rank": rec["hardware"].get("threads_per_rank") == 1,
                          "fp32": str(rec.get("precision")).startswith("32")}
                problems += [k for k, ok in checks.items() if not ok and k not in problems]
            else:
                r = startup.run_bare(st.thr_steps, bare_args)
                doc = r["doc"]
                got["bare"] = (doc["samples_per_s"], doc["step_s_median"])
                if doc["world_size"] != 2 and "bare world" not in problems:
                    problems.append("bare world")
        pairs.append(got)
        elapsed, pair_s = time.perf_counter() - t_part, time.perf_counter() - t_pair
        if i + 1 < st.thr_pairs and elapsed + pair_s > st.thr_cap_s:
            break
    ratios = [p["platform"][0] / p["bare"][0] for p in pairs]
    steps_ratio = [p["platform"][1] / p["bare"][1] for p in pairs]
    cut = "" if len(pairs) == st.thr_pairs else f" (cut from {st.thr_pairs}: time cap {st.thr_cap_s:.0f} s)"
    part.data = {"pairs": pairs, "ratios": ratios, "platform_job_wall_s": walls, "checks_failed": problems}
    part.rows.append(Row(
        "throughput", f"DDP samples/s, platform / hand-written, {model} 2 ranks x 8, {st.thr_steps} steps",
        fmt_range(ratios, 3),
        f"{len(pairs)} pair(s){cut}; platform {fmt_range([p['platform'][0] for p in pairs], 1)}, "
        f"bare {fmt_range([p['bare'][0] for p in pairs], 1)} samples/s; step time platform/bare "
        f"{fmt_range(steps_ratio, 3)}; same work: " + ("checked" if not problems else "MISMATCH " + ", ".join(problems)),
        ">= 0.98"))
    part.method = (f"throughput: {len(pairs)} interleaved pair(s) (order alternating) of `scalelab-train "
                   f"{' '.join(overrides)} trainer.max_steps={st.thr_steps}` and `torchrun --nproc_per_node=2 "
                   f"benchmarks/bare_ddp.py {' '.join(bare_args)} --steps {st.thr_steps}` (random bytes, same GPT, "
                   "AdamW, gloo); both: global batch x steady steps / the slowest rank's steady time (the rank whose "
                   f"steps took longest in all); platform steady = steps {steady[0]}..{steady[1]} (run.json: warm-up and profiled steps "
                   f"excluded), bare = steps {st.thr_warmup}..{st.thr_steps}; value = median [min-max] of the pairs' "
                   "ratios; checked from run.json: micro-batch, shape, parameter count, AdamW, 1 thread per rank, fp32")


def shell_arg(arg: str) -> str:
    """An override as a user pastes it into bash: double-quoted with `$` escaped where it holds an
    interpolation (bash would strip the single quotes Hydra needs, and expand `${...}`)."""
    import shlex

    if "$" in arg or "'" in arg:
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
    return shlex.quote(arg)


def part_weak(st: Settings, work: Path, part: Part, states: Part) -> None:
    sweep = work / "weak"
    args = [f"strategy={','.join(WEAK_STRATEGIES)}", "trainer.devices=1,2", "model=gpt_nano",
            "data.global_batch_size='${mul:${trainer.devices},${trainer.num_nodes},8}'",
            f"trainer.max_steps={st.weak_steps}", f"trainer.warmup_steps={st.weak_warmup}", f"hydra.sweep.dir={sweep}"]
    wall, proc = train(args, work, multirun=True, check=False)
    recs = records(sweep)
    if not recs:
        raise RuntimeError(f"the weak-scaling sweep wrote no run.json (exit {proc.returncode}): {proc.stderr[-1500:]}")
    by = {(r.get("strategy"), r.get("world_size")): r for r in recs}
    try:
        sweep_groups = json.loads((sweep / "sweep.json").read_text())["groups"]
    except (OSError, ValueError, KeyError):
        sweep_groups = []
    weak_eff = {g["strategy"]: g["runs"][-1]["scaling_efficiency"] for g in sweep_groups
                if g["kind"] == "weak" and g["runs"][-1]["world_size"] == 2}

    def thr(r):
        return ((r or {}).get("throughput") or {}).get("samples_per_s") if (r or {}).get("status") == "completed" else None

    base = thr(by.get(("single", 1)))
    part.data = {"wall_s": wall, "jobs": len(recs), "sweep_json_weak": weak_eff}
    for s in WEAK_STRATEGIES:
        r2, r1 = by.get((s, 2)), by.get((s, 1))
        t2, t1 = thr(r2), thr(r1)
        if t2 is None or not base:
            err = (r2 or {}).get("error") or "no run.json"
            part.rows.append(Row(f"weak:{s}", f"weak-scaling efficiency 1->2 ranks, {s}", "failed", str(err)[:120]))
            continue
        eff = t2 / (2 * base)
        own = t2 / (2 * t1) if t1 else None
        sj = weak_eff.get(s)
        agree = "" if sj is None or own is None or abs(sj - own) < 1e-6 else f" (sweep.json says {sj:.3f}!)"
        src = "= sweep.json weak group" if sj is not None else "sweep.json: no weak group (dp=1: one batch per 2 ranks)"
        note = " (no gradient sync: the communication-free bound)" if s == "single" else ""
        part.rows.append(Row(
            f"weak:{s}", f"weak-scaling efficiency, single@1 -> {s}@2{note}", f"{eff:.3f}",
            f"{t2:.0f} vs {base:.0f} samples/s at 1 rank; vs {s}@1: "
            + (f"{own:.3f} {src}{agree}" if own is not None else "n/a")))
    part.method = (f"weak: one sweep `scalelab-train -m {' '.join(map(shell_arg, args[:-1]))}` ({len(recs)} jobs, {wall:.0f} s), "
                   "8 samples per rank (tp/pipeline: one batch of 16 per 2-rank group); efficiency = thr(strategy@2) / "
                   "(2 x thr(single@1)) from the run.json files (samples/s, steady steps), and vs the strategy's own "
                   "@1 run, which is sweep.json's weak group where it has one")

    # model states of the same sweep's 2-rank runs
    from scalelab.plan.run_records import terms_from_run
    from scalelab.plan.spec import get_strategy

    for s in WEAK_STRATEGIES[1:]:
        r = by.get((s, 2))
        if not r or r.get("status") != "completed":
            states.rows.append(Row(f"states:{s}", f"model states per rank, {s}@2", "failed", "no completed run"))
            continue
        per_rank = r["memory"]["model_state_bytes_per_rank"]
        meas = max(per_rank)
        terms = terms_from_run(r)
        planner = terms.states.total_bytes
        psi, n = terms.states.params_per_device, int(r["parallel"].get("dp", 1))
        strat = get_strategy(s)
        # ZeRO paper, fp32 Adam: params 4 Psi, grads 4 Psi, Adam m+v 8 Psi; a ZeRO stage divides
        # what it shards by N_d (ZeRO-1 optimizer, ZeRO-2 + grads, ZeRO-3/FSDP + params)
        paper = psi * (4 / (n if strat.shard_params else 1) + 4 / (n if strat.shard_grads else 1)
                       + 8 / (n if strat.shard_optimizer else 1))
        bd = r["memory"]["model_state_breakdown_per_rank"][per_rank.index(meas)]
        states.rows.append(Row(
            f"states:{s}", f"model-state bytes per rank, {s}@2: measured / ZeRO formula", f"{meas / paper:.3f}",
            f"measured {kib(meas)} (p/g/o {kib(bd['params'])}/{kib(bd['grads'])}/{kib(bd['optimizer'])}), "
            f"formula {kib(paper)} (Psi/device {psi:.0f}, N_d {n}), planner {kib(planner)}: "
            f"measured / planner {meas / planner:.3f}"))
    states.method = ("states: the weak sweep's 2-rank runs; measured = max over ranks of run.json "
                     "memory.model_state_bytes_per_rank (params + grads + optimizer state as each strategy holds them "
                     "after the first step); ZeRO formula (Rajbhandari et al. 2020) for fp32 Adam: 4 Psi params + 4 Psi "
                     "grads + 8 Psi Adam, the sharded terms / N_d (zero1: opt, zero2: opt + grads, zero3 and fsdp: all), "
                     "Psi = parameters per device (tp: the rank's slice; pipeline: the largest stage); planner = "
                     "plan.model_states via plan.run_records.terms_from_run (DeepSpeed's fp32 master copy, ZeRO-1 "
                     "gradient partition, ZeRO-3 persistent small tensors)")
    states.data = {"from": str(sweep)}


def part_startup(st: Settings, work: Path, part: Part) -> None:
    raw = startup.measure(st.startup_reps, st.startup_steps, warm=False)
    q = startup.ratios(raw)
    part.data = {"ratios": q}
    for key, name, goal in (("first", "launch -> first optimizer step", "<= 1.5"), ("whole", "whole job", "<= 1.3")):
        part.rows.append(Row(f"startup:{key}", f"start-up, {name}: platform / bare ({st.startup_steps} steps)",
                             f"{q[key]:.2f}", f"{q[key + '_s']['platform']:.2f} s / {q[key + '_s']['bare']:.2f} s; "
                             f"per repetition {', '.join(f'{x:.2f}' for x in q[key + '_per_rep'])}", goal))
        part.rows.append(Row(f"startup:torchrun_{key}", f"start-up, {name}: launcher=torchrun_local / bare",
                             f"{q['torchrun_' + key]:.2f}", f"{q[key + '_s']['torchrun']:.2f} s / "
                             f"{q[key + '_s']['bare']:.2f} s; per repetition "
                             f"{', '.join(f'{x:.2f}' for x in q['torchrun_' + key + '_per_rep'])}"))
    part.method = (f"startup: benchmarks/startup.py measure(reps={st.startup_reps}, steps={st.startup_steps}) "
                   "(2-rank gpt_nano DDP: bare torchrun script, launcher=local, launcher=torchrun_local, interleaved; "
                   "its unmeasured warm-up runs skipped: the parts before ran both kinds); seconds from the launching "
                   "command's start to the first optimizer step (run.json timing marks / the script's own) and to the "
                   "command's end; ratio of the medians over the repetitions")


def part_sweepcost(st: Settings, work: Path, part: Part) -> None:
    common = ["model=gpt_nano", f"trainer.max_steps={st.cost_steps}"]
    lone = []
    half = (len(st.cost_lone) + 1) // 2

    def run_lone(items):
        for s, n in items:
            w, _ = train([f"strategy={s}", f"trainer.devices={n}", *common,
                          f"hydra.run.dir={work / f'lone-{s}-{n}'}"], work)
            lone.append(w)

    run_lone(st.cost_lone[:half])             # lone commands before and after the sweep
    sweep_wall, _ = train(["strategy=single,ddp", "trainer.devices=1,2", *common,
                           f"hydra.sweep.dir={work / 'cost-sweep'}"], work, multirun=True)
    run_lone(st.cost_lone[half:])
    per_job, lone_mean = sweep_wall / 4, statistics.fmean(lone)
    part.data = {"sweep_wall_s": sweep_wall, "lone_wall_s": lone}
    part.rows.append(Row("sweepcost", f"per-job wall time in a 4-job sweep / a lone command ({st.cost_steps} steps)",
                         f"{per_job / lone_mean:.2f}",
                         f"sweep {sweep_wall:.1f} s / 4 = {per_job:.2f} s per job; lone command {lone_mean:.2f} s "
                         f"(mean of {len(lone)}: {', '.join(f'{w:.1f}' for w in lone)})"))
    part.method = (f"sweepcost: wall time of `scalelab-train -m strategy=single,ddp trainer.devices=1,2 "
                   f"{' '.join(common)}` (one fork server and one import of the worker for the 4 jobs) / 4, against "
                   f"the mean wall time of {'the same jobs' if len(lone) == 4 else 'single@1'} each run as its own "
                   "command (before and after the sweep)")


def part_default(st: Settings, work: Path, part: Part, deadline: float, est_full_s: float | None) -> None:
    """`-m experiment=default`, with its 30 steps unless the estimate does not fit the budget or
    the ~3-minute cap; then fewer steps (the row says so)."""
    steps = st.default_steps
    room = min(st.default_cap_s, deadline - time.time())
    fixed = 4 * 4.0                     # ~4 s per job besides training (start-up, record, exit)
    note = ""
    if est_full_s and est_full_s > room and not st.quick:
        steps = max(10, int(30 * (room - fixed) / max(1.0, est_full_s - fixed)))
        note = f"; cut from 30 steps: estimated {est_full_s:.0f} s > {room:.0f} s left/cap"
    elif st.quick:
        note = " (quick: 6 steps, not the experiment's 30)"
    warm = 5 if steps >= 20 else 1
    args = ["experiment=default", f"trainer.max_steps={steps}", f"trainer.warmup_steps={warm}",
            f"hydra.sweep.dir={work / 'default'}"]
    wall, _ = train(args, work, multirun=True)
    recs = records(work / "default")
    part.data = {"wall_s": wall, "steps": steps, "estimate_full_s": est_full_s}
    part.rows.append(Row("default", f"wall time, `scalelab-train -m experiment=default` ({steps} steps)",
                         f"{wall:.1f} s", f"{len(recs)} jobs (gpt_small, single/ddp x 1/2 ranks), "
                         f"{wall / max(1, len(recs)):.1f} s per job{note}", "~3 min"))
    part.method = (f"default: wall time of `scalelab-train -m experiment=default trainer.max_steps={steps} "
                   f"trainer.warmup_steps={warm}` (`make run` also logs to W&B offline; here logger=none)")


# ------------------------------------------------------------------------------------------ output
def host_line() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    try:
        import importlib.metadata as md

        tv = md.version("torch")
    except Exception:  # noqa: BLE001
        tv = "?"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=REPO).stdout.strip()
        rev = f"{rev}{' + uncommitted changes' if dirty else ''}"
    except OSError:
        rev = "?"
    return f"{os.cpu_count()} cores ({cpu}), torch {tv}, Python {platform.python_version()}, git {rev}"


def render(parts: list[Part], header: dict) -> str:
    out = [f"# ScaleLab benchmarks, {header['date']}{' (--quick)' if header['quick'] else ''}", "",
           f"Command: `{header['command']}`; host: {header['host']}; total {header['total_s']:.0f} s; "
           f"load averages (1/5/15 min) at start {header['load_start']}, at end {header['load_end']}.", "",
           "| key | figure | value | detail | goal | load (1 min, part start->end) |",
           "|---|---|---|---|---|---|"]
    for p in parts:
        for r in p.rows:
            cells = [r.key, r.figure, r.value, r.detail, r.goal or "-", r.load]
            out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    out += ["", "How each figure was measured (time per part: " + ", ".join(f"{p.name} {p.seconds:.0f} s" for p in parts)
            + "):", ""]
    out += [f"- {p.method}" for p in parts if p.method]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition, few steps: a smoke run of every part")
    ap.add_argument("--out", help="markdown file to write (default outputs/benchmarks/<time>.md)")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole command (default 560; --quick 240): the default experiment "
                         "gets fewer steps when it would not fit")
    ap.add_argument("--keep", help="keep the jobs' outputs in this folder (default: a temporary folder, removed)")
    a = ap.parse_args(argv)
    st = Settings.make(a.quick)
    t0 = time.time()
    budget = a.budget or (240.0 if a.quick else 560.0)
    deadline = t0 + budget
    stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = Path(a.out) if a.out else REPO / "outputs" / "benchmarks" / f"{stamp}.md"
    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    work = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="scalelab-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    failed = False

    def run(part: Part, fn, *args) -> None:
        nonlocal failed
        l0, t = load1(), time.perf_counter()
        print(f"[run_all] {part.name} ...", file=sys.stderr, flush=True)
        try:
            fn(*args)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one failed part must not hide the others
            failed = True
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            print(f"[run_all] {part.name} failed:\n{e}", file=sys.stderr, flush=True)
            why = lines[0][:200] + (f" ... {lines[-1][:200]}" if len(lines) > 1 else "")   # what failed ... the exception
            part.rows.append(Row(f"{part.name}:error", f"{part.name} failed", "failed", why))
        part.seconds, part.load = time.perf_counter() - t, (l0, load1())
        for r in part.rows:
            r.load = f"{l0:.2f}->{part.load[1]:.2f}"
        print(f"[run_all] {part.name}: {part.seconds:.0f} s, load {l0:.2f}->{part.load[1]:.2f}", file=sys.stderr, flush=True)

    try:
        thr = Part("throughput")
        run(thr, part_throughput, st, work, thr)
        parts.append(thr)
        weak, states = Part("weak"), Part("states")
        run(weak, part_weak, st, work, weak, states)
        states.seconds, states.load = 0.0, weak.load
        for r in states.rows:
            r.load = f"{weak.load[0]:.2f}->{weak.load[1]:.2f}"
        parts += [weak, states]
        su = Part("startup")
        run(su, part_startup, st, work, su)
        parts.append(su)
        cost = Part("sweepcost")
        run(cost, part_sweepcost, st, work, cost)
        parts.append(cost)
        # the default experiment ~ 4.5 platform gpt_small jobs of 30 steps (measured: 4 jobs, the
        # 1-rank ones doing 16 samples per step on one core)
        walls = thr.data.get("platform_job_wall_s") or []
        est = 4.5 * statistics.median(walls) * (30 / st.thr_steps) if walls and st.thr_model == "gpt_small" else None
        dflt = Part("default")
        run(dflt, part_default, st, work, dflt, deadline, est)
        parts.append(dflt)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    header = {"date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "quick": a.quick,
              "command": ".venv/bin/python benchmarks/run_all.py" + (" --quick" if a.quick else ""),
              "host": host_line(), "total_s": time.time() - t0, "load_start": load_start,
              "load_end": "/".join(f"{x:.2f}" for x in os.getloadavg())}
    text = render(parts, header)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written: {out}")
    if a.json:
        Path(a.json).write_text(json.dumps({"header": header, "parts": [
            {"name": p.name, "seconds": p.seconds, "load": p.load, "rows": [r.__dict__ for r in p.rows], "data": p.data}
            for p in parts]}, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
