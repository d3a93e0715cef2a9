"""A command line's overrides parsed and its config composed, each error as one line (preflight).

Hydra's own errors were a parse error's first line with no reason (or the reason with no
override), a 25-line "Could not find" block, a ValueError traceback; here each is one line that
names the override and a valid form of it. A new top-level key that misspells a known one
(+seeed=3) is refused, as is an unknown option of a group. `--cfg` and `--info` (show_config)
parse and compose the command's overrides this way and check each key's own type and range.
"""
from __future__ import annotations

import re

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, RangeSweep
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from scalelab.errors import ConfigError
from scalelab.paths import conf_dir
from scalelab.schema import CLOSED, check_keys, near_top_level, not_a_key, options_with
from scalelab.strategies.registry import choices

# Hydra flags that print the composed config (--cfg) or what composed it (--info): their overrides
# are still parsed and composed (an unknown group option or key is one line, not Hydra's 25-line
# block or a config printed with a value no job takes), but nothing is validated across keys and
# no data is prepared. The flag's own value (--cfg job, --info defaults) is no override.
_CFG, _INFO = {"job", "hydra", "all"}, {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
SHOWS_CONFIG = {"--cfg": _CFG, "-c": _CFG, "--info": _INFO, "-i": _INFO,
                "--package": None, "-p": None}   # None: always takes a value


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


def check_group_values(parsed) -> None:
    """Each parsed override has a key, adds no misspelt top-level key, and names (or sweeps, or
    globs) only options its group has."""
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


def compose_job(overrides: list[str], hydra_cfg: bool = False):
    """Hydra's compose of train.yaml with OVERRIDES; its errors as one ConfigError line."""
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
        cause = str(e.__cause__ or "").strip().splitlines()
        if len(lines) == 1 and cause:   # "Error merging override K=abc": why is in its cause (a type's
            lines.append(cause[0].rstrip("."))   # "could not be converted to Integer"; found by review)
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
            owners = options_with(key) if parent else []   # (not the one chosen: Hydra found none)
            if owners:   # `data.hub_name=x` listed stdlib's keys and never said data=hub has it
                return (f"{key} is a key of {', '.join(f'{parts[0]}={o}' for o in owners)}, not of the {parts[0]} "
                        f"chosen: choose it too ({parts[0]}={owners[0]} {key}=...)")
            return not_a_key(parent, part, node.keys(), closed=parent in CLOSED, groups=() if parent else _groups())
        missing = OmegaConf.is_missing(node, part)
        if missing or not isinstance(node.get(part), DictConfig):                   # trainer.max_steps.x=1
            value = "???" if missing else repr(node.get(part))
            return f"{name} is a value ({value}), not a group of keys: set it with {name}=VALUE"
        node = node.get(part)
    return None


def override_parser() -> OverridesParser:
    """Hydra's parser, with its config loader where Hydra is initialized (glob() sweeps need it)."""
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    return OverridesParser.create(config_loader=loader)


def parse(parser: OverridesParser, overrides: list[str]) -> list:
    """OVERRIDES parsed (a parse error: parse_error's line) and their groups' options checked."""
    parsed = []
    for override in overrides:   # one at a time: Hydra's message does not always name the override
        try:
            parsed.extend(parser.parse_overrides([override]))
        except HydraException as e:
            raise ConfigError(parse_error(override, str(e))) from e
    check_group_values(parsed)
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
    return f"'{override}': {why}; e.g. {example(override)}"


def example(override: str) -> str:
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


def sweep_error(swept: list, error: Exception) -> str:
    """One line naming the swept override whose values could not be listed, and why."""
    for o in (o for o in swept if o.is_sweep_override()):
        try:
            list(o.sweep_iterator())
        except (ValueError, TypeError) as e:
            why = str(e) or type(e).__name__
            if isinstance(o.value(), RangeSweep) and o.value().step == 0:
                why = "its step is 0"
            return f"'{o.input_line}': {why}; e.g. {example(o.input_line)}"
    return f"the sweep's values could not be listed: {str(error) or type(error).__name__}"


def show_config(args: list[str]) -> None:
    """`--cfg job|hydra|all` and `--info`: the overrides parsed and the config composed (a group
    option or key that does not exist), and each key's own type and range (schema.check_keys):
    `--cfg job strategy=fsdpp` was Hydra's 25-line "Could not find 'strategy/fsdpp'" block, and
    `--cfg job trainer.devices=0` printed the config as if a job took it. No cross-key rule, no data."""
    overrides, skip = [], False
    for i, a in enumerate(args):
        takes = SHOWS_CONFIG.get(a, ())
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
            parse(override_parser(), overrides)
            cfg = compose_job(overrides, hydra_cfg=True)
            with open_dict(cfg):
                cfg.pop("hydra")
            try:
                resolved = OmegaConf.to_container(cfg, resolve=True)
            except Exception:  # noqa: BLE001 - a value only a job resolves (${now:}, a missing ???): printed as is
                return
            check_keys(resolved)
    finally:
        GlobalHydra.instance().clear()
