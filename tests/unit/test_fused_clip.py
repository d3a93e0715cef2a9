"""AdamW's fused kernel (optim.fused_on_gpu, the GPU default) and gradient clipping under
Lightning's mixed precision: MixedPrecision.clip_gradients refuses an optimizer that unscales its
gradients itself (a fused one), bf16 included, so every GPU run with trainer.gradient_clip_val
failed its first step. LitModule then uses foreach; an explicit fused=true with clipping is refused
before any rank starts, except where the strategy clips itself (DeepSpeed, pipeline)."""
from __future__ import annotations

import functools

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir

from scalelab.config import validate
from scalelab.errors import ConfigError
from scalelab.models.gpt import GPTConfig
from scalelab.models.lit import LitModule
from scalelab.paths import conf_dir

NANO = GPTConfig(n_layers=1, n_heads=2, d_model=16, seq_len=8, vocab_size=256)


def _optimizer_on_a_cuda_rank(clip, precision="bf16-mixed"):
    """LitModule.configure_optimizers as on a CUDA rank (its device says cuda; the tensors stay on
    this CPU, where torch's fused AdamW also runs), under the trainer's real precision plugin."""
    lit = LitModule(NANO, "lm", functools.partial(torch.optim.AdamW), 1e-3, 10, 0, "constant", 0.1,
                    fused_on_gpu=True)
    lit._device = torch.device("cuda", 0)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, gradient_clip_val=clip, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    lit.trainer = trainer
    opt = lit.configure_optimizers()["optimizer"]
    for p in lit.parameters():
        p.grad = torch.ones_like(p)
    return trainer, opt


def test_no_clip_keeps_the_fused_kernel():
    _, opt = _optimizer_on_a_cuda_rank(clip=None)
    assert opt.defaults["fused"] is True


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_clipping_under_mixed_precision_steps(precision):
    trainer, opt = _optimizer_on_a_cuda_rank(clip=1.0, precision=precision)
    # what Lightning's loop calls before each optimizer step with gradient_clip_val set
    trainer.precision_plugin.clip_gradients(opt, 1.0)
    # 32-true clips a fused optimizer fine: the fused kernel stays there
    assert bool(opt.defaults.get("fused")) is (precision == "32-true")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("train", overrides=["model=gpt_nano", "trainer.devices=2", "trainer.precision=bf16-mixed",
                                           "trainer.gradient_clip_val=1.0", "optim.optimizer.fused=true", *overrides])


def test_explicit_fused_with_clipping_is_refused_where_lightning_clips():
    with pytest.raises(ConfigError, match=r"^optim.optimizer.fused=true with trainer.gradient_clip_val=1.0 under "
                                          r"trainer.precision=bf16-mixed: .*\(strategy=fsdp\)"):
        validate(_cfg("strategy=fsdp"), target="cpu")


@pytest.mark.parametrize("strategy", ["zero2", "pipeline"])
def test_strategies_that_clip_themselves_are_not_refused(strategy):
    validate(_cfg(f"strategy={strategy}", "data.global_batch_size=16"), target="cpu")


def test_zero_skips_the_gradient_norm_only_where_deepspeed_allows_and_nothing_reads_it():
    """ZeRO-1/2's per-step gradient norm (compute_grad_norm) is off only without clipping, without
    optimizer offload, and not for ZeRO-1's BF16 optimizer (bf16 + fp32 accumulation): DeepSpeed
    0.19.8 raises for each of those (stage_1_and_2.py, engine.py)."""
    from scalelab.strategies.deepspeed_lightning import skips_grad_norm

    def cfg(stage, **kw):
        zero = {"stage": stage, **kw.pop("zero", {})}
        return {"zero_optimization": zero, "gradient_clipping": 0.0, **kw}

    assert skips_grad_norm(cfg(1)) and skips_grad_norm(cfg(2)) and skips_grad_norm(cfg(2, bf16={"enabled": True}))
    assert not skips_grad_norm(cfg(3))                                    # stage 3 has no such option
    assert not skips_grad_norm(cfg(2, gradient_clipping=1.0))             # clipping reads the norm
    assert not skips_grad_norm(cfg(2, zero={"offload_optimizer": {"device": "cpu"}}))
    assert skips_grad_norm(cfg(2, zero={"offload_optimizer": {"device": "none"}}))
    assert not skips_grad_norm(cfg(2, zero={"compute_grad_norm": True}))  # the user's own setting
    assert not skips_grad_norm(cfg(1, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}))
    assert skips_grad_norm(cfg(2, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}))
