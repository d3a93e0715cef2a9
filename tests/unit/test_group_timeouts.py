"""trainer.collective_timeout_s reaches every process group of a rank, not only the default one
(strategies/group_timeout.py). torch's DeviceMesh and `new_group()` give a group made without a
timeout torch's default (gloo 30 min, NCCL 10 min): a job set to fail after 60 s on a hung peer
waited 30 min on its TP / PP / DP sub-group (found by review).

Two gloo ranks under torchrun run this file as a probe (`__main__` below): each builds the groups
the way a rank does (Lightning's ModelParallelStrategy mesh, nd's and the pipeline's meshes, the
requeue flag's gloo group) under a default group of 60 s, and writes every group's timeout."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    from ..conftest import torchrun_probe   # here: under torchrun this file is a script (__main__)

    return torchrun_probe(Path(__file__), 2, tmp_path_factory.mktemp("group_timeouts"))


def _check(ranks: list[dict], key: str) -> None:
    for r, found in enumerate(ranks):
        got = found[key]
        assert "error" not in got, f"rank {r}: {got}"
        assert got["groups"], f"rank {r}: no group found for {key}"
        # every group: the default one's 60 s (torch's default for a new gloo group is 1800 s)
        assert got["groups"] == [TIMEOUT_S] * len(got["groups"]), f"rank {r} {key}: {got}"


def test_lightning_mesh_of_tp_and_fsdp_tp_has_the_collective_timeout(ranks):
    """ModelParallelStrategy (fsdp, tp, fsdp_tp): the default group and both mesh dimensions."""
    _check(ranks, "lightning")
    assert all(r["lightning"]["default"] == TIMEOUT_S for r in ranks)


def test_nd_meshes_have_the_collective_timeout(ranks):
    """nd's (pp, dp, tp) mesh and its HSDP (pp, dp_replicate, dp_shard, tp) one."""
    _check(ranks, "nd")
    _check(ranks, "nd_hsdp")


def test_pipeline_dp_mesh_has_the_collective_timeout(ranks):
    """strategy=pipeline with dp > 1 builds a (pp, dp) mesh in parallelize."""
    _check(ranks, "pipeline")


def test_requeue_flag_group_has_the_collective_timeout(ranks):
    """The gloo group of the SLURM requeue flag (made on NCCL jobs only: faked here)."""
    _check(ranks, "requeue")


# -- the probe (one process per rank, under torchrun) ----------------------------------------
def _timeouts(*groups) -> list[float]:
    import torch

    return [g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in groups]


def _lightning() -> dict:
    import lightning as L
    import torch
    from lightning.fabric.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.strategies import ModelParallelStrategy

    from scalelab.strategies.group_timeout import with_collective_timeout

    # as the worker builds it (tp / fsdp_tp plans: dp x tp = 2 x 1; the tp dimension is a group of its own)
    strategy = with_collective_timeout(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                                       TIMEOUT_S)
    strategy.accelerator = CPUAccelerator()
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.cluster_environment = TorchElasticEnvironment()
    strategy._lightning_module = L.LightningModule()
    strategy.setup_environment()   # init_process_group, then the device mesh
    import torch.distributed as dist

    return {"default": _timeouts(dist.group.WORLD)[0], "groups": _timeouts(*strategy.device_mesh.get_all_groups())}


def _nd(dp_replicate: int) -> dict:
    from scalelab.strategies.nd import ND

    mesh = ND(tp=1, pp=1, dp_replicate=dp_replicate).build_mesh("cpu", 2)
    return {"groups": _timeouts(*mesh.get_all_groups())}


def _pipeline() -> dict:
    from scalelab.strategies.pipeline import Pipeline

    plan = Pipeline(dp=2)
    plan._trim = lambda net: net   # only the groups matter here, not the stage
    plan.parallelize(None, None)
    return {"groups": _timeouts(plan._pp_group, plan._dp_group)}


def _requeue(out: Path) -> dict:
    from types import SimpleNamespace

    import torch.distributed as dist

    from scalelab.requeue import RequeueOnSignal

    callback = RequeueOnSignal(out, saver=None)
    real = dist.get_backend
    dist.get_backend = lambda group=None: "nccl"   # an NCCL job's: the flag gets a gloo group of its own
    try:
        callback.on_train_start(SimpleNamespace(global_step=0, received_sigterm=False), None)
    finally:
        dist.get_backend = real
    return {"groups": _timeouts(callback._group)}


def _probe(out: Path) -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    found = {}
    for key, section in (("lightning", _lightning), ("nd", lambda: _nd(1)), ("nd_hsdp", lambda: _nd(2)),
                         ("pipeline", _pipeline), ("requeue", lambda: _requeue(out))):
        try:   # each section on its own: one that fails does not hide the others' findings
            found[key] = section()
        except Exception as e:  # noqa: BLE001
            found[key] = {"error": f"{type(e).__name__}: {e}"}
        if not dist.is_initialized():   # Lightning's section failed before its init_process_group
            dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _probe(Path(sys.argv[1]))
