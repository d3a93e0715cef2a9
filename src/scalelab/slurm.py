"""`scalelab slurm render|submit`: an sbatch script for one run (multi-node via srun), `--array`
for several override sets, `--wait` to block until done and print the comparison table.

The same script (slurm/run.sbatch.template) runs each job of a sweep launched with
`hydra/launcher=slurm` (hydra_plugins/scalelab_slurm_launcher). Every value that reaches the
script is shell-quoted; a #SBATCH value with a line break or control character is refused (a line
break would start a new script line). --setup lines go in as shell lines: one that writes a secret's
value into the script (which SLURM keeps) is refused, as a secret-named override is. Requeue and
resume: scalelab.requeue."""
from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from scalelab.paths import REPO_ROOT, cache_dir
from scalelab.slurm_jobs import finalize, wait
from scalelab.slurm_request import check_times, directives, test_only

TEMPLATE = REPO_ROOT / "slurm" / "run.sbatch.template"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def sbatch_value(name: str, value) -> str:
    """A #SBATCH option's value, quoted as sbatch parses it (submitit does the same); ValueError for
    a line break or control character."""
    text = str(value)
    if _UNSAFE.search(text) or not text:
        raise ValueError(f"{name}={text!r} is not valid: a #SBATCH value must be non-empty, on one line, "
                         "without control characters")
    return shlex.quote(text)


def check_job_name(name: str, flag: str) -> None:
    """The job name is part of its log's file name (--output=<log dir>/<name>-%j.out): a `/` put the
    log in a folder nobody made, and the job failed with no log at all."""
    if "/" in str(name):
        raise ValueError(f"{flag}={name!r} has a '/': it names the job's log file, not a folder "
                         "(give the folder with --log-dir)")


def render(nodes: int, devices: int, overrides: list[str], gpus: int | bool, time: str, partition: str | None,
           cpus_per_task: int, job_name: str, log_dir: str, *, account: str | None = None, qos: str | None = None,
           setup: list[str] = (), signal_delay_s: int = 90, array: list[list[str]] | None = None,
           run_dir: str | None = None, stamp: str | None = None, sweep: tuple[str, int] | None = None,
           gres: bool = False) -> str:
    """The batch script. run_dir: the job's run dir (a sweep job's); else one keyed by the job id
    under log_dir (`<id>-<stamp>`; an array's tasks under `<array id>-<stamp>/<task>`).
    array: one override list per array task. sweep: (sweep dir, job number) for a sweep's job.
    gres: the GPUs as --gres=gpu:N (a site without select/cons_tres refuses --gpus-per-node)."""
    gpus = devices if gpus is True else int(gpus or 0)
    lines = [f"#SBATCH --{k}={sbatch_value('--' + k, v)}\n" for k, v in
             (("gpus-per-node", gpus if gpus and not gres else None), ("gres", f"gpu:{gpus}" if gpus and gres else None),
              ("partition", partition), ("account", account), ("qos", qos),
              ("time", time), ("array", f"0-{len(array) - 1}" if array else None)) if v]
    log = Path(log_dir).resolve()
    stamp = stamp or datetime.now().strftime("%Y%m%d-%H%M%S")
    job_id = '"$SLURM_ARRAY_JOB_ID"' if array else '"$SLURM_JOB_ID"'
    if run_dir is not None:
        run = f"export SCALELAB_RUN_DIR={shlex.quote(run_dir)}"
    elif array:
        run = (f"export SCALELAB_SWEEP_DIR={shlex.quote(str(log))}/{job_id}-{stamp} "
               'SCALELAB_JOB_NUM="$SLURM_ARRAY_TASK_ID"\nexport SCALELAB_RUN_DIR="$SCALELAB_SWEEP_DIR/$SLURM_ARRAY_TASK_ID"')
    else:
        run = f"export SCALELAB_RUN_DIR={shlex.quote(str(log))}/{job_id}-{stamp}"
    if sweep is not None:
        run += f"\nexport SCALELAB_SWEEP_DIR={shlex.quote(sweep[0])} SCALELAB_JOB_NUM={int(sweep[1])}"
    block = ""
    if array:
        cases = "".join(f"  {i}) set -- {' '.join(shlex.quote(o) for o in s)} ;;\n" for i, s in enumerate(array))
        block = (f'case "$SLURM_ARRAY_TASK_ID" in\n{cases}  *) echo "no override set for array task '
                 '$SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;\nesac\n')
    output = log / (f"{job_name}-%A_%a.out" if array else f"{job_name}-%j.out")
    user_dir = any(o.startswith("hydra.run.dir=") for o in overrides)
    return TEMPLATE.read_text().format(
        job_name=sbatch_value("--job-name", job_name), nodes=int(nodes), devices=int(devices),
        cpus_per_task=int(cpus_per_task), sbatch_lines="".join(lines), output=sbatch_value("--output", output),
        signal_delay_s=int(signal_delay_s), workdir=shlex.quote(str(Path.cwd())), cache=shlex.quote(str(cache_dir())),
        setup="".join(f"{s}\n" for s in setup), run_dir=run, array_block=block, python=shlex.quote(sys.executable),
        overrides=" ".join(shlex.quote(o) for o in overrides),
        run_dir_override="" if user_dir else "'hydra.run.dir=${oc.env:SCALELAB_RUN_DIR}'").rstrip() + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["render", "submit"])
    p.add_argument("--nodes", type=int, help="nodes (default: trainer.num_nodes=N among the overrides, else 1)")
    p.add_argument("--devices", type=int, help="ranks (GPUs) per node (default: trainer.devices=N among the "
                                              "overrides, else 1)")
    p.add_argument("--cpu", action="store_true", help="no GPUs (gloo ranks on CPU cores)")
    p.add_argument("--gres", action="store_true", help="ask for the GPUs as --gres=gpu:N, not --gpus-per-node=N "
                                                       "(sites without select/cons_tres)")
    p.add_argument("--time", default="01:00:00")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--qos")
    p.add_argument("--cpus-per-task", type=int, help="CPUs per rank (default: 1 with --cpu, else 8)")
    p.add_argument("--signal-delay", type=int, default=90, metavar="S",
                   help="USR1 this many seconds before the time limit: save, requeue, resume (default 90)")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line run before the job (e.g. 'module load cuda'); repeatable")
    p.add_argument("--job-name", default="scalelab")
    p.add_argument("--log-dir", default="outputs/slurm", help="sbatch logs and the runs (<job id>-<time>/)")
    p.add_argument("--array", action="append", metavar="'K=V K=V'",
                   help="one override set per array task (repeatable; the positional overrides apply to all)")
    p.add_argument("--wait", action="store_true", help="submit: block until done, then print the comparison table")
    p.add_argument("--out", help="write the script here (render) instead of stdout")
    p.add_argument("overrides", nargs="*", help="scalelab-train overrides, e.g. strategy=fsdp model=gpt_small")


def run(args: argparse.Namespace) -> int:
    from scalelab.errors import ConfigError
    from scalelab.preflight import preflight

    try:
        sets = [shlex.split(a) for a in args.array or []]
        if any(o.startswith("hydra.run.dir=") for o in [*args.overrides, *sum(sets, [])]) and sets:
            raise ValueError("hydra.run.dir cannot be given with --array: each task gets its own run dir")
        layout = [_layout(args.nodes, [*args.overrides, *s], "trainer.num_nodes", "--nodes") for s in sets or [[]]]
        layout_d = [_layout(args.devices, [*args.overrides, *s], "trainer.devices", "--devices") for s in sets or [[]]]
        if len(set(layout)) > 1 or len(set(layout_d)) > 1:
            raise ValueError(f"--array sets give different layouts (trainer.num_nodes {sorted(set(layout))}, "
                             f"trainer.devices {sorted(set(layout_d))}): one array has one layout; submit them apart")
        nodes, devices = layout[0], layout_d[0]
        if args.cpus_per_task is not None and args.cpus_per_task < 1:
            raise ValueError(f"--cpus-per-task {args.cpus_per_task} must be >= 1")
        check_times(args.time, args.signal_delay)
        for name in ("job_name", "time", "partition", "account", "qos"):
            if getattr(args, name) is not None:
                sbatch_value("--" + name.replace("_", "-"), getattr(args, name))
        check_job_name(args.job_name, "--job-name")
        refuse_secrets([*args.overrides, *sum(sets, [])])
        refuse_secret_lines(args.setup)
        refuse_decided([*args.overrides, *sum(sets, [])], args.cpu)
        if args.out and args.action == "submit":
            raise ValueError(f"--out {args.out} is for render: submit keeps its script under --log-dir {args.log_dir}")
        run_dir = next((_unquoted(o.split("=", 1)[1]) for o in args.overrides if o.startswith("hydra.run.dir=")), None)
        if run_dir is not None and "${" in run_dir and args.wait:
            raise ValueError(f"hydra.run.dir={run_dir} is resolved in the job (an interpolation), so --wait cannot "
                             "find its run: give a plain path, or leave the run dir to --log-dir")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    layout_keys = ("trainer.devices=", "trainer.num_nodes=")
    overrides = [o for o in args.overrides if not o.startswith(layout_keys)]
    sets = [[o for o in s if not o.startswith(layout_keys)] for s in sets]
    try:  # the same validation as a local run, for the SLURM layout (each array set)
        # (for the allocation's devices, not this login node's, which may have no GPU)
        # submit prepares the data here, as a hydra/launcher=slurm sweep does: compute nodes often
        # have no internet for data=hub (the job would fail after its queue wait), and the tasks of
        # an array would all prepare it at once. The cache must be on a file system the nodes share.
        for s in sets or [[]]:
            preflight([*overrides, *s, "launcher=srun", f"trainer.devices={devices}", f"trainer.num_nodes={nodes}",
                       *(["trainer.accelerator=cpu"] if args.cpu else [])], data=args.action == "submit",
                      elsewhere=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from scalelab.paths import out_problem, path_problem, write_out

    problem = ((args.action == "render" and args.out and out_problem(args.out, "--out"))
               or path_problem(args.log_dir, "--log-dir", folder=True))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.cpu and not any(o.lstrip("+").startswith("trainer.accelerator=") for o in overrides):
        overrides.append("trainer.accelerator=cpu")  # a CPU job on a GPU node must not take the GPUs
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    cpus = cpus_per_task(args.cpus_per_task, args.cpu)
    script = render(nodes, devices, overrides, not args.cpu, args.time, args.partition, cpus,
                    args.job_name, args.log_dir, account=args.account, qos=args.qos, setup=args.setup,
                    signal_delay_s=args.signal_delay, array=sets or None, stamp=stamp, gres=args.gres)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)  # sbatch does not create --output's folder
    if args.action == "render":
        if args.out:
            write_out(args.out, script)
            print(f"wrote {args.out}")
        else:
            print(script, end="")
        return 0
    try:
        job = submit(script, Path(args.log_dir) / f"{args.job_name}-{stamp}.sbatch",
                     asked=asked(nodes, devices, cpus, 0 if args.cpu else devices, args.partition, args.time))
    except ValueError as e:   # the scheduler could never start it: nothing submitted
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped (Ctrl-C) before the job was submitted", file=sys.stderr)
        return 130
    # the user's hydra.run.dir (relative to this folder, the job's working directory) where given:
    # --wait read and wrote LOG_DIR/<job>-<time> instead, and called the completed run failed
    root = (Path.cwd() / run_dir).resolve() if run_dir else Path(args.log_dir).resolve() / f"{job}-{stamp}"
    dirs = {f"{job}_{i}": root / str(i) for i in range(len(sets))} if sets else {job: root}
    print(f"Submitted batch job {job}: {len(dirs)} run(s) under {root}", flush=True)
    if not args.wait:
        return 0
    try:
        states = wait(list(dirs))
    except KeyboardInterrupt:
        print(f"stopped waiting; job {job} keeps running (scancel {job} to end it)", file=sys.stderr)
        return 130
    recs = []
    for i, (jid, d) in enumerate(dirs.items()):
        # composed only for a job that left no record of its own (a Hydra compose per array task)
        meta = functools.partial(_submitted, args.overrides + (sets[i] if sets else []), nodes, devices,
                                 f"{root.name}/{i}" if sets else root.name, str(root) if sets else None)
        recs.append(finalize(d, states.get(jid, {"state": "UNKNOWN"}), jid, meta,
                             Path(args.log_dir).resolve() / f"{args.job_name}-{jid}.out"))
    from scalelab.results.record import read_records

    if sets:
        from scalelab.results.callbacks import summarize_sweep

        # the tasks' own logger settings (their records' config): a W&B summary run as a local sweep's
        cfg = next((r["config"] for r in read_records([root], problems=[]) if r.get("config")), {})
        summarize_sweep(root, cfg.get("logger"), cfg.get("cache_dir"))
    else:
        from scalelab.results.table import render as table

        print(table(read_records([root])))
    rec_of = dict(zip(dirs, recs))
    for jid, st in states.items():
        print(f"SLURM job {jid}: {st['state']}" + (f" ({st['reason']}, exit {st['exit_code']})"
                                                    if st["state"] != "COMPLETED" else "") + _requeued(rec_of.get(jid)))
    # the records too: a job SLURM calls COMPLETED whose run failed (or wrote none) is no success
    ok = all(r.get("status") == "completed" for r in recs)
    return 0 if ok and all(st["state"] == "COMPLETED" for st in states.values()) and len(states) == len(dirs) else 1


def _requeued(rec: dict | None) -> str:
    """'; requeued 1x, resumed at step 9' for a job that was requeued (its record says; --wait said
    only COMPLETED: found by review)."""
    n = int(((rec or {}).get("slurm") or {}).get("requeues") or 0)
    if not n:
        return ""
    at = (rec or {}).get("resumed_at_step")
    return f"; requeued {n}x" + (f", resumed at step {at}" if at else "")


def _unquoted(value: str) -> str:
    """An override's value as Hydra reads it where it is quoted whole ('runB' -> runB): --wait
    followed a folder named with the quotes."""
    v = value.strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v


def _submitted(overrides: list[str], nodes: int, devices: int, name: str, sweep_dir: str | None) -> dict:
    """What a failed record of a submitted job says of it where the job wrote none (cancelled or
    failed before its run started): strategy and batch as its overrides compose (a placeholder said
    strategy "?" and batch 1), its world size, its name in its array's sweep."""
    meta = {"world_size": nodes * devices, "name": name, "sweep_dir": sweep_dir}
    try:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from scalelab.paths import conf_dir
        from scalelab.preflight_parse import compose_job

        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose_job([o for o in overrides if not o.startswith(("hydra.", "trainer.devices=",
                                                                         "trainer.num_nodes="))])
        meta.update(strategy=str(cfg.strategy.name), global_batch_size=int(cfg.data.global_batch_size))
    except Exception:  # noqa: BLE001 - preflight composed it before submitting; the record says what it has
        pass
    return meta


_IN_SLURM = ("the SLURM job script", "pass secrets in the environment instead (sbatch exports it to the job), "
             "e.g. WANDB_API_KEY")


def refuse_secrets(overrides: list[str], where: tuple[str, str] = _IN_SLURM) -> None:
    """A secret given as an override would be written into the job script (kept by SLURM and
    beside the logs) or the manifest: ValueError naming the key and `where` = (what it would be
    written into, the safe route)."""
    from scalelab.results.record import is_secret_key, literal_secret

    for o in overrides:
        key, _, value = o.partition("=")
        key, leaf = key.lstrip("+~"), key.rsplit(".", 1)[-1]
        # by its name; or by its value under a name that says nothing (+logger.wandb_key=<40 hex>):
        # a known secret's value, a prefixed token (hf_...), a long word under a *key name
        if "=" in o and (is_secret_key(leaf) or literal_secret(value)
                         or (leaf.lower().endswith("key") and re.fullmatch(r"[\w-]{20,}", value.strip("'\"")))):
            raise ValueError(f"{key}=... would be written into {where[0]}: {where[1]}")


def refuse_secret_lines(lines, name: str = "--setup") -> None:
    """A setup line that sets a secret to a literal value (`export WANDB_API_KEY=abc...`), or holds
    the value of a secret of this environment, would be written into the job script as is (kept by
    SLURM, beside the logs): ValueError. A reference the job's shell expands (`$WANDB_API_KEY`,
    `"$(cat ~/.wandb_key)"`) is no secret in the script and passes."""
    from scalelab.results.record import REDACTED, literal_secret, redact_text

    for line in lines or ():
        if literal_secret(str(line)):
            shown = redact_text(str(line)).replace(REDACTED, "...")
            raise ValueError(f"{name} {shown!r} would write a secret into the SLURM job script: give it in the "
                             "environment instead (sbatch exports it to the job; a line may refer to it, e.g. "
                             "'export WANDB_API_KEY=$MY_KEY')")


def refuse_decided(overrides: list[str], cpu: bool, gpus: str = "requests GPUs") -> None:
    """Overrides of what the script decides: ValueError naming the flag to use. It runs launcher=srun
    before the overrides (`launcher=local --nodes 2` ran launcher=local, validated as srun); --cpu
    decides the accelerator (`--cpu trainer.accelerator=gpu` ran on a GPU it did not ask for;
    trainer.accelerator=cpu held the GPUs it asked for idle). trainer.devices / num_nodes: _layout."""
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if other_launcher([o], ("launcher", "hydra/launcher")):
            # (launcher=srun is what it runs: the commands plan and recommend print carry it)
            raise ValueError(f"{o}: the script runs launcher=srun, one job (--nodes / --devices, --array for "
                             "several; a sweep through SLURM is `scalelab-train -m ... hydra/launcher=slurm`): drop it")
        if key == "trainer.accelerator" and (value.strip() != "cpu") == cpu:
            raise ValueError(f"{o} with --cpu: --cpu asks no GPUs and runs on CPU; drop --cpu to run on GPUs" if cpu
                             else f"{o} on a job that {gpus}: give --cpu instead (no GPUs, CPU ranks)")


def other_launcher(overrides: list[str], keys: tuple[str, ...] = ("launcher",)) -> str | None:
    """The first override that sets (or deletes: ~launcher) one of KEYS to anything but
    launcher=srun, the launcher a SLURM job script runs; None if none does."""
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key in keys and not (key == "launcher" and value.strip() == "srun"):
            return o
    return None


def asked(nodes: int, devices: int, cpus_per_task: int, gpus_per_node: int, partition: str | None,
          time_limit: str) -> str:
    """A job's request in words, for an error that says why SLURM refuses it."""
    return (f"{nodes} node(s) x {devices} rank(s) x {cpus_per_task} CPU(s)"
            + (f", {gpus_per_node} GPU(s) per node" if gpus_per_node else "")
            + f", partition {partition or '(default)'}, time {time_limit}")


@contextmanager
def _not_kept(path: Path):
    """A script that is refused, fails or is interrupted before SLURM takes it is not kept."""
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def prepare(script: str, path: Path, asked: str | None = None) -> Path:
    """Write the script at `path` (kept there for the user). With `asked` (the request in words),
    `sbatch --test-only` it: ValueError, nothing kept, if SLURM could never start it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    if asked is not None:
        with _not_kept(path):
            test_only(path, asked)
    return path


def sbatch(path: Path) -> str:
    """Submit a prepared script; the job id. RuntimeError with sbatch's words if sbatch fails."""
    with _not_kept(path):
        try:
            proc = subprocess.run(["sbatch", "--parsable", *directives(path), str(path)], capture_output=True,
                                  text=True, timeout=60)   # the script's options beat SBATCH_* (directives)
        except FileNotFoundError:
            raise RuntimeError("sbatch not found: run this on a SLURM login node") from None
        except subprocess.TimeoutExpired as e:   # a hung controller was a TimeoutExpired traceback
            raise RuntimeError(f"sbatch gave no answer in {e.timeout:g} s (slurmctld down or busy?): the job may or "
                               "may not be queued; check `squeue --me` before submitting again") from None
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {' / '.join((proc.stderr or proc.stdout).split(chr(10)))[:300]}")
    return proc.stdout.strip().split(";")[0]


def submit(script: str, path: Path, asked: str | None = None) -> str:
    """prepare (and check, with `asked`) then sbatch: the job id."""
    return sbatch(prepare(script, path, asked))


def cpus_per_task(given: int | None, cpu: bool) -> int:
    """CPUs per rank: as given, else 1 for a CPU rank (it runs one thread: threads_per_rank), else 8."""
    return int(given or (1 if cpu else 8))


def _layout(flag: int | None, overrides: list[str], key: str, name: str) -> int:
    """One source of truth for the SLURM layout: the flag, or the trainer override, and the two
    must agree when both are given (a dropped override would run another job than asked)."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")]
    value = flag
    if given:
        try:
            override = int(given[-1])
        except ValueError:
            raise ValueError(f"{key}={given[-1]!r} must be an integer >= 1") from None
        if flag is not None and flag != override:
            raise ValueError(f"{name} {flag} and {key}={override} disagree: give one of them")
        value = override
    value = 1 if value is None else value
    if value < 1:
        raise ValueError(f"{name} / {key} = {value}: must be >= 1")
    return value
