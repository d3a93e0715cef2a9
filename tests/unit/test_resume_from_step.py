"""checkpoint.resume_from at or past trainer.max_steps: one line before any rank (the ranks crashed
with `statistics.StatisticsError: no median for empty data` and a gloo traceback, 37 lines)."""
import json

import pytest

from scalelab.checkpointing import MANIFEST, checkpoint_step, write_step
from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def _torch_file() -> bytes:
    """A file as torch.save writes it: preflight reads a checkpoint file's zip directory."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"state_dict": {}}, buf)   # Lightning's entry (weights alone are refused)
    return buf.getvalue()


CKPT = _torch_file()


def test_the_step_comes_from_the_manifest_or_the_name(tmp_path):
    periodic = tmp_path / "step-00000060.ckpt"
    periodic.write_bytes(b"x")
    assert checkpoint_step(periodic) == 60                      # its name
    periodic.with_name(periodic.name + MANIFEST).write_text(json.dumps({"step": 61, "files": {}}))
    assert checkpoint_step(periodic) == 61                      # its manifest first
    last = tmp_path / "last.ckpt"
    last.mkdir()                                                # a sharded checkpoint is a folder
    assert checkpoint_step(last) is None
    write_step(last, 40)
    assert checkpoint_step(last) == 40


@pytest.mark.parametrize("max_steps,ok", [(30, False), (60, False), (61, True)])
def test_resume_from_needs_max_steps_past_its_step(tmp_path, max_steps, ok):
    ckpt = tmp_path / "step-00000060.ckpt"
    ckpt.write_bytes(CKPT)
    args = ["model=gpt_nano", f"checkpoint.resume_from={ckpt}", f"trainer.max_steps={max_steps}"]
    if ok:
        assert preflight(args, data=False) == 1
        return
    with pytest.raises(ConfigError) as e:
        preflight(args, data=False)
    assert str(e.value) == (f"checkpoint.resume_from='{ckpt}' is at step 60: trainer.max_steps={max_steps} must be "
                            "larger (it counts every step, the resumed ones included)")


def _saved(tmp_path, strategy, target, d_model=64, dropout=0.0, stage=None, devices=1):
    """A checkpoint as a run of `strategy` leaves it: JOB/checkpoints/last.ckpt beside JOB/config_resolved.yaml."""
    import yaml

    job = tmp_path / strategy
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "last.ckpt").write_bytes(CKPT)
    arch = {"_target_": "scalelab.models.gpt.GPTConfig", "n_layers": 2, "n_heads": 4, "d_model": d_model,
            "seq_len": 64, "vocab_size": 256, "mlp_ratio": 4, "dropout": dropout, "activation_checkpointing": "none"}
    (job / "config_resolved.yaml").write_text(yaml.safe_dump(
        {"strategy": {"name": strategy, "_target_": target, **({"stage": stage} if stage else {})},
         "trainer": {"devices": devices, "num_nodes": 1}, "model": {"name": "gpt_nano", "arch": arch}}))
    return job / "checkpoints" / "last.ckpt"


def test_resume_from_another_kind_of_strategy_or_model_shape_is_one_line(tmp_path):
    """Before, the ranks ended in a load traceback (ddp given an fsdp folder; another width)."""
    fsdp = _saved(tmp_path, "fsdp", "scalelab.strategies.fsdp.FSDP")
    with pytest.raises(ConfigError, match=r"^checkpoint.resume_from='.*' was saved by another kind of run "
                                          r"\(strategy: fsdp vs ddp\): resume it with the same kind of strategy"):
        preflight(["model=gpt_nano", "strategy=ddp", f"checkpoint.resume_from={fsdp}"], data=False)
    assert preflight(["model=gpt_nano", "strategy=fsdp_grad_op", f"checkpoint.resume_from={fsdp}"], data=False) == 1
    single = _saved(tmp_path, "single", "scalelab.strategies.single.Single", d_model=128, dropout=0.1)
    with pytest.raises(ConfigError, match=r"\(model.arch.d_model: 128 vs 64\)"):
        preflight(["model=gpt_nano", "strategy=single", f"checkpoint.resume_from={single}"], data=False)
    # single and ddp read each other's files; dropout and recomputation do not change a shape
    args = ["model=gpt_nano", "model.arch.d_model=128", f"checkpoint.resume_from={single}"]
    assert preflight([*args, "strategy=ddp", "trainer.devices=2", "model.arch.activation_checkpointing=full"],
                     data=False) == 1
    with pytest.raises(ConfigError, match=r"\(strategy: single vs zero2\)"):
        preflight([*args, "strategy=zero2"], data=False)
    # ZeRO: its stage and world size too (DeepSpeed refuses another world size)
    zero = _saved(tmp_path, "zero2", "scalelab.strategies.deepspeed.ZeRO", stage=2, devices=2)
    args = ["model=gpt_nano", f"checkpoint.resume_from={zero}"]
    assert preflight([*args, "strategy=zero2", "trainer.devices=2"], data=False) == 1
    with pytest.raises(ConfigError, match=r"\(strategy.stage: 2 vs 3; world size: 2 x 1 node\(s\) vs 1 x 1 "):
        preflight([*args, "strategy=zero3", "trainer.devices=1"], data=False)
    # a checkpoint copied away from its run: nothing to compare with, the rank finds out
    (tmp_path / "copy.ckpt").write_bytes(CKPT)
    assert preflight(["model=gpt_nano", "strategy=zero2", f"checkpoint.resume_from={tmp_path / 'copy.ckpt'}"],
                     data=False) == 1


def test_an_mlp_s_widths_are_its_shape(tmp_path):
    import yaml

    from scalelab.resume_checks import resume_mismatch

    job = tmp_path / "mlp"
    (job / "checkpoints").mkdir(parents=True)
    ckpt = job / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(b"x")
    mlp = {"_target_": "scalelab.models.mlp.MLPConfig", "in_features": 64, "hidden": [256, 256], "num_classes": 10}
    run = {"strategy": {"name": "ddp", "_target_": "scalelab.strategies.ddp.DDP"}, "model": {"arch": mlp}}
    (job / "config_resolved.yaml").write_text(yaml.safe_dump(run))
    assert resume_mismatch(ckpt, run) is None
    wider = {**run, "model": {"arch": {**mlp, "hidden": [512, 256]}}}
    assert resume_mismatch(ckpt, wider) == "model.arch.hidden: [256, 256] vs [512, 256]"


def test_a_folder_that_is_not_a_checkpoint_is_one_line_naming_the_ones_in_it(tmp_path):
    """Before, the ranks ended in IsADirectoryError tracebacks (a job's checkpoints/ folder given)."""
    ckpts = tmp_path / "job" / "checkpoints"
    ckpts.mkdir(parents=True)
    for name in ("step-00000010.ckpt", "step-00000020.ckpt", "last.ckpt"):
        (ckpts / name).write_bytes(b"x")
    for given in (ckpts, ckpts.parent):
        with pytest.raises(ConfigError) as e:
            preflight(["model=gpt_nano", f"checkpoint.resume_from={given}"], data=False)
        assert str(e.value) == (f"checkpoint.resume_from='{given}' is a folder but not a checkpoint (no .metadata "
                                f"or latest file in it): the checkpoints in it are {ckpts}/{{last.ckpt, "
                                "step-00000010.ckpt, step-00000020.ckpt}")
    dcp = ckpts / "step-00000030.ckpt"          # a sharded checkpoint is a folder too
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"x")
    assert preflight(["model=gpt_nano", "trainer.max_steps=40", f"checkpoint.resume_from={dcp}"], data=False) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"is a folder but not a checkpoint \(no .metadata or latest file in it\)$"):
        preflight(["model=gpt_nano", f"checkpoint.resume_from={empty}"], data=False)
