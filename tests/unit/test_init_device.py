"""Where a rank builds the plain model: on its GPU for strategies whose ranks hold the whole
model (no fp32 host copy per rank), on the host for those that cut it first."""
from __future__ import annotations

import hydra.utils
import pytest
import torch
from omegaconf import OmegaConf

from scalelab.models.gpt import GPT, GPTConfig
from scalelab.paths import conf_dir
from scalelab.strategies.base import RunSpec

ON_DEVICE = ["single", "ddp", "ddp_compress", "ddp_powersgd", "zero1", "zero2", "zero2_offload"]
ON_HOST = ["fsdp", "fsdp_grad_op", "tp", "fsdp_tp", "pipeline", "zero3", "zero3_offload"]


def _plan(name):
    return hydra.utils.instantiate(OmegaConf.load(conf_dir() / "strategy" / f"{name}.yaml"), _convert_="all")


def _run(accelerator):
    return RunSpec(world_size=2, num_nodes=1, devices_per_node=2, accelerator=accelerator, precision="32-true",
                   model_arch=GPTConfig())


@pytest.mark.parametrize("name", ON_DEVICE + ON_HOST)
def test_init_device(name):
    plan = _plan(name)
    want = torch.device("cuda", 1) if name in ON_DEVICE else torch.device("cpu")
    assert plan.init_device(_run("gpu"), 1) == want
    assert plan.init_device(_run("cpu"), 1) == torch.device("cpu")


def test_building_under_a_device_context_allocates_there_only():
    """The worker builds the LitModule inside `with plan.init_device(...)`: every parameter is
    created on that device (meta here: no storage at all, so nothing lands in host memory)."""
    with torch.device("meta"):
        net = GPT(GPTConfig(n_layers=2, d_model=64, n_heads=4))
    assert {p.device.type for p in net.parameters()} == {"meta"}
