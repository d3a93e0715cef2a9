"""A rank runs on the accelerator its launcher resolved for the job (config_resolved.yaml's
job.accelerator), not on `trainer.accelerator=auto` resolved again in the rank: on a node where
CUDA failed to initialize, that rank silently took cpu / gloo while the others took NCCL, and the
job hung until the collective timeout (found by review). No GPU here: torch.cuda is faked."""
from __future__ import annotations

import socket

import pytest
import torch
from omegaconf import OmegaConf

from scalelab.config import validate
from scalelab.errors import ConfigError


def _rank_config(launched: str | None, *overrides: str):
    """The config a rank reads: the composed one plus the launcher's `job` block."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from scalelab.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["strategy=single", "model=gpt_nano", "logger=none", *overrides])
    GlobalHydra.instance().clear()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["job"] = {"threads_per_rank": 1, **({"accelerator": launched} if launched else {})}
    return OmegaConf.create(resolved)


def _cuda(monkeypatch, available: bool, count: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("requested", ["auto", "gpu"])
def test_a_rank_without_cuda_in_a_gpu_job_stops_in_one_line_naming_its_host(monkeypatch, requested):
    _cuda(monkeypatch, available=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError) as e:
        validate(_rank_config("gpu", f"trainer.accelerator={requested}"))
    msg = str(e.value)
    assert "\n" not in msg
    assert f"host {socket.gethostname()} sees no CUDA device (CUDA_VISIBLE_DEVICES='')" in msg, msg
    assert f"trainer.accelerator={requested}, resolved to gpu at launch" in msg, msg


def test_a_rank_that_sees_cuda_in_a_cpu_job_stays_on_cpu(monkeypatch):
    """The launcher resolved auto to cpu: a rank whose node has GPUs must not take them (NCCL
    beside the others' gloo)."""
    _cuda(monkeypatch, available=True, count=8)
    spec = validate(_rank_config("cpu", "trainer.accelerator=auto"))
    assert spec.run.accelerator == "cpu"


def test_without_a_recorded_decision_auto_is_resolved_here(monkeypatch):
    """The launcher's own validation (no `job` block yet) resolves auto on its machine, as before."""
    _cuda(monkeypatch, available=False)
    assert validate(_rank_config(None, "trainer.accelerator=auto")).run.accelerator == "cpu"
    with pytest.raises(ConfigError, match="job.accelerator='tpu' must be cpu or gpu"):
        validate(_rank_config("tpu", "trainer.accelerator=auto"))


def test_the_worker_stops_before_building_anything(tmp_path, monkeypatch):
    """scalelab.worker.run itself: the error comes from its first step (validate), before the
    model, the data or any process group."""
    from ..host_syncs import run_job, write_job

    job = write_job(tmp_path / "job", ["strategy=single", "model=gpt_nano", "logger=none", "trainer.accelerator=auto",
                                       "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.profile_steps=0",
                                       "data.global_batch_size=2"])
    cfg = OmegaConf.load(job / "config_resolved.yaml")
    cfg.job.accelerator = "gpu"   # what train.run_job recorded on a launcher that saw CUDA
    OmegaConf.save(cfg, job / "config_resolved.yaml")
    _cuda(monkeypatch, available=False)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        run_job(job)
    assert not (job / "run.json").exists()
