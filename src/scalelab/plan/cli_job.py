"""`scalelab plan`'s flag form as the trainer runs it: the batch split the trainer derives (its
default global batch, read from conf/), the default precision, and the scalelab-train overrides
of the same job."""
from __future__ import annotations

import shlex

import yaml

from .spec import SGD_NO_MOMENTUM, ModelSpec, PlanError, conf_dir, get_strategy


def trainer_default(group: str, key: str):
    """The value of GROUP.KEY in the trainer's default config: conf/train.yaml's defaults list
    names GROUP's default option (data: stdlib), whose conf/GROUP/OPTION.yaml holds KEY. None where
    either is missing."""
    train = yaml.safe_load((conf_dir() / "train.yaml").read_text()) or {}
    option = next((d[group] for d in train.get("defaults") or [] if isinstance(d, dict) and group in d), None)
    path = conf_dir() / group / f"{option}.yaml"
    if option is None or not path.is_file():
        return None
    return (yaml.safe_load(path.read_text()) or {}).get(key)


def default_global_batch() -> int:
    """The global batch a flag-form plan takes without --global-batch: the trainer's default
    data.global_batch_size (16), as the override form and `recommend` plan."""
    try:
        value = trainer_default("data", "global_batch_size")
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"cannot read the trainer's default data.global_batch_size under {conf_dir()}: {exc}; "
                        "give --global-batch") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"the trainer's default data.global_batch_size under {conf_dir()} is {value!r}, "
                        "not a positive integer: give --global-batch")
    return value


def _micro_batch(a, model: ModelSpec, name: str, kw: dict) -> int:
    """--micro-batch, else as the trainer derives it: the global batch (kw's: --global-batch or the
    trainer's default) / data-parallel ranks, no accumulation; a pipeline cuts that into its
    micro-batches (strategy.microbatches, 4). A global batch the ranks do not divide: PlanError."""
    if a.micro_batch is not None:
        return a.micro_batch
    from .step_time import build_terms
    dp = build_terms(model, name, micro_batch=1, **{**kw, "global_batch": None}).layout.dp
    if kw["global_batch"] % dp:    # said as "dp x micro-batch = 2 x 1", a micro-batch nobody gave
        raise PlanError(f"--global-batch {kw['global_batch']} does not split over {dp} data-parallel ranks; "
                        f"valid: multiples of {dp}")
    per_rank = kw["global_batch"] // dp
    chunks = int(_strategy_option(name, "microbatches") or 4) if get_strategy(name).pipeline else 1
    return per_rank // chunks if per_rank % chunks == 0 else per_rank


def _strategy_option(name: str, key: str):
    from .spec import _strategy_config
    return _strategy_config(name).get(key)


_TRAIN_PRECISION = {"32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed", "bf16-true": "bf16-true"}


def default_precision(hw) -> str:
    """The flag form's --precision when none is given: the trainer's 32-true on a CPU profile (what
    `recommend` searches there too), bf16 autocast on a GPU one."""
    return "32" if hw.kind == "cpu" else "bf16-mixed"


def train_command(a, terms, hardware: str | None) -> str | None:
    """The scalelab-train overrides that run the job a flag-form plan describes (None when the
    model is not one the trainer builds: an MLP, or an MLP width that is not a multiple).
    hardware: the trainer's name of the profile (hardware.trainer_name); None, a profile given as a
    path, is no trainer choice: no hardware_profile= (the trainer's auto detects the device)."""
    L, m = terms.layout, terms.model
    if a.model:
        model = [f"model={a.model}"]
    elif m.kind == "gpt" and m.ffn % m.hidden == 0:
        model = ["model=gpt_nano", f"model.arch.n_layers={m.n_layers}", f"model.arch.d_model={m.hidden}",
                 f"model.arch.n_heads={m.heads}", f"model.arch.vocab_size={m.vocab}",
                 f"model.arch.seq_len={m.seq_len}", f"model.arch.mlp_ratio={m.ffn // m.hidden}"]
    else:
        return None
    ov = [f"strategy={terms.strategy.name}", *model, f"trainer.devices={L.devices_per_node}",
          f"data.global_batch_size={L.global_batch}", f"trainer.precision={_TRAIN_PRECISION[terms.precision]}",
          f"optim={'adamw' if terms.optimizer == 'adam' else 'sgd'}"]
    if hardware:
        ov.append(f"hardware_profile={hardware}")
    if L.nodes > 1:
        ov += [f"trainer.num_nodes={L.nodes}", "launcher=srun"]
    if terms.strategy.pipeline and terms.strategy.tensor_parallel:   # nd: the degrees by name
        ov += [f"strategy.tp={L.tp}", f"strategy.pp={L.pp}", f"strategy.microbatches={L.micro_batches}"]
    elif terms.strategy.pipeline:    # stages = world / strategy.dp: the trainer names the replicas
        ov += [f"strategy.dp={L.dp}", f"strategy.microbatches={L.micro_batches}"]
    elif L.micro_batches > 1:
        ov.append(f"data.micro_batch_size={L.micro_batch}")
    if terms.strategy.tensor_parallel and not terms.strategy.pipeline:
        ov.append(f"strategy.tensor_parallel_size={L.tp}")
    if terms.strategy.tensor_parallel and L.tp > 1 and L.sequence_parallel:
        ov.append("strategy.sequence_parallel=true")          # the trainer's default is off
    if terms.strategy.pipeline and L.stages_per_rank > 1:
        ov += ["strategy.schedule=interleaved_1f1b", f"strategy.stages_per_rank={L.stages_per_rank}"]
    elif terms.strategy.pipeline and L.schedule == "gpipe":
        ov.append("strategy.schedule=gpipe")
    if terms.strategy.pipeline and L.split != "uniform":
        ov.append(f"strategy.split={L.split}")
    if terms.checkpointing != "none":
        ov.append(f"model.arch.activation_checkpointing={terms.checkpointing}")
    if terms.optimizer == SGD_NO_MOMENTUM:          # planned without a momentum buffer
        ov.append("optim.optimizer.momentum=0")
    if getattr(a, "dropout", None) is not None:     # --dropout P: the model planned is not the config's
        ov.append(f"model.arch.dropout={m.dropout:g}")
    return "scalelab-train " + " ".join(map(shlex.quote, ov))
