"""`single` on N ranks is N independent replicas: each optimizer steps on its own global / N samples,
so an LR rule scales by that batch. At the global batch's LR (0.1 x 16 / 8 = 0.2 at 2 ranks of 8)
each replica trained at twice the linear rule's LR for its batch of 8 (review, 2026-12-03)."""
import math

import pytest
from omegaconf import OmegaConf

from scalelab.config import validate


def _spec(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from scalelab.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["model=gpt_nano", "logger=none", "optim=sgd", "optim.lr=0.1",
                                          "lr_scaling.base_batch_size=8", "data.global_batch_size=16", *overrides])
    GlobalHydra.instance().clear()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["job"] = {"threads_per_rank": 1}
    return validate(OmegaConf.create(resolved))


@pytest.mark.parametrize("rule,single2,ddp2,single1", [
    # by hand, base LR 0.1 at batch 8: single x2 steps on 8 each (x 8/8), ddp on 16 (x 16/8), single x1 on 16
    ("linear", 0.1, 0.2, 0.2),
    ("sqrt", 0.1, 0.1 * math.sqrt(2), 0.1 * math.sqrt(2)),
    ("none", 0.1, 0.1, 0.1),
])
def test_the_lr_rule_scales_by_the_batch_each_optimizer_steps_on(rule, single2, ddp2, single1):
    assert _spec(f"lr_scaling={rule}", "strategy=single", "trainer.devices=2").lr == pytest.approx(single2)
    assert _spec(f"lr_scaling={rule}", "strategy=ddp", "trainer.devices=2").lr == pytest.approx(ddp2)
    assert _spec(f"lr_scaling={rule}", "strategy=single", "trainer.devices=1").lr == pytest.approx(single1)
