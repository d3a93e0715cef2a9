"""Where a rank builds the plain model: on its GPU for strategies whose ranks hold the whole
model (no fp32 host copy per rank); on the meta device for those that cut it first and then
materialize their own part (tests/integration/test_meta_init.py checks the values; ZeRO-3 is
rebuilt under deepspeed.zero.Init); on the host for models without a per-parameter init."""
from __future__ import annotations

import hydra.utils
import pytest
import torch
from omegaconf import OmegaConf

from scalelab.models.gpt import GPT, GPTConfig
from scalelab.paths import conf_dir
from scalelab.strategies.base import RunSpec

ON_DEVICE = ["single", "ddp", "ddp_compress", "ddp_powersgd", "zero1", "zero2", "zero2_offload"]
ON_META = ["fsdp", "fsdp_grad_op", "tp", "fsdp_tp", "pipeline", "nd", "zero3", "zero3_offload"]
ON_HOST: list[str] = []


def _plan(name):
    return hydra.utils.instantiate(OmegaConf.load(conf_dir() / "strategy" / f"{name}.yaml"), _convert_="all")


def _run(accelerator, arch=None):
    return RunSpec(world_size=2, num_nodes=1, devices_per_node=2, accelerator=accelerator, precision="32-true",
                   model_arch=arch or GPTConfig())


@pytest.mark.parametrize("name", ON_DEVICE + ON_META + ON_HOST)
def test_init_device(name):
    plan = _plan(name)
    meta, cpu = torch.device("meta"), torch.device("cpu")
    want = torch.device("cuda", 1) if name in ON_DEVICE else meta if name in ON_META else cpu
    assert plan.init_device(_run("gpu"), 1) == want
    assert plan.init_device(_run("cpu"), 1) == (meta if name in ON_META else cpu)


@pytest.mark.parametrize("name", ON_META)
def test_a_model_without_a_per_parameter_init_is_built_on_the_host(name):
    from scalelab.models.mlp import MLPConfig

    assert _plan(name).init_device(_run("cpu", MLPConfig()), 0) == torch.device("cpu")


def test_each_parameter_init_depends_on_seed_and_name_only():
    """GPT.fill_initial: the same seed gives the same weights whatever else was drawn in between
    (a meta-built rank draws them later, and only its own); another seed gives others."""
    cfg = GPTConfig(n_layers=2, d_model=64, n_heads=4)
    torch.manual_seed(7)
    a = GPT(cfg)
    torch.manual_seed(7)
    torch.randn(1000)  # the global stream moves; GPT's init does not draw from it
    b = GPT(cfg)
    torch.manual_seed(8)
    c = GPT(cfg)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "ln" not in name:
            assert not torch.equal(pa, pc), name
    w = a.layers["1"].attn.out_proj.weight   # GPT-2 residual scaling: 0.02 / sqrt(2 x 2 layers) = 0.01
    assert w.std().item() == pytest.approx(0.01, rel=0.05)
    assert a.layers["0"].mlp.up.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(a.ln_f.weight, torch.ones(64)) and torch.equal(a.ln_f.bias, torch.zeros(64))


def test_building_under_a_device_context_allocates_there_only():
    """The worker builds the LitModule inside `with plan.init_device(...)`: every parameter is
    created on that device (meta here: no storage at all, so nothing lands in host memory)."""
    with torch.device("meta"):
        net = GPT(GPTConfig(n_layers=2, d_model=64, n_heads=4))
    assert {p.device.type for p in net.parameters()} == {"meta"}
