"""The LR question: for the chosen global batch, which LR rule and warmup, from a base LR at a
base batch (the trainer's `optim.lr` at `lr_scaling.base_batch_size`).

The advice follows the literature the rules come from (scaling/lr.py): for Adam(W) the square-root
rule (Malladi et al. 2022, the SDE scaling rule for adaptive methods), for SGD the linear rule
(Goyal et al. 2017), each with the warmup of its conf/lr_scaling/ config when the LR grows (Goyal
et al.'s gradual warmup is what makes large-batch linear scaling work); at the base batch, no rule
(all three give the base LR). `--verify` then checks it with a short grid over the three rules
(or base LR x 1/2, 1, 2 at the base batch, where the rules coincide), one Hydra multirun.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from scalelab.plan.spec import conf_dir

RULES = ("none", "sqrt", "linear")


def _rule_config(rule: str) -> dict:
    path = conf_dir() / "lr_scaling" / f"{rule}.yaml"
    return (yaml.safe_load(Path(path).read_text()) or {}) if path.is_file() else {}


def base_defaults(optimizer: str) -> tuple[float, int]:
    """The trainer's base LR (conf/optim/) and base batch (conf/lr_scaling/linear.yaml)."""
    optim = yaml.safe_load((conf_dir() / "optim" / f"{'adamw' if optimizer == 'adam' else 'sgd'}.yaml").read_text())
    return float(optim["lr"]), int(_rule_config("linear").get("base_batch_size", 16))


def base_model() -> str:
    """The trainer's default model (conf/train.yaml's defaults): the one conf/optim's LRs go with."""
    train = yaml.safe_load((conf_dir() / "train.yaml").read_text()) or {}
    for d in train.get("defaults") or []:
        if isinstance(d, dict) and "model" in d:
            return str(d["model"])
    return "gpt_nano"


def base_lr_caveat(model, optimizer: str, base_lr_given: bool) -> str | None:
    """A caveat for the LR advice when its base LR is conf/optim's default and the model is not the
    trainer's default one (another shape: an LR tuned on a 136k-parameter GPT says little about a
    7B one); None when --base-lr was given or the model is that one."""
    if base_lr_given:
        return None
    from scalelab.plan.cli import _model_from_conf

    name = base_model()
    try:
        ref = _model_from_conf(name)
    except Exception:  # noqa: BLE001 - a missing config: no reference model, so the caveat holds
        ref = None
    shape = lambda m: (m.n_params, m.n_layers, m.hidden, m.heads, m.vocab, m.seq_len, m.ffn)  # noqa: E731
    if ref is not None and shape(ref) == shape(model):
        return None
    optim = "adamw" if optimizer == "adam" else "sgd"
    return (f"the base LR is conf/optim/{optim}.yaml's default, which goes with the trainer's default model "
            f"{name}, not tuned for this model: tune it and give --base-lr (optim.lr in the command)")


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    """lr = base_lr x (B / B0) (linear), x sqrt(B / B0) (sqrt), or base_lr (none): the trainer's
    scaling.lr.scaled_lr, restated here so that planning imports no torch."""
    ratio = global_batch / base_batch
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": ratio ** 0.5}[rule]


def advice(optimizer: str, base_lr: float, base_batch: int, global_batch: int) -> dict:
    """{"rule", "lr", "warmup_steps", "why", "by_rule": {rule: lr}, "overrides": [...]}."""
    by_rule = {r: scaled_lr(base_lr, base_batch, global_batch, r) for r in RULES}
    if global_batch == base_batch:
        rule, why = "none", f"the global batch is the base batch ({base_batch}): every rule gives the base LR"
    elif optimizer == "adam":
        rule, why = "sqrt", ("Adam(W): square-root scaling keeps the SDE of adaptive methods (Malladi et al. "
                             "2022); linear over-scales Adam's already normalised steps")
    else:
        rule, why = "linear", "SGD: linear scaling with gradual warmup (Goyal et al. 2017)"
    warmup = _rule_config(rule).get("warmup_steps", 0) if rule != "none" else 0
    if rule != "none" and global_batch < base_batch:
        why += "; the batch is smaller than the base batch, so the LR shrinks and needs no warmup"
        warmup = 0
    overrides = [f"lr_scaling={rule}", f"optim.lr={base_lr:g}"]
    if rule != "none":
        overrides += [f"lr_scaling.base_batch_size={base_batch}", f"lr_scaling.warmup_steps={warmup}"]
    return {"rule": rule, "lr": by_rule[rule], "warmup_steps": warmup, "why": why, "base_lr": base_lr,
            "base_batch": base_batch, "global_batch": global_batch, "by_rule": by_rule, "overrides": overrides}


def check_grid(adv: dict) -> tuple[str, list[str]]:
    """(what is varied, the sweep overrides) of the short LR check: the three rules at the chosen
    batch, or base LR x 1/2, 1, 2 (rule none) where they coincide."""
    base, b0 = adv["base_lr"], adv["base_batch"]
    if adv["global_batch"] == b0:
        lrs = ",".join(f"{base * f:g}" for f in (0.5, 1.0, 2.0))
        return "optim.lr", ["lr_scaling=none", f"optim.lr={lrs}"]
    # every rule with the advised rule's schedule: each conf/lr_scaling/ file has its own (none:
    # constant, no warm-up), and none's lower loss then was its schedule's doing, not its LR's
    sched = _rule_config(adv["rule"])
    return "lr_scaling", [f"lr_scaling={','.join(RULES)}", f"optim.lr={base:g}", f"lr_scaling.base_batch_size={b0}",
                          f"lr_scaling.warmup_steps={adv['warmup_steps']}",
                          f"lr_scaling.decay={sched.get('decay', 'constant')}",
                          f"lr_scaling.min_lr_ratio={sched.get('min_lr_ratio', 1.0)}"]
