"""Validate every job a command line would run, before Hydra starts the first one.

For `-m`, the sweep is expanded the way Hydra's BasicSweeper does it (command-line sweeps
plus `hydra.sweeper.params` from experiments), each job's config is composed and validated.
A bad value anywhere stops the whole command with one line, and no job (so no rank) starts.
Each job's data is prepared here too (data/prepare.py, cached; the jobs then find it), so a
corpus too small for the run is such a line as well. So is a job whose folder (a hydra.run.dir
or hydra.sweep.dir given) holds another job's run (scalelab.job_dir). Pass-through flags (--cfg,
--help, ...) validate and prepare nothing.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from scalelab.config import validate
from scalelab.data.prepare import prepare_for_run
from scalelab.errors import ConfigError
from scalelab.job_dir import refusal
from scalelab.paths import conf_dir, path_problem
from scalelab.schema import CLOSED, not_a_key
from scalelab.strategies.registry import choices

# Hydra flags after which there is no training to validate.
_PASS_THROUGH = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion",
                 "-sc", "--version", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun"}
_MAX_JOBS = 5000
# Hydra's run modes, of which a command takes one (flag -> mode)
_MODES = {"-m": "multirun", "--multirun": "multirun", "--cfg": "cfg", "-c": "cfg", "--info": "info", "-i": "info",
          "--shell-completion": "shell", "-sc": "shell", "--run": "run", "-r": "run"}


def _groups() -> list[str]:
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir())


def _check_group_values(parsed) -> None:
    groups = _groups()
    for o in parsed:
        key = o.key_or_group
        if key in groups and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            valid = choices(key)
            for v in values:
                if v is not None and str(v) not in valid:
                    raise ConfigError(f"{key}={v} is not known: choose one of {', '.join(valid)}")


def _compose(overrides: list[str], hydra_cfg: bool = False):
    try:
        return compose("train", overrides=overrides, return_hydra_config=hydra_cfg)
    except HydraException as e:
        unknown = _unknown_key(str(e), overrides)
        if unknown:
            raise ConfigError(unknown) from e
        ambiguous = re.search(r"Ambiguous value for argument '([^']*)'", str(e))
        if ambiguous:   # a,b outside a sweep: Hydra's own line reads as a numbered list cut short
            raise ConfigError(f"{ambiguous.group(1)}: several values make a sweep (scalelab-train -m ...); one job "
                              "takes one value (a list is KEY=[a,b]; a string with a comma is quoted: KEY='a,b')") from e
        lines = [ln.strip().rstrip(".") for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError("; ".join(lines[:2])) from e


def _unknown_key(text: str, overrides: list[str]) -> str | None:
    """Hydra's "Could not override 'trainer.max_step'" as a line naming the nearest valid key. Its
    own advice, `+trainer.max_step=...`, is kept only outside the groups scalelab reads by name
    (schema.CLOSED), where a new key can mean something (`+optim.optimizer.nesterov=true`)."""
    m = re.search(r"Could not override '([^']+)'", text)
    if not m or m.group(1).startswith("hydra."):     # Hydra's own config: its message says it
        return None
    key = m.group(1)
    try:
        cfg = compose("train", overrides=[o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key])
    except HydraException:
        return None
    parts, node = key.split("."), cfg
    for i, part in enumerate(parts):
        name, parent = ".".join(parts[:i + 1]), ".".join(parts[:i])
        if part not in node.keys():
            return not_a_key(parent, part, node.keys(), closed=parent in CLOSED)
        missing = OmegaConf.is_missing(node, part)
        if missing or not isinstance(node.get(part), DictConfig):                   # trainer.max_steps.x=1
            value = "???" if missing else repr(node.get(part))
            return f"{name} is a value ({value}), not a group of keys: set it with {name}=VALUE"
        node = node.get(part)
    return None


def expand(args: list[str]) -> list[list[str]]:
    """The override lists of every job the command would run (one list for a single run)."""
    overrides = [a for a in args if not a.startswith("-")]
    multirun = "-m" in args or "--multirun" in args
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    _check_group_values(parsed)
    if not multirun:
        return [overrides]
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    base = _compose(fixed, hydra_cfg=True)
    if "BasicSweeper" not in str(base.hydra.sweeper.get("_target_", "")):
        return [fixed]  # other sweepers (Optuna) choose values at run time: check the fixed part
    params = base.hydra.sweeper.get("params") or {}
    sweep_args = [f"{k}={v}" for k, v in params.items()] + overrides
    jobs = BasicSweeper.split_arguments(parser.parse_overrides(sweep_args), max_batch_size=None)
    flat = [job for batch in jobs for job in batch]
    if len(flat) > _MAX_JOBS:
        raise ConfigError(f"the sweep expands to {len(flat)} jobs (more than {_MAX_JOBS}); narrow it")
    return flat


@contextmanager
def _naming_job(job: list[str], jobs: list[list[str]], args: list[str]):
    """A ConfigError of one job of a sweep names the job's swept values."""
    try:
        yield
    except ConfigError as e:
        swept = " ".join(o for o in job if o not in args) if len(jobs) > 1 else ""
        raise ConfigError(f"{e}" + (f" [job: {swept}]" if swept else "")) from e


def _job_dir(cfg, num: int, multirun: bool) -> Path | None:
    """The folder Hydra will run job `num` in, where it may already hold a run; None for a
    folder named by the time (${now:...}: new by construction) or one not known before Hydra
    runs the job (train.run_job checks those)."""
    if multirun and "BasicSweeper" not in str(cfg.hydra.sweeper.get("_target_", "")):
        return None   # other sweepers (Optuna) choose each job's values at run time
    node = cfg.hydra.sweep if multirun else cfg.hydra.run
    raw = OmegaConf.to_container(node, resolve=False)
    if any("${now:" in str(v) for v in raw.values()):
        return None
    try:
        with open_dict(cfg):
            cfg.hydra.job.num = num
        return Path(node.dir, node.subdir if multirun else "").resolve()
    except Exception:  # noqa: BLE001 - an interpolation of what only Hydra's run sets
        return None


def preflight(args: list[str], data: bool = True, elsewhere: bool = False) -> int:
    """Validate all jobs; returns how many. Raises ConfigError on the first bad one.
    data: also prepare each job's data (cached) and check it is enough for the run.
    elsewhere: the jobs run on other machines (a SLURM allocation, Kubernetes pods), which the
    command asks for GPUs unless trainer.accelerator=cpu: each job is validated for that device,
    not this one's (a login node without GPUs refused trainer.accelerator=gpu, hardware=h200 and
    DeepSpeed fp16 as if the job were to run on its CPU)."""
    modes = [a.split("=")[0] for a in args if a.split("=")[0] in _MODES]
    if len({_MODES[m] for m in modes}) > 1:   # Hydra's own refusal is a ValueError traceback
        raise ConfigError(f"{' and '.join(dict.fromkeys(modes))} cannot be combined: --cfg job prints one job's "
                          "config (drop -m and give each key one value); -m runs the sweep")
    if any(a.split("=")[0] in _PASS_THROUGH for a in args):
        return 0
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        jobs = expand(args)
        checked = []
        # Every job's config first (schema, then the cross-key checks: config.validate), so a bad
        # value in any job stops the command before anything is prepared or written; then the data.
        multirun = "-m" in args or "--multirun" in args
        for num, job in enumerate(jobs):
            with _naming_job(job, jobs, args):
                cfg = _compose(job, hydra_cfg=True)   # one compose: the job's folder and its config
                where = _job_dir(cfg, num, multirun)
                with open_dict(cfg):
                    cfg.pop("hydra")
                target = ("cpu" if str(cfg.trainer.accelerator) == "cpu" else "gpu") if elsewhere else None
                checked.append((job, cfg, validate(cfg, target)))
                refused = where is not None and (
                    path_problem(where, "the job's folder (hydra.sweep.dir/subdir)" if multirun else "hydra.run.dir",
                                 folder=True)
                    or refusal(where, OmegaConf.to_container(cfg, resolve=True)))
                if refused:
                    raise ConfigError(refused)
        for job, cfg, spec in checked if data else ():
            # Prepared once and cached, so the jobs find it (and a corpus too small for the run is
            # a one-line error here, not a crash in the ranks).
            with _naming_job(job, jobs, args):
                prepare_for_run(cfg, spec)
    GlobalHydra.instance().clear()
    return len(jobs)
