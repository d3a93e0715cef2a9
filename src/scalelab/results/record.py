"""The run record (`run.json`, one per job; contract in shared/DESIGN.md)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
_SECRET = re.compile(r"(api[_-]?key|token|secret|password|passwd|credential)", re.I)


def scrub(obj: Any) -> Any:
    """Drop values whose key looks like a secret, so saved configs and logs never hold one."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if _SECRET.search(str(k)) else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)  # readers never see half a file


def base_record(cfg: dict, batch, lr: float, world_size: int, plan_degrees: dict, arch: Any,
                n_params: int | None, accelerator: str, threads: int) -> dict:
    """Everything known before training: identical for completed and failed runs."""
    arch_d = {k: getattr(arch, k) for k in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")
              if hasattr(arch, k)}
    if hasattr(arch, "mlp_ratio"):
        arch_d["ffn_hidden"] = arch.mlp_ratio * arch.d_model
    return {
        "status": None,
        "strategy": cfg["strategy"]["name"],
        "world_size": world_size,
        "num_nodes": cfg["trainer"]["num_nodes"],
        "devices_per_node": cfg["trainer"]["devices"],
        "global_batch_size": batch.global_batch_size,
        "per_device_batch_size": batch.per_device_batch_size,
        "accumulate_grad_batches": batch.accumulate_grad_batches,
        "lr_rule": cfg["lr_scaling"]["rule"],
        "base_lr": cfg["optim"]["lr"],
        "base_batch_size": cfg["lr_scaling"]["base_batch_size"],
        "lr": lr,
        "steps": 0,
        "throughput": {"samples_per_s": None, "tokens_per_s": None},
        "step_time_s": {"median": None, "p90": None},
        "memory": {"peak_rss_bytes_per_rank": [], "model_state_bytes_per_rank": []},
        "loss": {"first": None, "final": None, "curve": []},
        "precision": str(cfg["trainer"]["precision"]),
        "optimizer": cfg["optim"]["name"],
        "model": {"name": cfg["model"]["name"], "kind": "gpt" if cfg["model"]["task"] == "lm" else "mlp",
                  "n_params": n_params, **arch_d},
        "parallel": plan_degrees,
        "activation_checkpointing": getattr(arch, "activation_checkpointing", "none"),
        "hardware": {"accelerator": accelerator, "threads_per_rank": threads},
        "seed": cfg["seed"],
        "max_steps": cfg["trainer"]["max_steps"],
        "job": {k: v for k, v in cfg.get("job", {}).items()},
        "config": scrub({k: v for k, v in cfg.items() if k != "job"}),
    }


def read_records(paths: list[Path | str]) -> list[dict]:
    """run.json files found under each path (a run.json, a job dir or a sweep dir)."""
    out = []
    for p in map(Path, paths):
        files = [p] if p.is_file() else sorted(p.rglob(RUN_FILE))
        for f in files:
            rec = json.loads(f.read_text())
            rec.setdefault("job", {})["record_path"] = str(f)
            out.append(rec)
    return out
