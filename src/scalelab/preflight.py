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
nothing across keys.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, IntervalSweep, RangeSweep
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from scalelab.config import smoke_warmup, validate, warmup_given
from scalelab.data.prepare import prepare_for_run
from scalelab.errors import ConfigError
from scalelab.job_dir import kind_refusal, refusal
from scalelab.paths import conf_dir, path_problem
from scalelab.scaling.lr import warmup_steps
from scalelab.schema import CLOSED, check_keys, near_top_level, not_a_key
from scalelab.strategies.registry import choices

# Hydra flags after which there is no training to validate.
_PASS_THROUGH = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion",
                 "-sc", "--version", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun"}
# Of those, the ones that print the composed config (--cfg) or what composed it (--info): their
# overrides are still parsed and composed (an unknown group option or key is one line, not Hydra's
# 25-line block or a config printed with a value no job takes), but nothing is validated across
# keys and no data is prepared. The flag's own value (--cfg job, --info defaults) is no override.
_CFG, _INFO = {"job", "hydra", "all"}, {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
_SHOWS_CONFIG = {"--cfg": _CFG, "-c": _CFG, "--info": _INFO, "-i": _INFO,
                 "--package": None, "-p": None}   # None: always takes a value
_MAX_JOBS = 5000
# Hydra's run modes, of which a command takes one (flag -> mode)
_MODES = {"-m": "multirun", "--multirun": "multirun", "--cfg": "cfg", "-c": "cfg", "--info": "info", "-i": "info",
          "--shell-completion": "shell", "-sc": "shell", "--run": "run", "-r": "run"}


def _groups() -> list[str]:
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir())


def _top_level(groups: list[str]) -> list[str]:
    """The config's top-level names: its groups and train.yaml's own keys (seed, checkpoint, ...)."""
    own = OmegaConf.load(conf_dir() / "train.yaml")
    return sorted({*groups, *(str(k) for k in own.keys() if k not in ("defaults", "hydra"))})


def _check_new_key(o, groups: list[str]) -> None:
    """+KEY=VALUE (or ++) of a new top-level key that is a near spelling of a known key or group:
    Hydra adds it beside the real one, which keeps its default (`+seeed=3` ran with seed 1234,
    `+strategi=fsdp` trained ddp). Other new keys (+note=..., a +group of a searchpath) stay."""
    key = o.key_or_group
    if not (o.is_add() or o.is_force_add()) or any(c in key for c in "./@") or key in groups:
        return
    near = near_top_level(key, _top_level(groups))
    if near:
        value = o.input_line.split("=", 1)[1] if "=" in o.input_line else "VALUE"
        raise ConfigError(f"{o.input_line} adds a new key {key} that nothing reads: did you mean {near}? "
                          f"({near}={value})")


def _check_group_values(parsed) -> None:
    groups = _groups()
    for o in parsed:
        key = o.key_or_group
        if not key:   # `=5`: Hydra's own refusal was a ValueError traceback
            raise ConfigError(f"{o.input_line!r} has no key: an override is KEY=VALUE (trainer.max_steps=5)")
        _check_new_key(o, groups)
        if key in groups and not o.is_delete():
            valid = choices(key)
            if isinstance(o.value(), Glob):   # glob() needs Hydra's config loader: matched here against the options
                values = o.value().filter(valid)
                if not values:
                    raise ConfigError(f"{o.input_line} matches no {key}: choose among {', '.join(valid)}")
            else:
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
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
        missing = _missing_option(str(e))
        if missing:
            raise ConfigError(missing) from e
        lines = [ln.strip().rstrip(".") for ln in str(e).split("Config search path:")[0].splitlines() if ln.strip()]
        raise ConfigError("; ".join(lines[:2])) from e
    except ValueError as e:   # Hydra's own check of an override's type, a traceback before
        raise ConfigError(f"the overrides are not valid: {str(e).splitlines()[0] if str(e) else e!r}") from e


def _missing_option(text: str) -> str | None:
    """Hydra's "Could not find 'hydra/launcher/nope'" and the options it lists one per line below
    (the first two lines of it named no option) as one line naming them."""
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    listed = re.search(r"Available options in '[^']*':\n((?:\t[^\n]*\n?)*)", text)
    if not m or not listed:
        return None
    names = [ln.strip() for ln in listed.group(1).splitlines() if ln.strip()]
    return f"{m.group(1)}={m.group(2)} is not known: choose one of {', '.join(names)}"


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
            return not_a_key(parent, part, node.keys(), closed=parent in CLOSED, groups=() if parent else _groups())
        missing = OmegaConf.is_missing(node, part)
        if missing or not isinstance(node.get(part), DictConfig):                   # trainer.max_steps.x=1
            value = "???" if missing else repr(node.get(part))
            return f"{name} is a value ({value}), not a group of keys: set it with {name}=VALUE"
        node = node.get(part)
    return None


def _parser() -> OverridesParser:
    """Hydra's parser, with its config loader where Hydra is initialized (glob() sweeps need it)."""
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    return OverridesParser.create(config_loader=loader)


def _parse(parser: OverridesParser, overrides: list[str]) -> list:
    parsed = []
    for override in overrides:   # one at a time: Hydra's message does not always name the override
        try:
            parsed.extend(parser.parse_overrides([override]))
        except HydraException as e:
            raise ConfigError(parse_error(override, str(e))) from e
    _check_group_values(parsed)
    return parsed


def parse_error(override: str, text: str) -> str:
    """Hydra's parse error of OVERRIDE as one line: the override, why (without the grammar's token
    set: "expecting {':', BRACKET_OPEN, ...}"), and a valid form of what it seems to be. Hydra's
    first line alone was "Error parsing override 'strategy=ddp,,fsdp'" (no reason), or the reason
    with no override: "mismatched input '<EOF>' expecting {...}" for `strategy=ddp,fsdp,`."""
    why = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(
        ("See https://", "Error parsing override"))), "not a valid override")
    value = override.split("=", 1)[1] if "=" in override else ""
    unclosed = [f"'{o}' is not closed" for o, c in ("[]", "{}", "()") if value.count(o) > value.count(c)]
    unclosed += [f"the quote {q} is not closed" for q in "'\"" if value.count(q) % 2]
    token = re.search(r"(?:extraneous|mismatched) input '([^']*)'|no viable alternative at input '([^']*)'", why)
    token = next((g for g in token.groups() if g), None) if token else None
    evaluating = re.match(r"\w+ while evaluating '([^']*)': (.*)", why)
    if evaluating:   # range(1,x), choice(): the function's own complaint
        why = f"{evaluating.group(1)}: {evaluating.group(2)}"
    elif unclosed:
        why = unclosed[-1]
    elif value.endswith(",") or token == "<EOF>":
        why = "it ends with a comma" if value.endswith(",") else "it ends too early"
    elif token:
        why = "an empty value between two commas" if token == "," and ",," in value else f"unexpected '{token}'"
    return f"'{override}': {why}; e.g. {_example(override)}"


def _example(override: str) -> str:
    """A valid override of the form `override` seems to take (its key kept)."""
    key, _, value = override.partition("=")
    key, value = key.strip() or "KEY", value.strip()
    call = re.match(r"(\w+)\s*\(", value)
    forms = {"range": "range(1,4) (1, 2, 3)", "choice": "choice(a,b)", "glob": "glob(zero*)",
             "interval": "interval(0,1)"}
    if call:
        return f"{key}={forms.get(call.group(1), forms['range'])}"
    if value[:1] in "[{" and value:
        return f"{key}=[a,b] (a list)" if value[0] == "[" else f"{key}={{a:1,b:2}} (a mapping)"
    return f"{key}=a,b (a sweep, with -m)" if "," in value else f"{key}=VALUE (quoted with spaces: {key}='a b')"


def _basic(cfg) -> bool:
    return "BasicSweeper" in str(cfg.hydra.sweeper.get("_target_", ""))


def _sweep(args: list[str]):
    """(the command's overrides, their fixed part, the sweeper's config composed with it, and a
    function giving the sweep's overrides: hydra.sweeper.params (an experiment's) then the
    command's, the command's last), of `-m ARGS`."""
    overrides = [a for a in args if not a.startswith("-")]
    parser = _parser()
    fixed = [o.input_line for o in _parse(parser, overrides) if not o.is_sweep_override()]
    base = _compose(fixed, hydra_cfg=True)

    def swept() -> list:
        params = base.hydra.sweeper.get("params") or {}
        return _parse(parser, [f"{k}={v}" for k, v in params.items()] + overrides)

    return overrides, fixed, base, swept


def expand(args: list[str]) -> list[list[str]]:
    """The override lists of every job the command would run (one list for a single run)."""
    if "-m" not in args and "--multirun" not in args:
        overrides = [a for a in args if not a.startswith("-")]
        _parse(_parser(), overrides)
        return [overrides]
    _, fixed, base, sweep_overrides = _sweep(args)
    if not _basic(base):
        return [fixed]  # other sweepers (Optuna) choose values at run time: the fixed part, and search_space
    swept = sweep_overrides()
    try:
        jobs = BasicSweeper.split_arguments(swept, max_batch_size=None)
    except HydraException as e:   # interval(): only a sweeper that samples (Optuna) takes one
        raise ConfigError(f"{str(e).splitlines()[0]}: -m sweeps choice(), range(), glob() or a,b lists") from e
    except (ValueError, TypeError) as e:   # range(1,4,0): Python's range() refused it, a traceback before
        raise ConfigError(_sweep_error(swept, e)) from e
    flat = [job for batch in jobs for job in batch]
    if not flat:   # Hydra launched 0 jobs, exit 0, and rewrote the sweep folder's multirun.yaml and summary
        empty = [o.input_line for o in swept if o.is_discrete_sweep() and not list(o.sweep_string_iterator())]
        raise ConfigError(f"the sweep expands to 0 jobs ({', '.join(empty)} is empty): give each swept key at "
                          "least one value (range(START,STOP) stops before STOP)")
    if len(flat) > _MAX_JOBS:
        raise ConfigError(f"the sweep expands to {len(flat)} jobs (more than {_MAX_JOBS}); narrow it")
    return flat


def _sweep_error(swept: list, error: Exception) -> str:
    """One line naming the swept override whose values could not be listed, and why."""
    for o in (o for o in swept if o.is_sweep_override()):
        try:
            list(o.sweep_iterator())
        except (ValueError, TypeError) as e:
            why = str(e) or type(e).__name__
            if isinstance(o.value(), RangeSweep) and o.value().step == 0:
                why = "its step is 0"
            return f"'{o.input_line}': {why}; e.g. {_example(o.input_line)}"
    return f"the sweep's values could not be listed: {str(error) or type(error).__name__}"


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
            cfg = _compose(overrides)
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
    flags = {a.split("=")[0] for a in args if a.startswith("-")}
    if flags & _PASS_THROUGH:
        if flags & _PASS_THROUGH <= set(_SHOWS_CONFIG):
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
                cfg = _compose(job, hydra_cfg=True)   # one compose: the job's folder and its config
                where, sweep_dir, sub = _job_dir(cfg, num, multirun)
                raw_sub = OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir")
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


def show_config(args: list[str]) -> None:
    """`--cfg job|hydra|all` and `--info`: the overrides parsed and the config composed (a group
    option or key that does not exist), and each key's own type and range (schema.check_keys):
    `--cfg job strategy=fsdpp` was Hydra's 25-line "Could not find 'strategy/fsdpp'" block, and
    `--cfg job trainer.devices=0` printed the config as if a job took it. No cross-key rule, no data."""
    overrides, skip = [], False
    for i, a in enumerate(args):
        takes = _SHOWS_CONFIG.get(a, ())
        if skip:
            skip = False
        elif a.startswith("-"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            skip = takes is None or (nxt is not None and nxt in (takes or ()))
        else:
            overrides.append(a)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            _parse(_parser(), overrides)
            cfg = _compose(overrides, hydra_cfg=True)
            with open_dict(cfg):
                cfg.pop("hydra")
            try:
                resolved = OmegaConf.to_container(cfg, resolve=True)
            except Exception:  # noqa: BLE001 - a value only a job resolves (${now:}, a missing ???): printed as is
                return
            check_keys(resolved)
    finally:
        GlobalHydra.instance().clear()
