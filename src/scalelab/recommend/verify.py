"""Checking the planner's best candidates with short real runs, through the normal sweep machinery.

The K candidates differ in several keys at once (strategy, degrees, batch split), which one
command-line sweep (a cartesian product) cannot express. Each candidate becomes one option of a
config group written next to the results (`OUT/conf/recommend_candidate/cI.yaml`, a
`# @package _global_` overlay like an experiment: `override /strategy: ...` plus its keys), and one
ordinary multirun runs them all:

    scalelab-train -m logger=none [--train-args] +recommend_candidate=c0,c1,c2 \
        hydra.searchpath=[file://OUT/conf] hydra.sweep.dir=OUT/verify trainer.max_steps=N ...

so every job is validated by preflight before the first starts, launched by the configured
launcher (local ranks, or SLURM with `--slurm`), writes its run.json, and the sweep gets its
sweep.json and report.html. The LR check is a plain multirun of the winner's own overrides over
the LR grid (recommend/lr.py). Results are read back from run.json only.
"""
from __future__ import annotations

import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from scalelab.plan.run_records import gpu_run, predicted_rss, speed_factor
from scalelab.plan.hardware import Hardware
from scalelab.plan.spec import PlanError

from .rank import score, tokens_per_s
from .space import Candidate

GROUP = "recommend_candidate"


def _groups() -> set[str]:
    """Config groups of conf/ (an override `GROUP=NAME` selects an option; other keys are values)."""
    from scalelab.paths import conf_dir

    return {p.name for p in conf_dir().iterdir() if p.is_dir()}


def overlay(overrides: list[str]) -> str:
    """A `# @package _global_` config equal to these overrides: group choices become defaults-list
    overrides, dotted keys nested values (parsed as YAML scalars, as Hydra parses them)."""
    defaults, values, groups = [], {}, _groups()
    for o in overrides:
        key, value = o.split("=", 1)
        if key in groups:
            defaults.append({f"override /{key}": value})
            continue
        node = values
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    doc = {"defaults": defaults, **values} if defaults else values
    return "# @package _global_\n" + yaml.safe_dump(doc, sort_keys=False)


def train_argv() -> list[str]:
    """`scalelab-train` of this interpreter (the console script's module)."""
    return [sys.executable, "-m", "scalelab.train"]


def slurm_overrides(cands: list[Candidate], kind: str = "gpu") -> list[str]:
    """The SLURM launcher for these candidates' jobs: scalelab's own (hydra/launcher=slurm), one
    sbatch job per candidate with that candidate's nodes x devices, its ranks one srun step of the
    job, the job's hydra.searchpath (the candidates' config group) carried into its script.
    hydra-submitit-launcher's submitit_slurm ran the Hydra job under srun once per node (N copies
    of the multirun job), nested the ranks' srun step inside its own (which holds the CPUs: refused
    or waiting forever) and warned with USR2, which the ranks do not handle (found by review).
    A CPU profile's jobs are CPU jobs: no GPUs asked for (sbatch refuses them on a CPU partition),
    one CPU per rank unless --train-arg hydra.launcher.cpus_per_task=N."""
    return ["hydra/launcher=slurm", *(["trainer.accelerator=cpu"] if kind == "cpu" else [])]


def candidates_command(cands: list[Candidate], overrides: list[list[str]], out: Path, steps: int,
                       extra: list[str], repeats: int = 1) -> list[str]:
    """Write the candidates' config group under OUT/conf; the multirun's argv (after scalelab-train).
    With repeats > 1 the seed is swept first, so Hydra runs the candidates in turn (c0 c1 c2 c0 c1
    c2 ...): a host that slows down for a while slows every candidate, not one."""
    group = out / "conf" / GROUP
    group.mkdir(parents=True, exist_ok=True)
    for i, ov in enumerate(overrides):
        (group / f"c{i}.yaml").write_text(overlay(ov))
    names = ",".join(f"c{i}" for i in range(len(cands)))
    seeds = [f"seed={','.join(str(1234 + i) for i in range(repeats))}"] if repeats > 1 else []
    return ["-m", *with_extra(extra), *seeds, f"+{GROUP}={names}", f"hydra.searchpath=[file://{(out / 'conf').resolve()}]",
            f"hydra.sweep.dir={(out / 'verify').resolve()}", *short_run(steps)]


def with_extra(extra: list[str]) -> list[str]:
    """The start of a verification or LR-check multirun's overrides: no logger unless --train-arg
    gives one, then the --train-args. The short run's own keys (short_run, the repeats' seeds) come
    after them and win in these jobs (Hydra keeps a key's last value): a --train-arg
    trainer.max_steps=5000 is the printed command's, not the 12-step check's (it was the check's,
    reported as 12 steps)."""
    return ["logger=none", *extra]


def short_run(steps: int) -> list[str]:
    """A short job whose figures still have measured steps: warm-up 1/4 (at least 2), 2 profiled."""
    warm = max(2, steps // 4)
    return [f"trainer.max_steps={steps}", f"trainer.warmup_steps={warm}", "trainer.profile_steps=2"]


# Keys recommend itself sets in a job (space.train_overrides, lr.advice, this module's sweep), and
# the flag that chooses each: a --train-arg of one overrode the candidate in the verified jobs (the
# ddp row measured zero3) and clashed with the printed command.
SET_BY = {"strategy": "--strategies", "model": "--model or the shape flags", "trainer.devices": "--devices",
          "trainer.num_nodes": "--nodes", "data.global_batch_size": "--global-batch",
          "data.micro_batch_size": "the search (it picks each layout's split)", "trainer.precision": "--precision",
          "optim": "--optimizer", "optim.lr": "--base-lr", "lr_scaling": "the LR advice (--base-lr, --base-batch)",
          "hardware_profile": "--hardware", "launcher": "the candidate (srun on several nodes) and --slurm",
          "model.arch.activation_checkpointing": "--activation-checkpointing", GROUP: "--verify",
          "hydra.searchpath": "--verify", "hydra.sweep.dir": "--out"}


def set_by(key: str, slurm: bool = False) -> str | None:
    """The flag that sets KEY in recommend's jobs (None: free for --train-arg)."""
    k = key.lstrip("+~")
    if slurm and k == "hydra/launcher":
        return "--slurm"
    for name in (k, *(k.rsplit(".", i)[0] for i in range(1, k.count(".") + 1))):   # the key, then its parents
        if name in SET_BY and (name == k or name not in OWN_KEYS_FREE):
            return SET_BY[name]
    return None


# Groups recommend chooses whose other keys stay the user's: `--optimizer` picks optim=NAME and
# the advice sets optim.lr, but optim.optimizer.weight_decay or optim.fused_on_gpu are free
OWN_KEYS_FREE = {"optim"}


def check_train_args(extra: list[str], req, steps: int | None, slurm: bool = False) -> None:
    """Every --train-arg before the search (it was refused after ~5 s of search and a printed table):
    KEY=VALUE, one value, not a key recommend sets, and the job composes and validates with it
    (the verification's short run when steps is given) for the profile's device kind."""
    from scalelab.plan_job import check_job

    for e in extra:
        if "=" not in e:
            raise PlanError(f"--train-arg {e!r} is not KEY=VALUE")
        key, value = e.split("=", 1)
        by = set_by(key, slurm)
        if by:
            raise PlanError(f"--train-arg {e}: recommend chooses {key.lstrip('+~')} for each job; "
                            f"set it with {by}")
        if "," in value and not value.startswith("["):
            raise PlanError(f"--train-arg {e}: a sweep value (a,b) would run each job several times; give one "
                            "value (a list is KEY=[a,b])")
    job = [e for e in extra if not e.lstrip("+~").startswith("hydra")]   # launcher settings: preflight's
    if job:
        base = [f"model={req.model_name}"] if req.model_name else []
        try:
            check_job([*base, *(short_run(steps) if steps else []), *job], req.hardware.kind,
                      one_job="recommend runs one job per candidate, its layout its own; give the settings you "
                              "want from the experiment as --train-arg KEY=VALUE")
        except PlanError as exc:
            raise PlanError(f"--train-arg is not valid: {exc}") from None


def preflight_or_raise(argv: list[str]) -> None:
    """Validate every job of the multirun here, as scalelab-train's preflight would, so that a bad
    --train-arg is one line before any process starts (the command's fork server included)."""
    from scalelab.errors import ConfigError
    from scalelab.preflight import preflight

    # jobs for a SLURM launcher run elsewhere: validated for the devices they ask for (train.py's rule)
    elsewhere = any(a.startswith("hydra/launcher=") and a != "hydra/launcher=basic" for a in argv)
    try:
        preflight(argv, data=False, elsewhere=elsewhere)
    except ConfigError as exc:
        raise PlanError(f"a verification job is not valid: {exc}") from None


def run_multirun(argv: list[str], log: Path) -> int:
    """Run `scalelab-train ARGV`, its output to LOG. Returns the exit code (1: some job failed,
    the others recorded; 2: preflight refused the command, nothing ran)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.write("$ scalelab-train " + " ".join(argv) + "\n")
        fh.flush()
        return subprocess.run([*train_argv(), *argv], stdout=fh, stderr=subprocess.STDOUT).returncode


def last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("error")]
    return lines[-1] if lines else "see " + str(log)


def records_by_candidate(sweep: Path) -> dict[int, list[dict]]:
    """run.json of each job of the verification sweep, keyed by candidate index (its cI option)."""
    from scalelab.results.record import read_records

    out: dict[int, list[dict]] = {}
    for rec in read_records([sweep], []):
        for o in (rec.get("job") or {}).get("overrides") or []:
            m = re.fullmatch(rf"\+?{GROUP}=c(\d+)", o)
            if m:
                out.setdefault(int(m.group(1)), []).append(rec)
    return out


def measured_row(c: Candidate, recs: list[dict], objective: str, hw: Hardware, tokens: float | None) -> dict:
    """Predicted vs measured for one verified candidate (the median over its repeats). On a CPU the
    prediction is also given at the runs' own host speed (their matmul probe;
    plan/run_records.speed_factor) smoothed over the sweep's neighbouring jobs by measured_ranking
    (smooth_host_speeds), as `--validate` does."""
    pred_step = c.times["step_s"]
    row = {"predicted_step_s": pred_step, "predicted_tokens_per_s": tokens_per_s(c),
           "predicted_score": score(c, objective, hw, tokens), "status": "not run", "runs": len(recs)}
    if not recs:
        return row
    ok = [r for r in recs if r.get("status") == "completed" and measured_tokens_per_s(r, c)
          and (r.get("step_time_s") or {}).get("median")]
    bad = [r for r in recs if r not in ok]
    # "completed 2 of 3": the medians below are over the runs that completed, not every repeat
    row.update(status=(f"completed {len(ok)} of {len(recs)}" if bad else "completed") if ok
               else (bad[0].get("status") or "failed"),
               error=bad[0].get("error") if bad else None, run_dirs=[(r.get("job") or {}).get("dir") for r in recs])
    if not ok:
        return row
    tps_runs = [measured_tokens_per_s(r, c) for r in ok]
    tps = statistics.median(tps_runs)
    step = statistics.median(float(r["step_time_s"]["median"]) for r in ok)
    speed = statistics.median(speed_factor(r, c.terms, hw) for r in ok)
    peaks = [max(p) for r in ok for p in [(r.get("memory") or {}).get("peak_device_bytes_per_rank")
                                          or (r.get("memory") or {}).get("peak_rss_bytes_per_rank") or []] if p]
    # memory drove the search (layouts that do not fit were pruned): predicted vs measured as
    # plan --validate has it: a GPU run's device peak against the device total, a CPU run's peak
    # RSS against what the planner puts in a rank's RAM plus the runtime's
    gpu = any(gpu_run(r) for r in ok)
    pred_mem = c.memory_bytes if gpu else predicted_rss(c.terms, hw)
    key = "peak_device_bytes_per_rank" if gpu else "peak_rss_bytes_per_rank"
    meas_mem = [max((r.get("memory") or {}).get(key) or [0]) for r in ok]
    meas_mem = [m for m in meas_mem if m]
    row.update(measured_step_s=step, measured_tokens_per_s=tps, measured_score=score(c, objective, hw, tokens, tps=tps),
               measured_tokens_per_s_runs=tps_runs,
               step_ratio=pred_step / step, host_speed_factor=speed, step_ratio_at_host_speed=pred_step / speed / step,
               measured_peak_bytes=max(peaks) if peaks else None, predicted_total_bytes=c.memory_bytes,
               memory_measure="device peak" if gpu else "peak RSS", predicted_memory_bytes=pred_mem,
               measured_memory_bytes=statistics.median(meas_mem) if meas_mem else None,
               memory_ratio=pred_mem / statistics.median(meas_mem) if meas_mem else None,
               loss_final=_median([finite_loss((r.get("loss") or {}).get("final")) for r in ok]),
               loss_diverged=sum(diverged(r.get("loss")) for r in ok),
               short_run=any(bool(r.get("short_run")) for r in ok))
    return row


def _median(values: list) -> float | None:
    """The median of the values that are not None (None: none is)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measured_tokens_per_s(rec: dict, c: Candidate) -> float | None:
    """A run's tokens/s in the planner's unit (rank.tokens_per_s: global batch x the model's seq_len
    per step): the record's own figure, else samples/s x seq_len. A classify (MLP) run records
    tokens_per_s null, and its planned seq_len is 1 (a sample is one token), so every MLP
    verification read "No verification run completed"."""
    thr = rec.get("throughput") or {}
    if thr.get("tokens_per_s"):
        return float(thr["tokens_per_s"])
    if thr.get("samples_per_s"):
        return float(thr["samples_per_s"]) * c.terms.model.seq_len
    return None


def lr_rows(sweep: Path, varied: str) -> list[dict]:
    """One row per LR-check run: the varied value, the LR used, final loss, and its loss curve;
    `diverged` when its loss went NaN/inf (diverged()): its tail mean is then None, never a score."""
    from scalelab.results.record import finite, read_records

    rows = []
    for rec in sorted(read_records([sweep], []), key=lambda r: (r.get("job") or {}).get("num", 0)):
        loss = rec.get("loss") or {}
        value = rec.get("lr_rule") if varied == "lr_scaling" else rec.get("base_lr")
        # an older record's NaN/inf is None here, as run.json now writes it: recommendation.json stays JSON
        curve = finite(loss.get("curve") or [])
        rows.append({"value": value, "lr_rule": rec.get("lr_rule"), "base_lr": rec.get("base_lr"),
                     "lr": rec.get("lr"), "status": rec.get("status"), "error": rec.get("error"),
                     "loss_first": finite_loss(loss.get("first")), "loss_final": finite_loss(loss.get("final")),
                     "loss_tail": tail_mean(curve), "diverged": diverged(loss),
                     "curve": curve, "run_dir": (rec.get("job") or {}).get("dir")})
    return rows


def best_lr_run(rows: list[dict]) -> dict | None:
    """The LR-check run with the lowest tail loss among those that completed and did not diverge
    (a diverged run's last finite losses are often its lowest: it was picked). None: no such run."""
    ok = [r for r in rows if r["status"] == "completed" and not r.get("diverged") and r["loss_tail"] is not None]
    return min(ok, key=lambda r: r["loss_tail"]) if ok else None


def finite_loss(v) -> float | None:
    """V as a float where it is a finite number; else None (a null: run.json writes NaN/inf as null
    since results/record.finite; or an older record's NaN/inf itself)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def diverged(loss: dict | None) -> bool:
    """Whether a run's `loss` (run.json) went NaN/inf: a curve point that is null (NaN/inf written
    as null) or not finite (older records), or a final loss null while there is a curve, or NaN/inf."""
    loss = loss or {}
    curve = loss.get("curve") or []
    if any(finite_loss(p[1]) is None for p in curve if isinstance(p, (list, tuple)) and len(p) == 2):
        return True
    final = loss.get("final")
    return (final is None and bool(curve)) or (final is not None and finite_loss(final) is None)


def tail_mean(curve: list, fraction: float = 0.25) -> float | None:
    """Mean training loss over the last `fraction` of the steps: one step's loss is one batch's,
    noisier than the differences between LRs a short check can show. None for no curve, and for a
    curve with a null or NaN/inf loss (diverged): the mean of its finite losses would score a
    diverged run on its last losses before it went NaN, often its lowest."""
    losses = [finite_loss(v) for _, v in curve]
    if not losses or any(v is None for v in losses):
        return None
    tail = losses[-max(1, round(len(losses) * fraction)):]
    return sum(tail) / len(tail)
