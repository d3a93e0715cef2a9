"""The typed schema of every config group: per key, its type, its range or choices and a
one-line description of what is valid. `check(cfg)` runs it over a composed (resolved) config
before any rank starts (config.validate, so preflight checks every job of a multirun with it).

A value of the wrong type is rejected, never converted: `true` where a word goes, a word where a
number goes, `1.5` where an integer goes, `no` where a boolean goes (Python's bool("no") is True:
`strategy.reshard_after_forward=no` used to mean yes). Keys the schema does not know are left to
their owner (a strategy's class rejects unknown options, a model's dataclass unknown fields;
in the groups whose every key is read by scalelab itself (CLOSED), an unknown key, which nothing
would read, is an error naming the nearest valid one; `+key=value` additions elsewhere are the
user's own, e.g. a secret under logger). Cross-key rules (heads divide width,
warm-up < max_steps, batch divisibility, a strategy's layout) stay in config.validate and the
strategies, which run after this.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from scalelab.resume_checks import check_resume_from
from scalelab.errors import ConfigError
from scalelab.schema_fields import Bool, Choice, Field, Float, Int, Str

# One list of each, in config.py (which checks the same keys again after the schema).
from scalelab.config import ACCELERATORS, LAUNCHERS, LOGGERS, PRECISIONS  # noqa: E402
_ZERO_BUCKET = Int("elements per bucket; even", lo=2)
_ZERO_STAGE3 = Int("ZeRO stage 3 only; null: DeepSpeed's default", lo=0, null=True)

#: per group, per key. `model.arch` and `strategy` have one table per class (below).
GROUPS: dict[str, dict[str, Field]] = {
    "": {
        "seed": Int("the run seed: numpy and torch accept 0 .. 2**32-1", lo=0, hi=2**32 - 1),
        "verbose": Bool("true: every rank's output and the libraries' banners"),
        "cache_dir": Str("where prepared data and JIT-built ops are cached (SCALELAB_CACHE)"),
    },
    "checkpoint": {
        "save": Bool("save a checkpoint at the end"),
        "resume_from": Str("an existing checkpoint file or folder saved by a run of the same kind of strategy (ZeRO: "
                           "stage, world size, gradient clip), model shape and optimizer", null=True),
        "export_consolidated": Bool("also write model_consolidated.pt"),
        "every_n_steps": Int("optimizer steps between periodic checkpoints; null: off", lo=1, null=True),
        "keep_last": Int("periodic checkpoints kept", lo=1),
        "resume": Choice(("auto", "never"), "auto: continue from the job dir's newest valid periodic checkpoint"),
        "stop_grace_s": Float("seconds the ranks get after SIGTERM to save and exit; null: 60 with checkpointing, "
                              "else 5", lo=0, lo_open=True, null=True),
    },
    "trainer": {
        "devices": Int("ranks per node", lo=1),
        "num_nodes": Int("nodes", lo=1),
        "accelerator": Choice(ACCELERATORS, "auto: cuda when available, else cpu"),
        "precision": Choice(PRECISIONS, also=(32,)),
        "max_steps": Int("optimizer steps", lo=1),
        "warmup_steps": Int("steps excluded from the throughput and step-time figures", lo=0),
        "profile_steps": Int("last steps profiled for the compute/comm breakdown; 0: off", lo=0),
        "threads_per_rank": Int(rule="must be null (1 on CPU, cores / ranks on GPU), auto (cores / ranks) or an "
                                "integer >= 1", lo=1, null=True, also=("auto",)),
        "gradient_clip_val": Float("gradient norm clip; null or 0: off", lo=0, null=True),
        "log_every_n_steps": Int("logging interval in steps", lo=1),
        "val_every_n_steps": Int("validate every N optimizer steps; null: off", lo=1, null=True),
        "val_batches": Int("global batches per validation", lo=1),
        "enable_progress_bar": Bool(),
        "count_device_syncs": Bool("CUDA: count torch's synchronizing calls per steady step (run.json device_syncs)"),
        "timeout_s": Float("seconds for the whole job, launch to exit; null: no limit", lo=0, lo_open=True, null=True),
        "max_restarts": Int("times a failed job's ranks are restarted (they resume from the newest checkpoint)", lo=0),
        "collective_timeout_s": Float("seconds a collective may wait for its peers", lo=0, lo_open=True),
    },
    "data": {
        "source": Choice(("stdlib", "files", "hub")),
        "files": Field("list", item=Str(), rule="must be a list of text files or folders, e.g. data.files=[notes.txt,docs/]"),
        "hub_name": Str("a hub dataset name, a folder written by save_to_disk, or a local .jsonl/.json/.csv/.parquet "
                        "file (the first three also .gz/.bz2/.xz), a glob pattern or a folder of them"),
        "hub_config": Str("the hub dataset's configuration name, e.g. wikitext-2-raw-v1; null: its default",
                          null=True),
        "hub_split": Str("the split of a DatasetDict"),
        "text_column": Str("the column holding the text"),
        "global_batch_size": Int("samples per optimizer step, all ranks", lo=1),
        "micro_batch_size": Int("samples per rank per forward; null: global / data-parallel ranks", lo=1, null=True),
        "val_fraction": Float("the share of the corpus's token blocks held out for validation (default 0.02; 0: "
                              "no val split)", lo=0, hi=1, hi_open=True),
        "max_documents": Int("read at most this many documents; null: all", lo=1, null=True),
        "num_workers": Int("DataLoader worker processes per rank", lo=0),
        "pin_memory": Choice(("auto", True, False), "batches in page-locked host memory; auto: on GPU ranks"),
    },
    "optim": {
        "name": Str(),
        "lr": Float("the base LR at lr_scaling.base_batch_size", lo=0, lo_open=True),
        "optimizer": Field("any", "a torch.optim class with _target_ and _partial_: true"),
        "fused_on_gpu": Bool(),
    },
    # torch.optim keyword arguments (optim.optimizer.KEY); preflight also builds the optimizer.
    "optim.optimizer": {
        "_target_": Str("a torch.optim class, e.g. torch.optim.AdamW"),
        "_partial_": Choice((True,), "the optimizer is built per rank with its parameters and LR"),
        "betas": Field("list", "Adam's moment decay rates", length=2, item=Float(lo=0, hi=1, hi_open=True)),
        "weight_decay": Float(lo=0),
        "eps": Float(lo=0, lo_open=True),
        "momentum": Float(lo=0, hi=1, hi_open=True),
        "dampening": Float(lo=0, hi=1),
        "nesterov": Bool(),
        "amsgrad": Bool(),
        "maximize": Bool(),
        "foreach": Bool(null=True),
        "fused": Bool(null=True),
        "capturable": Bool(),
        "differentiable": Bool(),
    },
    "lr_scaling": {
        "rule": Choice(("none", "linear", "sqrt")),
        "base_batch_size": Int("the global batch optim.lr is meant for", lo=1),
        "warmup_steps": Float(rule="must be a number >= 0: whole steps (>= 1), or a fraction of trainer.max_steps "
                              "(< 1)", lo=0),
        "decay": Choice(("constant", "cosine")),
        "min_lr_ratio": Float("the final LR of the cosine decay over the peak", lo=0, hi=1),
    },
    "logger": {
        "name": Choice(LOGGERS),
        "project": Str("the W&B project"),
        "entity": Str("the W&B entity (team or user); null: your default", null=True),
        "mode": Choice(("offline", "online", "disabled")),
        "tags": Field("list", "W&B tags", item=Str()),
    },
    "launcher": {
        "name": Choice(LAUNCHERS),
        "extra_args": Field("list", "extra srun / torchrun arguments", item=Str()),
        "rdzv_endpoint": Str("launcher=torchrun: HOST:PORT of node 0; null: MASTER_ADDR:MASTER_PORT", null=True),
        "node_rank": Int("launcher=torchrun: this node's rank; null: NODE_RANK, GROUP_RANK or RANK", lo=0, null=True),
        "rdzv_backend": Choice(("static",), "c10d is not supported: it orders the nodes itself, so global rank 0, the "
                               "run record's writer, could be on any node"),
        "rdzv_id": Str("launcher=torchrun: the rendezvous id, the same on every node; null: derived", null=True),
        "rdzv_timeout_s": Float("launcher=torchrun: seconds a node waits for the others to join", lo=0,
                                lo_open=True),
    },
    "model": {
        "name": Str(),
        "task": Choice(("lm", "classify")),
    },
}

#: model.arch, by the dataclass named in its _target_
ARCH: dict[str, dict[str, Field]] = {
    "GPTConfig": {
        "n_layers": Int("transformer blocks", lo=1),
        "n_heads": Int("attention heads; must divide d_model", lo=1),
        "d_model": Int("width; a multiple of n_heads", lo=1),
        "seq_len": Int("context length in tokens", lo=1),
        "vocab_size": Int("tokens are bytes: at least 256", lo=256),
        "mlp_ratio": Int("MLP width / d_model", lo=1),
        "dropout": Float(lo=0, hi=1, hi_open=True),
        "activation_checkpointing": Choice(("none", "selective", "full"), also=(True, False),
                                           rule="is not valid: choose one of none, selective, full "
                                                "(true = full, false = none)"),
    },
    "MLPConfig": {
        "in_features": Int("bytes of input per sample", lo=1),
        "hidden": Field("list", "hidden layer widths", item=Int(lo=1)),
        "num_classes": Int("classes", lo=2),
    },
}

#: strategy.KEY, by StrategyPlan class (a class's table adds to its bases')
STRATEGY: dict[str, dict[str, Field]] = {
    "StrategyPlan": {"_target_": Str("a StrategyPlan class"), "name": Str()},
    "DDP": {
        "bucket_cap_mb": Float("MB per gradient bucket", lo=0, lo_open=True),
        "find_unused_parameters": Bool(),
        "gradient_as_bucket_view": Bool(),
        "static_graph": Bool(),
        "comm_hook": Choice(("none", "fp16", "bf16", "powersgd"), null=True),
        "powersgd_rank": Int("matrix approximation rank", lo=1),
        "powersgd_start_iter": Int("plain all-reduce steps before PowerSGD starts", lo=2),
        "local_sgd_period": Int("steps between parameter averagings; null: no local SGD", lo=1, null=True),
        "local_sgd_start_step": Int("plain DDP steps before local SGD", lo=0),
    },
    "MeshParallelPlan": {"save_distributed_checkpoint": Bool("one shard file per rank")},
    "FSDP": {"reshard_after_forward": Bool("true: FULL_SHARD, false: SHARD_GRAD_OP")},
    "TensorParallel": {
        "tensor_parallel_size": Int(rule="must be a positive integer or auto (all ranks)", lo=1, also=("auto",)),
        "reshard_after_forward": Bool("FULL_SHARD across the data-parallel groups (fsdp_tp)"),
        "sequence_parallel": Bool("shard the LayerNorm regions along the sequence"),
    },
    "ZeRO": {
        "stage": Choice((1, 2, 3), rule="is not a ZeRO stage: choose one of 1, 2, 3"),
        "offload_optimizer": Choice(("none", "cpu", "nvme"), rule="is not an offload device: choose one of none, "
                                    "cpu, nvme"),
        "offload_params": Choice(("none", "cpu", "nvme"), rule="is not an offload device: choose one of none, "
                                 "cpu, nvme"),
        "pin_memory": Bool(),
        "nvme_path": Str("a folder on a local NVMe drive", null=True),
        "cpu_adam": Bool("DeepSpeedCPUAdam for Adam/AdamW under offload"),
        "overlap_comm": Bool(),
        "contiguous_gradients": Bool(),
        "reduce_scatter": Bool(),
        "allgather_partitions": Bool(),
        "reduce_bucket_size": _ZERO_BUCKET,
        "allgather_bucket_size": _ZERO_BUCKET,
        "round_robin_gradients": Bool(),
        "stage3_prefetch_bucket_size": _ZERO_STAGE3,
        "stage3_param_persistence_threshold": _ZERO_STAGE3,
        "stage3_max_live_parameters": _ZERO_STAGE3,
        "stage3_max_reuse_distance": _ZERO_STAGE3,
        "sub_group_size": _ZERO_STAGE3,
        "stage3_fetch_unit": Choice(("block", "module"), null=True,
                                    rule="is not a fetch unit: choose one of block, module"),
        "bf16_check_grad_overflow": Bool("bf16-mixed: skip a step whose gradients hold inf/NaN (DeepSpeed's "
                                         "default; a device read per step)"),
    },
    "Pipeline": {
        "schedule": Choice(("gpipe", "1f1b", "interleaved_1f1b"), fold=True),
        "microbatches": Int("micro-batches per optimizer step", lo=1),
        "dp": Int("data-parallel replicas of the pipeline", lo=1),
        "stages_per_rank": Int("virtual pipeline stages per rank (interleaved_1f1b)", lo=1),
        "split": Choice(("uniform", "balanced"), fold=True),
    },
    "ND": {
        "tp": Int("tensor-parallel degree, inside a node", lo=1),
        "pp": Int("pipeline stages", lo=1),
        "dp_replicate": Int("replicated data-parallel groups (HSDP); the rest of dp is sharded", lo=1),
        "reshard_after_forward": Bool("FULL_SHARD over the data-parallel ranks"),
        "sequence_parallel": Bool("shard the LayerNorm regions along the sequence (tp > 1)"),
    },
}


def fail(key: str, value: Any, field: Field) -> ConfigError:
    desc = f" ({field.desc})" if field.desc and field.desc not in field.what() else ""
    return ConfigError(f"{key}={value!r} {field.what()}{desc}")


#: groups whose keys scalelab reads by name: any other key in them is a typo that nothing reads
#: (`+trainer.max_step=10` ran the default 30 steps)
CLOSED = ("checkpoint", "trainer", "data", "optim", "lr_scaling", "launcher")


def not_a_key(parent: str, bad: str, keys, closed: bool = True, groups=()) -> str:
    """One line for a key `bad` that `parent` does not have: the nearest one it has (or of `groups`,
    the config groups, at the top), and its keys (closed: the only valid ones; else the ones set,
    and how to add a new one). A new key is offered only where no key is near: `strategi=fsdp` was
    told "did you mean strategy? (... a new key is added with +strategi=VALUE)", and the + trained
    the default strategy with an unread key beside it."""
    import difflib

    keys = sorted(str(k) for k in keys if not str(k).startswith("_"))
    where = f"{parent}." if parent else ""
    near = difflib.get_close_matches(bad, sorted({*keys, *map(str, groups)}), n=1, cutoff=0.6)
    hint = f": did you mean {where}{near[0]}?" if near else ""
    if closed:
        return f"{where}{bad} is not a key of {parent or 'the config'}{hint} (valid: {', '.join(keys)})"
    if near:
        return f"{where}{bad} is not set in {parent or 'the config'}{hint} (set: {', '.join(keys)})"
    return (f"{where}{bad} is not set in {parent or 'the config'} (set: {', '.join(keys)}; a new key is "
            f"added with +{where}{bad}=VALUE)")


#: how near a new top-level key's name must be to a known one to be taken for its typo
#: (difflib's ratio: seeed/seed 0.89, strategi/strategy 0.88, modle/model 0.8; optimizer/optim 0.71,
#: dataset/data 0.73 and date/data 0.75 stay new keys)
NEAR_CUTOFF = 0.8


def near_top_level(bad: str, names) -> str | None:
    """The known top-level key or config group a new top-level key `bad` (+KEY=VALUE) is a near
    spelling of: `+seeed=3` ran with seed 1234 and `+strategi=fsdp` trained the default strategy, each
    with a key beside them that nothing reads. None where `bad` is no near spelling of one (a note
    of the user's own, +note=..., stays free)."""
    import difflib

    near = difflib.get_close_matches(bad, sorted(set(map(str, names)) - {bad}), n=1, cutoff=NEAR_CUTOFF)
    return near[0] if near else None



def check_fields(values: dict, table: dict[str, Field], prefix: str) -> None:
    for key, field in table.items():
        if key in values and not field.ok(values[key]):
            raise fail(f"{prefix}{key}", values[key], field)


def _class_tables(target: Any, tables: dict[str, dict[str, Field]]) -> dict[str, Field]:
    """The merged tables of target's class and its bases (by class name)."""
    import importlib

    merged: dict[str, Field] = {}
    module, _, name = str(target).rpartition(".")
    try:   # not hydra.utils.get_class: it logs an error of its own (3 more lines before the one line)
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an unknown _target_ is reported where it is built
        return merged
    for klass in reversed(cls.__mro__):
        merged.update(tables.get(klass.__name__, {}))
    return merged


def check(c: dict) -> None:
    """Check a resolved config (a plain dict, OmegaConf.to_container(cfg, resolve=True))."""
    check_keys(c)
    # which hardware profile, and a resume path the ranks can use (they would only fail on it)
    _hardware_profile(c.get("hardware_profile", "auto"))
    check_resume_from(c)   # a checkpoint the ranks could not load, or one at or past max_steps
    _restarts_refused(c)
    warm = (c.get("lr_scaling") or {}).get("warmup_steps")
    if isinstance(warm, float) and warm >= 1 and not warm.is_integer():
        raise ConfigError(f"lr_scaling.warmup_steps={warm!r} {GROUPS['lr_scaling']['warmup_steps'].what()}: "
                          f"{warm:g} is neither")
    arch = (c.get("model") or {}).get("arch")
    if isinstance(arch, dict):
        table = _class_tables(arch.get("_target_"), ARCH)
        check_fields(arch, table, "model.arch.")
        d, h = arch.get("d_model"), arch.get("n_heads")
        if "d_model" in table and isinstance(d, int) and isinstance(h, int) and d % h:
            valid = [k for k in range(1, min(d, 64) + 1) if d % k == 0]
            raise ConfigError(f"model.arch.n_heads={h} does not divide model.arch.d_model={d}: choose n_heads in "
                              f"{', '.join(map(str, valid))} or a d_model that is a multiple of {h}")
    strategy = c.get("strategy")
    if isinstance(strategy, dict):
        check_fields(strategy, _class_tables(strategy.get("_target_"), STRATEGY), "strategy.")


def check_keys(c: dict) -> None:
    """Each key's own type and range, and unknown keys of the CLOSED groups (no cross-key rule, no
    file looked at): what `--cfg job` checks before it prints a config."""
    for group, table in GROUPS.items():
        if group == "":
            check_fields(c, table, "")
            continue
        node: Any = c
        for part in group.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{group}={node!r} must be a mapping of the {group} group's keys (choose the group with "
                              f"{group}=NAME and set its keys with {group}.KEY=VALUE)")
        check_fields(node, table, group + ".")
        unknown = sorted(set(node) - set(table) - {"_target_"}) if group in CLOSED else []
        if unknown:
            raise ConfigError(not_a_key(group, unknown[0], table))
        other = _another_options_key(group, node) if group in CLOSED else None
        if other:
            raise ConfigError(other)


def _another_options_key(group: str, node: dict) -> str | None:
    """A key of the group's table set beside an option that has no such key: `+data.hub_name=x` under
    data=stdlib trained stdlib's corpus with the key unread (the table is every option's keys). The
    option chosen is the one whose conf/GROUP/*.yaml has the node's `source` or `name`."""
    files = _option_files(group)
    ident = next((k for k in ("source", "name") if k in node), None)
    chosen = [stem for stem, d in files.items() if ident and d.get(ident) == node[ident]]
    if len(chosen) != 1:
        return None
    for key in sorted(set(node) - set(files[chosen[0]]) - {"_target_"}):
        owners = options_with(f"{group}.{key}")
        if owners:
            return (f"{group}.{key} is a key of {', '.join(f'{group}={o}' for o in owners)}, not of {group}="
                    f"{chosen[0]}: choose it too ({group}={owners[0]} {group}.{key}=...)")
    return None


def options_with(key: str) -> list[str]:
    """The options of KEY's config group (conf/GROUP/*.yaml) whose own file sets the dotted KEY."""
    group, *path = key.split(".")
    owners = []
    for stem, node in _option_files(group).items():
        for part in path:
            node = node[part] if isinstance(node, dict) and part in node else KeyError
        if node is not KeyError:
            owners.append(stem)
    return owners


def _option_files(group: str) -> dict[str, dict]:
    """{option: its conf/GROUP/OPTION.yaml as a mapping} (read once a process per conf folder: a
    config is checked several times, each job of a sweep too)."""
    from scalelab.paths import conf_dir

    return _read_option_files(str(conf_dir() / group))


@functools.lru_cache(maxsize=None)
def _read_option_files(folder: str) -> dict[str, dict]:
    import yaml

    files = {f.stem: yaml.safe_load(f.read_text()) for f in sorted(Path(folder).glob("*.yaml"))}
    return {stem: d for stem, d in files.items() if isinstance(d, dict)}


def _restarts_refused(c: dict) -> None:
    """trainer.max_restarts > 0 with launcher=srun: srun never restarts ranks (only spawn and torchrun
    do), so the setting was silently ignored and the first failure ended the job; with launcher=torchrun
    on several nodes the restart cannot resume."""
    restarts = (c.get("trainer") or {}).get("max_restarts")
    if (c.get("launcher") or {}).get("name") == "srun" and isinstance(restarts, int) and restarts > 0:
        raise ConfigError(f"trainer.max_restarts={restarts} with launcher=srun: srun does not restart ranks, so it "
                          "would be ignored; on SLURM set trainer.max_restarts=0 and checkpoint.every_n_steps=N: a "
                          "preempted or timed-out job saves, requeues itself and resumes from its newest checkpoint "
                          "(`scontrol requeue JOBID` resumes a failed one there too)")
    nodes = (c.get("trainer") or {}).get("num_nodes")
    if (c.get("launcher") or {}).get("name") == "torchrun" and isinstance(restarts, int) and restarts > 0 \
            and isinstance(nodes, int) and nodes > 1:
        # each node's agent restarted alone, its static rendezvous store keeping the failed attempt's
        # gloo addresses (pytorch#135712): the restarted rank was refused its connection and node 0
        # hung on past trainer.collective_timeout_s, with no record (2 of 2 tries)
        raise ConfigError(f"trainer.max_restarts={restarts} with launcher=torchrun on {nodes} nodes: each node's "
                          "torchrun restarts alone and its rendezvous store keeps the failed attempt's addresses, so "
                          "the restart cannot connect; set trainer.max_restarts=0 and run the same command again on "
                          "every node (it resumes from the newest checkpoint), or let a pod's restartPolicy do it "
                          "(scalelab k8s --pvc)")


def _hardware_profile(value: Any) -> None:
    if value in (None, "auto"):
        return
    from scalelab.plan.hardware import list_hardware

    valid = list_hardware()
    if isinstance(value, str) and (value in valid or (value.endswith((".yaml", ".yml")) and Path(value).is_file())):
        return
    raise ConfigError(f"hardware_profile={value!r} is not valid: choose one of auto, {', '.join(valid)} "
                      "(conf/hardware/) or a path to a .yaml profile")


def describe() -> str:
    """Every key of the schema with what is valid, one line each (for docs and `--help`-like use)."""
    lines = []
    for group, table in [*GROUPS.items(), *((f"model.arch ({k})", t) for k, t in ARCH.items()),
                         *((f"strategy ({k})", t) for k, t in STRATEGY.items())]:
        for key, f in table.items():
            lines.append(f"{group + '.' if group else ''}{key}: {f.what()}" + (f" ({f.desc})" if f.desc else ""))
    return "\n".join(lines)
