"""The strategy registry is conf/strategy/*.yaml: each names its StrategyPlan by `_target_`.
Adding a strategy = one module in this package + one yaml; nothing else to edit."""
from __future__ import annotations

from scalelab.paths import conf_dir


def choices(group: str) -> list[str]:
    """Names available in a config group (the yaml files of conf/<group>/)."""
    folder = conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def strategy_names() -> list[str]:
    return choices("strategy")
