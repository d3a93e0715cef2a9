"""Validate every job a command line would run, before Hydra starts the first one.

For `-m`, the sweep is expanded the way Hydra's BasicSweeper does it (command-line sweeps
plus `hydra.sweeper.params` from experiments), each job's config is composed and validated.
A bad value anywhere stops the whole command with one line, and no job (so no rank) starts.
Each job's data is prepared here too (data/prepare.py, cached; the jobs then find it), so a
corpus too small for the run is such a line as well. So is a job whose folder (a hydra.run.dir
or hydra.sweep.dir given) holds another job's run, or is the other kind of folder (a sweep's as a
run's, a run's as a sweep's: scalelab.job_dir), and a sweep whose jobs share one folder or that
has no job. An Optuna sweep's search space (each choice, each bound) is validated key by key.
Pass-through flags (--help, ...) validate and prepare nothing; --cfg and --info compose the config
(an unknown group option or key, a value of the wrong type or range, is such a line) and check
nothing across keys. Parsing the overrides and composing a job's config, each error as one line, and
--cfg/--info's check are scalelab.preflight_parse's.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import IntervalSweep, RangeSweep
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict

from scalelab.config import smoke_warmup, validate, warmup_given
from scalelab.data.prepare import prepare_for_run
from scalelab.errors import ConfigError
from scalelab.job_dir import kind_refusal, refusal
from scalelab.paths import conf_dir, path_problem
from scalelab.preflight_parse import SHOWS_CONFIG, compose_job, override_parser, parse, show_config, sweep_error
from scalelab.scaling.lr import warmup_steps

# Hydra flags after which there is no training to validate (of those, preflight_parse.SHOWS_CONFIG's
# still parse and compose the overrides: show_config).
_PASS_THROUGH = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion",
                 "-sc", "--version", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun"}
_MAX_JOBS = 5000
# Hydra's run modes, of which a command takes one (flag -> mode)
_MODES = {"-m": "multirun", "--multirun": "multirun", "--cfg": "cfg", "-c": "cfg", "--info": "info", "-i": "info",
          "--shell-completion": "shell", "-sc": "shell", "--run": "run", "-r": "run"}


def _basic(cfg) -> bool:
    return "BasicSweeper" in str(cfg.hydra.sweeper.get("_target_", ""))


def _sweep(args: list[str]):
    """(the command's overrides, their fixed part, the sweeper's config composed with it, and a
    function giving the sweep's overrides: hydra.sweeper.params (an experiment's) then the
    command's, the command's last), of `-m ARGS`."""
    overrides = [a for a in args if not a.startswith("-")]
    parser = override_parser()
    fixed = [o.input_line for o in parse(parser, overrides) if not o.is_sweep_override()]
    base = compose_job(fixed, hydra_cfg=True)

    def swept() -> list:
        params = base.hydra.sweeper.get("params") or {}
        return parse(parser, [f"{k}={v}" for k, v in params.items()] + overrides)

    return overrides, fixed, base, swept


def expand(args: list[str]) -> list[list[str]]:
    """The override lists of every job the command would run (one list for a single run)."""
    if "-m" not in args and "--multirun" not in args:
        overrides = [a for a in args if not a.startswith("-")]
        parse(override_parser(), overrides)
        return [overrides]
    _, fixed, base, sweep_overrides = _sweep(args)
    if not _basic(base):
        return [fixed]  # other sweepers (Optuna) choose values at run time: the fixed part, and search_space
    swept = sweep_overrides()
    for o in swept:
        if o.get_key_element().lstrip("+") == "experiment" and o.is_sweep_override():
            # each experiment is a sweep of its own (hydra.sweeper.params), read once from the primary
            # config: `-m experiment=default,weak_scaling` ran 2 jobs, not their 4 + 2 (found by review)
            raise ConfigError(f"{o.input_line}: each experiment is a sweep of its own; run them one at a time "
                              f"(scalelab-train -m experiment=NAME): swept together, Hydra runs one job of each")
    try:
        jobs = BasicSweeper.split_arguments(swept, max_batch_size=None)
    except HydraException as e:   # interval(): only a sweeper that samples (Optuna) takes one
        raise ConfigError(f"{str(e).splitlines()[0]}: -m sweeps choice(), range(), glob() or a,b lists") from e
    except (ValueError, TypeError) as e:   # range(1,4,0): Python's range() refused it, a traceback before
        raise ConfigError(sweep_error(swept, e)) from e
    flat = [job for batch in jobs for job in batch]
    if not flat:   # Hydra launched 0 jobs, exit 0, and rewrote the sweep folder's multirun.yaml and summary
        empty = [o.input_line for o in swept if o.is_discrete_sweep() and not list(o.sweep_string_iterator())]
        raise ConfigError(f"the sweep expands to 0 jobs ({', '.join(empty)} is empty): give each swept key at "
                          "least one value (range(START,STOP) stops before STOP)")
    if len(flat) > _MAX_JOBS:
        raise ConfigError(f"the sweep expands to {len(flat)} jobs (more than {_MAX_JOBS}); narrow it")
    return flat


def search_space(args: list[str]) -> tuple[list[str], list[tuple[str, str, list]]]:
    """(fixed overrides, [(key, what, values)]) of an Optuna sweep (hydra.sweeper.params and the
    command's sweeps, the command's last): every choice, both bounds of an interval or range. A bad
    one otherwise failed in the job, as a traceback."""
    if "-m" not in args and "--multirun" not in args:
        return [], []
    _, fixed, base, sweep_overrides = _sweep(args)
    if _basic(base):
        return fixed, []
    space = {o.get_key_element(): o for o in sweep_overrides()}
    keys = []
    for key, o in space.items():
        if not o.is_sweep_override():   # the command's own fixed values are `fixed` (they replace params')
            continue
        value = o.value()
        if isinstance(value, (IntervalSweep, RangeSweep)):   # Optuna samples between (and on) the bounds
            values = [value.start, value.end if isinstance(value, IntervalSweep) else value.stop]
        else:
            values = list(o.sweep_string_iterator())
        keys.append((key, o.input_line, values))
    return fixed, keys


# Combinations of a search space's values checked together; a larger space is checked value by value.
_MAX_SEARCH_PROBES = 64


def check_search_space(args: list[str], elsewhere: bool) -> None:
    """A searched value is refused when no combination with the other searched keys' values is a
    valid job (a cross-key rule: `trainer.devices=choice(1,3) data.global_batch_size=choice(6,12)`
    has valid trials, though the default batch 16 does not divide by 3); each combination is
    composed and validated as a job is."""
    import itertools

    fixed, keys = search_space(args)
    combos = list(itertools.product(*(values for _, _, values in keys)))
    if len(combos) > _MAX_SEARCH_PROBES:   # each key alone, the others at their fixed values
        combos = [tuple(v if j == i else None for j in range(len(keys))) for i, (_, _, vs) in enumerate(keys)
                  for v in vs]
    ok, first_error = set(), {}
    for combo in combos:
        chosen = [(i, v) for i, v in enumerate(combo) if v is not None]
        try:
            overrides = [*fixed, *(f"{keys[i][0]}={v}" for i, v in chosen)]
            cfg = compose_job(overrides)
            smoke_warmup(cfg, warmup_given(overrides))   # as the trial's job will (train.run_job)
            _validate(cfg, _target(cfg, elsewhere))
            ok.update(chosen)
        except ConfigError as e:
            for c in chosen:
                first_error.setdefault(c, e)
    for i, (_, what, values) in enumerate(keys):
        for v in values:
            if (i, v) not in ok:
                raise ConfigError(f"{first_error[(i, v)]} [search space: {what}]")


def _target(cfg, elsewhere: bool) -> str | None:
    """The device kind a job is validated for: its own accelerator's where it runs elsewhere
    (SLURM, k8s, recommend), else None (this machine's)."""
    return ("cpu" if str(cfg.trainer.accelerator) == "cpu" else "gpu") if elsewhere else None


def _validate(cfg, target: str | None):
    """config.validate, and what only a command line can get wrong that validate lets pass."""
    spec = validate(cfg, target)
    ls, steps = cfg.lr_scaling, int(cfg.trainer.max_steps)
    if warmup_steps(ls.warmup_steps, steps) > steps:   # the scheduler cut it to max_steps, silently
        raise ConfigError(f"lr_scaling.warmup_steps={ls.warmup_steps} is more than trainer.max_steps={steps}: the run "
                          f"would end before its LR warm-up; give at most {steps} steps, or a fraction < 1 of them "
                          "(0.1: the first 10%)")
    return spec


@contextmanager
def _naming_job(job: list[str], jobs: list[list[str]], args: list[str]):
    """A ConfigError of one job of a sweep names the job's swept values."""
    try:
        yield
    except ConfigError as e:
        swept = " ".join(o for o in job if o not in args) if len(jobs) > 1 else ""
        raise ConfigError(f"{e}" + (f" [job: {swept}]" if swept else "")) from e


def _job_dir(cfg, num: int, multirun: bool) -> tuple[Path | None, Path | None, str | None]:
    """(job folder, sweep folder, subdir) of job `num`. The folders: where Hydra will run the job
    and the sweep, which may already hold runs; None for one named by the time (${now:...}: new by
    construction) or not known before Hydra runs the job (train.run_job checks those). subdir:
    what tells the sweep's jobs apart (resolved; None where unknown)."""
    node = cfg.hydra.sweep if multirun else cfg.hydra.run
    raw = {k: str(v) for k, v in OmegaConf.to_container(node, resolve=False).items()}
    timed = "${now:" in raw["dir"]
    try:
        with open_dict(cfg):
            cfg.hydra.job.num = num
        base = None if timed else Path(node.dir).resolve()
        sub = str(node.subdir) if multirun and "${now:" not in raw["subdir"] else None
    except Exception:  # noqa: BLE001 - an interpolation of what only Hydra's run sets
        return None, None, None
    if not multirun:
        return base, None, None
    if not _basic(cfg):   # other sweepers (Optuna) choose each job's values at run time
        return None, base, None
    return ((base / sub).resolve() if base and sub is not None else None), base, sub


def _run_folder_kind(folder: Path) -> str | None:
    """job_dir.kind_refusal for a run's folder, where the nodeK/run.json of a launcher=torchrun job's
    other nodes (scalelab.train.node_folder) are its own nodes' parts, not a sweep's jobs: the same
    command run again on node 0 or 1 was refused as if its folder were a sweep's."""
    from scalelab.paths import SWEEP_MARKS

    jobs = [p for p in folder.glob("*/run.json") if not re.fullmatch(r"node[1-9]\d*", p.parent.name)]
    if not jobs and not any((folder / m).is_file() for m in SWEEP_MARKS):
        return None
    return kind_refusal(folder, False)


# Hydra's own command-line flags (hydra/_internal/utils.py get_args_parser)
_HYDRA_FLAGS = set(_MODES) | _PASS_THROUGH | {"--resolve", "--package", "-p", "--config-path", "-cp"}
_CFG_VALUES = ("job", "hydra", "all")


def _refuse_unknown_flags(args: list[str]) -> None:
    """A flag Hydra does not know, before anything is prepared: `scalelab-train --foo` prepared the
    data (31 MB into the cache) and only then got argparse's refusal; `--cfg jobb` was read as an
    override ("missing EQUAL")."""
    for i, a in enumerate(args):
        flag = a.split("=", 1)[0]
        if a.startswith("-") and flag not in _HYDRA_FLAGS:
            raise ConfigError(f"unknown option {a!r}: scalelab-train takes KEY=VALUE overrides and Hydra's flags "
                              "(-m, --cfg job|hydra|all, --help, --hydra-help, --info, --resolve, -p PACKAGE)")
        if flag in ("--cfg", "-c"):
            value = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
            if value not in _CFG_VALUES:
                raise ConfigError(f"{flag} {value or ''}".rstrip() + f": {flag} takes one of {', '.join(_CFG_VALUES)}")


def _refuse_a_sweep_run_once(cfg, job: list[str]) -> None:
    """An experiment that is a sweep (hydra.sweeper.params) given without -m: Hydra runs one job of
    it, its first values nowhere, and exits 0 (`scalelab-train experiment=strategy_scaling` ran ddp
    at 1 rank of its 4 jobs, without a word: found by review). Where the command gives every swept
    key a value it is one job of the sweep, as the SLURM launcher runs each job (python -m
    scalelab.train experiment=X strategy=... without -m) and `slurm render`/`k8s render` take it."""
    swept = sweep_left(cfg, job)
    if swept:
        raise ConfigError(f"{swept}: run it with -m (scalelab-train -m {' '.join(job)}), or give each of those keys "
                          "one value; without -m Hydra runs one job of it")


def sweep_left(cfg, job: list[str]) -> str | None:
    """'experiment=X is a sweep (KEY=a,b ...)' where CFG (composed with its hydra node) sweeps keys
    the overrides JOB give no value (every swept key pinned: one job of it, a SLURM launcher's job,
    `slurm render`); None where it is one job."""
    params = OmegaConf.to_container(cfg.hydra.sweeper, resolve=False).get("params") or {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in job}
    params = {k: v for k, v in params.items() if k not in given}
    if not params:
        return None
    named = [o for o in job if o.split("=", 1)[0].lstrip("+") == "experiment"]
    what = named[-1] if named else "this config"
    return f"{what} is a sweep ({' '.join(f'{k}={v}' for k, v in params.items())})"


def preflight(args: list[str], data: bool = True, elsewhere: bool = False) -> int:
    """Validate all jobs; returns how many. Raises ConfigError on the first bad one.
    data: also prepare each job's data (cached) and check it is enough for the run.
    elsewhere: the jobs run on other machines (a SLURM allocation, Kubernetes pods), which the
    command asks for GPUs unless trainer.accelerator=cpu: each job is validated for that device,
    not this one's (a login node without GPUs refused trainer.accelerator=gpu, hardware=h200 and
    DeepSpeed fp16 as if the job were to run on its CPU)."""
    _refuse_unknown_flags(args)
    modes = [a.split("=")[0] for a in args if a.split("=")[0] in _MODES]
    if len({_MODES[m] for m in modes}) > 1:   # Hydra's own refusal is a ValueError traceback
        raise ConfigError(f"{' and '.join(dict.fromkeys(modes))} cannot be combined: --cfg job prints one job's "
                          "config (drop -m and give each key one value); -m runs the sweep")
    flags = {a.split("=")[0] for a in args if a.startswith("-")}
    if flags & _PASS_THROUGH:
        if flags & _PASS_THROUGH <= set(SHOWS_CONFIG):
            show_config(args)
        return 0
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        jobs = expand(args)
        checked, subdirs, sampled = [], {}, False
        # Every job's config first (schema, then the cross-key checks: config.validate), so a bad
        # value in any job stops the command before anything is prepared or written; then the data.
        multirun = "-m" in args or "--multirun" in args
        for num, job in enumerate(jobs):
            with _naming_job(job, jobs, args):
                cfg = compose_job(job, hydra_cfg=True)   # one compose: the job's folder and its config
                where, sweep_dir, sub = _job_dir(cfg, num, multirun)
                raw_sub = OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir")
                if not multirun:
                    _refuse_a_sweep_run_once(cfg, job)
                sampled = multirun and not _basic(cfg)
                with open_dict(cfg):
                    cfg.pop("hydra")
                smoke_warmup(cfg, warmup_given(job))   # its line is the job's (train.run_job lowers it again)
                checked.append((job, cfg, _validate(cfg, _target(cfg, elsewhere))))
                refused = where is not None and (
                    path_problem(where, "the job's folder (hydra.sweep.dir/subdir)" if multirun else "hydra.run.dir",
                                 folder=True)
                    or (not multirun and _run_folder_kind(where))
                    or refusal(where, OmegaConf.to_container(cfg, resolve=True)))
                refused = refused or (sweep_dir is not None and kind_refusal(sweep_dir, True))
                if refused:
                    raise ConfigError(refused)
            # the sweep dir is one per command unless it names a job's value: its subdir apart, it
            # is the same folder (Hydra overwrote the first job's .hydra/, then the second was refused)
            same = subdirs.setdefault((str(sweep_dir) if sweep_dir else None, sub), num) if sub is not None else num
            if same != num:
                swept = lambda j: " ".join(o for o in j if o not in args) or "-"  # noqa: E731
                raise ConfigError(f"hydra.sweep.subdir={raw_sub} puts jobs {same} ({swept(jobs[same])}) and {num} "
                                  f"({swept(job)}) in one folder ({sweep_dir or 'hydra.sweep.dir'}/{sub}): give each "
                                  "job its own (the default ${hydra.job.num}, or ${hydra.job.override_dirname})")
        if sampled:
            check_search_space(args, elsewhere)
        for job, cfg, spec in checked if data else ():
            # Prepared once and cached, so the jobs find it (and a corpus too small for the run is
            # a one-line error here, not a crash in the ranks).
            with _naming_job(job, jobs, args):
                prepare_for_run(cfg, spec)
    GlobalHydra.instance().clear()
    return len(jobs)

