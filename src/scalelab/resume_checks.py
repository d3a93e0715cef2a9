"""Checks of `checkpoint.resume_from` before any rank starts: the path is a checkpoint (a torch
zip file or a sharded checkpoint's folder) of the same kind of strategy and model shape, and the
run goes past its step. The ranks would only fail on any of these, after the queue wait."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from scalelab.checkpointing import _NAME, checkpoint_step, saved_by, size_problem

# Strategy classes whose checkpoints another class loads as its own (else each class has its own
# format): single and ddp both save Lightning's full checkpoint (checked: single's resumed by ddp
# at world 2 and ddp's by single).
_FORMAT: dict[str, str] = {"scalelab.strategies.single.Single": "scalelab.strategies.ddp.DDP"}
# DeepSpeed's checkpoints are per ZeRO stage and data-parallel size (its engine refuses another:
# "Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not
# currently supported"); the others reshard (DCP) or hold the whole model.
_ZERO = "scalelab.strategies.deepspeed.ZeRO"


def resume_mismatch(ckpt: Path, cfg: dict, noted: bool = False) -> str | None:
    """What makes checkpoint `ckpt` unloadable by the run of `cfg` (a composed config), as
    "KEY: saved vs now; ...", from the config of the run that saved it (None when unknown or the
    same): its kind of strategy (each strategy class has its own format: a full file, a DCP
    folder, DeepSpeed's folder; ZeRO also its stage and world size, and at stage 1-2 its gradient
    clip), its model's shape (the integer keys of model.arch: layers, width, heads, context, vocab,
    an MLP's widths; dropout or recomputation may differ) and its optimizer class (compared only
    where both configs have it). `noted`: instead, what loads but makes the run another one than
    the saved run's continuation (_NOTED: its seed and global batch)."""
    saved = saved_by(ckpt)
    if saved is None:
        return None

    def shape(c: dict) -> dict:
        strategy, arch = c.get("strategy") or {}, (c.get("model") or {}).get("arch") or {}
        target = strategy.get("_target_")
        out = {"strategy": _FORMAT.get(target, target)}
        if target == _ZERO:
            trainer = c.get("trainer") or {}
            out.update({"strategy.stage": strategy.get("stage"),
                        "world size": f"{trainer.get('devices')} x {trainer.get('num_nodes')} node(s)"})
            if strategy.get("stage") in (1, 2) and "gradient_clip_val" in trainer:
                # ZeRO-1/2 restore the saved clip over the configured one (stage_1_and_2.py
                # _load_global_state), and refuse a clipped checkpoint in an unclipped run
                out["trainer.gradient_clip_val"] = _clip(trainer["gradient_clip_val"])
        out.update({f"model.arch.{k}": v for k, v in arch.items() if k == "_target_" or _ints(v)})
        for key in (*_SAME_RUN, *_NOTED):
            found, value = _lookup(c, key)
            if found:
                out[key] = value
        return out

    was, now = shape(saved), shape(cfg)
    if was["strategy"] != now["strategy"]:   # ZeRO's stage and world size matter only between ZeRO runs
        for d in (was, now):
            d.pop("strategy.stage", None), d.pop("world size", None)
    # unknown on one side (an older or partial config; ZeRO-3 or another strategy: no clip saved)
    for key in [*_SAME_RUN, *_NOTED, "trainer.gradient_clip_val"]:
        if (key in was) != (key in now):
            was.pop(key, None), now.pop(key, None)
    name = lambda c, k: (c.get("strategy") or {}).get("name") if k == "strategy" else None  # noqa: E731
    diff = [f"{k}: {_show(name(saved, k) or was.get(k, '-'))} vs {_show(name(cfg, k) or now.get(k, '-'))}"
            for k in dict.fromkeys([*was, *now]) if was.get(k) != now.get(k) and (k in _NOTED) == noted]
    return "; ".join(diff) or None


# A key a resumed run must share with the one that saved the checkpoint: another optimizer class
# fails in the ranks' optimizer state load (SGD's momentum_buffer where AdamW wants exp_avg: a
# KeyError). Keys it is told of (one line, not refused: a batch-size ramp or another seed is a
# choice): another seed or global batch is another data order (step s trains on the seeded
# permutation's samples s*B .. (s+1)*B, data/sampler.py), not the saved run's continuation.
_SAME_RUN = ("optim.optimizer._target_",)
_NOTED = ("seed", "data.global_batch_size")


def _lookup(c: dict, key: str) -> tuple[bool, Any]:
    """(found, value) of dotted `key` in config `c`."""
    for part in key.split("."):
        if not isinstance(c, dict) or part not in c:
            return False, None
        c = c[part]
    return True, c


def _clip(v: Any) -> Any:
    """A gradient clip as a number, None where off (null and 0 alike)."""
    try:
        return float(v or 0) or None
    except (TypeError, ValueError):
        return v


def _show(v: Any) -> Any:
    return "null" if v is None else v


def _ints(v: Any) -> bool:
    """An integer or a list of integers (a shape), not a flag."""
    if isinstance(v, (list, tuple)):
        return bool(v) and all(_ints(x) for x in v)
    return isinstance(v, int) and not isinstance(v, bool)


_noted: set[tuple[str, str]] = set()   # data-order notes said already (a config is validated several times)


def _damaged_once(path: Path) -> str | None:
    """checkpointing.damaged, read once a process per file as it is now (a config is validated
    several times; damaged reads the whole file)."""
    st = path.stat()
    return _damaged_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _damaged_cached(path: str, size: int, mtime_ns: int) -> str | None:
    from scalelab.checkpointing import damaged

    return damaged(Path(path))


def check_resume_from(c: dict) -> None:
    """checkpoint.resume_from of a resolved config, before any rank: it exists, is a checkpoint,
    was saved by a run the ranks can load it in, and is before trainer.max_steps. Each problem is
    one ConfigError line (the ranks crashed on each, in tracebacks)."""
    from scalelab.errors import ConfigError

    resume = (c.get("checkpoint") or {}).get("resume_from")
    if not resume:
        return
    path, what = Path(str(resume)).expanduser(), f"checkpoint.resume_from={resume!r}"
    if not path.exists():
        raise ConfigError(f"{what} does not exist: give a checkpoint (file or folder) saved by a run of the same "
                          "kind of strategy (ZeRO: stage, world size and gradient clip), model shape and optimizer, "
                          "or null")
    not_one = folder_problem(path) or file_problem(path) or weights_only_problem(path)
    if not_one:
        raise ConfigError(f"{what} {not_one}")
    # its files as its manifest recorded them, and a file's zip members against their CRCs (a
    # flipped byte loaded and trained on, silently: what the job folder's own are checked for)
    bad = size_problem(path) or _damaged_once(path)
    if bad:
        raise ConfigError(f"{what}: {bad}; give another checkpoint")
    differs = resume_mismatch(path, c)
    if differs:   # a load traceback in the ranks (or another model's weights loaded)
        raise ConfigError(f"{what} was saved by another kind of run ({differs}): resume it with the same kind of "
                          "strategy (ZeRO: stage, world size and gradient clip), model shape and optimizer, or "
                          "start without it")
    other = resume_mismatch(path, c, noted=True)
    if other and (str(path), other) not in _noted:   # loads, but is not the saved run's continuation: said once
        _noted.add((str(path), other))
        print(f"[scalelab] note: {what} was saved with another data order ({other}): the steps after it train "
              "on other batches than the saved run would have", file=sys.stderr)
    max_steps, at = (c.get("trainer") or {}).get("max_steps"), checkpoint_step(path)
    if at is not None and isinstance(max_steps, int) and at >= max_steps:   # no step left to measure
        raise ConfigError(f"{what} is at step {at}: trainer.max_steps={max_steps} must be larger (it counts every "
                          "step, the resumed ones included)")


def folder_problem(path: Path) -> str | None:
    """Why folder `path` is not a checkpoint (None when it is one, or is a file): a sharded
    checkpoint is a torch.distributed.checkpoint folder (`.metadata`) or DeepSpeed's (`latest`);
    a job's checkpoints/ folder, or the job folder itself, names the ones inside it."""
    path = Path(path)
    if not path.is_dir() or (path / ".metadata").exists() or (path / "latest").exists():
        return None
    inner = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = sorted(p.name for p in inner.iterdir() if p.name == "last.ckpt" or _NAME.match(p.name))
    hint = f": the checkpoints in it are {inner}/{{{', '.join(found[-3:])}}}" if found else ""
    return f"is a folder but not a checkpoint (no .metadata or latest file in it){hint}"


def file_problem(path: Path) -> str | None:
    """Why file `path` is not a checkpoint (None when it is one, or is a folder): torch.save's zip
    archive with a data.pkl, as Lightning's .ckpt is. Only the central directory at its end is read:
    a truncated copy or another file (a run.json) crashed every rank in torch.load instead."""
    import zipfile

    if not Path(path).is_file():
        return None
    try:
        with zipfile.ZipFile(path) as z:
            if any(n.rsplit("/", 1)[-1] == "data.pkl" for n in z.namelist()):
                return None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        pass
    return ("is not a checkpoint file (torch.save's zip archive, as Lightning's .ckpt; a truncated copy is not "
            "one either): give a .ckpt or a sharded checkpoint's folder that a run saved, or null")


def weights_only_problem(path: Path) -> str | None:
    """Why file `path` is a model's weights alone and no training checkpoint (None when it is one,
    or cannot be told): a plain state_dict (checkpoint.export_consolidated's model_consolidated.pt)
    has neither Lightning's version nor its state_dict entry, and every rank failed on it with
    KeyError: 'pytorch-lightning_version'."""
    from scalelab.checkpoint_config import saved_entries

    if not Path(path).is_file():
        return None
    entries = saved_entries(path)
    if entries is None:
        return None
    if "pytorch-lightning_version" in entries and "state_dict" in entries and "optimizer_states" not in entries:
        return ("is a weights-only Lightning checkpoint (saved with weights_only=True: no optimizer state, which "
                "resuming restores): give a .ckpt that checkpoint.every_n_steps or checkpoint.save wrote "
                "(JOB_DIR/checkpoints/), or null")
    if "pytorch-lightning_version" in entries or "state_dict" in entries:
        return None
    return ("is no Lightning training checkpoint (weights, optimizer, step, data position) but a model's weights "
            "alone, as checkpoint.export_consolidated's model_consolidated.pt, or another program's file: give a "
            ".ckpt that checkpoint.every_n_steps or checkpoint.save wrote (JOB_DIR/checkpoints/), or null")
