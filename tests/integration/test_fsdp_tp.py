"""fsdp, fsdp_grad_op, tp and fsdp_tp end to end: real multi-rank runs through scalelab-train.

Reference runs come from the session fixture core_sweep (single at 1 rank and ddp at 2 ranks,
20 steps of gpt_nano, fp32, global batch 16, SGD with momentum: linear in the gradient, so a
gradient off by a constant factor shows; see tests/conftest.py SGD). Each strategy job here is
shared by several checks (equivalence, sharding, checkpoint round trip, consolidated export) to
keep the default suite short; 4-rank runs and extra variants are marked slow.

Tolerances. In fp32, FSDP (reduce-scatter of the gradient, 1/dp of the sum on each rank) and TP
(the same matmuls split by columns/rows, partial results all-reduced) only change the order of
floating-point sums relative to one device, so the loss curves agree to float rounding
(measured 2026-11-30, SGD, 10 steps: fsdp 1.1e-7, tp 1.3e-7 relative; after the resume, steps
11-20, where SGD's loss spikes amplify rounding: fsdp 1.8e-6, tp 3.3e-7; DDP vs single reaches
3.8e-6 by step 20). 1e-4 relative leaves >= 25x room for the reordering to grow, and is far below
a gradient-scale error: twice the gradient (DDP summing instead of averaging) moves the loss by
1.1e-2 at the first step it shows and up to 0.85
(test_ddp_options.py::test_ddp_summing_gradients_fails_the_equivalence).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import (assert_carries_its_config, assert_nano_flops, assert_same_curve,
                        assert_trained_from_seeded_init, losses_by_step, worker_pids)
from ..conftest import read_record as _rec
from ..conftest import run_jobs
from ..conftest import run_one_job as _job

pytestmark = pytest.mark.integration

REL = 1e-4  # see the module docstring


_losses = losses_by_step


def _assert_same_curve(rec: dict, ref: dict, steps, rel: float = REL) -> None:
    assert_same_curve(rec, ref, steps, rel)


# -- shared runs (the references single@1 / ddp@2: the `ref` fixture of tests/conftest.py) ----


def _saved_and_resumed(tmp_path_factory, strategies: tuple[str, ...], devices: int) -> dict:
    """Each strategy: 10 steps + sharded checkpoint + consolidated export (one multirun for all),
    then a second multirun resumes each to step 20 (conftest.run_jobs)."""
    tag = "_".join(strategies)
    saved = run_jobs(tmp_path_factory, f"{tag}_saved", {
        s: [f"strategy={s}", f"trainer.devices={devices}", "trainer.max_steps=10", "checkpoint.save=true",
            "checkpoint.export_consolidated=true"] for s in strategies})
    ckpt = {s: job / "checkpoints" / "last.ckpt" for s, job in saved.items()}
    resumed = run_jobs(tmp_path_factory, f"{tag}_resumed", {
        s: [f"strategy={s}", f"trainer.devices={devices}", "trainer.max_steps=20",
            f"checkpoint.resume_from={ckpt[s]}"] for s in strategies})
    return {s: {"saved": saved[s], "resumed": resumed[s], "ckpt": ckpt[s]} for s in strategies}


@pytest.fixture(scope="module")
def saved_and_resumed(tmp_path_factory) -> dict:
    return _saved_and_resumed(tmp_path_factory, ("fsdp", "tp"), 2)


@pytest.fixture(scope="module")
def fsdp_runs(saved_and_resumed):
    return saved_and_resumed["fsdp"]


@pytest.fixture(scope="module")
def tp_runs(saved_and_resumed):
    return saved_and_resumed["tp"]


@pytest.fixture(scope="module")
def grad_op_run(tmp_path_factory):
    return _job(tmp_path_factory, "fsdp_grad_op", ["strategy=fsdp_grad_op", "trainer.devices=2",
                                                   "trainer.max_steps=10"])


def _ten_steps(request, strategy: str) -> Path:
    """The 10-step 2-rank job of a strategy (shared with its other checks)."""
    if strategy == "fsdp_grad_op":
        return request.getfixturevalue("grad_op_run")
    return request.getfixturevalue(f"{strategy}_runs")["saved"]


# -- equivalence ------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("fsdp_grad_op", marks=pytest.mark.slow), "tp"])
def test_two_ranks_match_single_device(strategy, request, ref):
    rec = _rec(_ten_steps(request, strategy))
    assert rec["status"] == "completed" and rec["world_size"] == 2
    assert rec["global_batch_size"] == ref["single"]["global_batch_size"] == 16
    _assert_same_curve(rec, ref["single"], range(1, 11))
    assert rec["loss"]["final"] < rec["loss"]["first"] - 1.0  # it learns
    assert_nano_flops(rec)
    if strategy == "tp":
        # one TP group of 2 ranks: both read the whole global batch (dp rank 0 of 1)
        assert rec["parallel"] == {"dp": 1, "tp": 2, "pp": 1}
        assert rec["per_device_batch_size"] == 16
    else:
        assert rec["parallel"] == {"dp": 2, "tp": 1, "pp": 1}
        assert rec["per_device_batch_size"] == 8


# -- sharding ---------------------------------------------------------------------------------
def _ratio(rec: dict, ddp: dict, key: str) -> list[float]:
    ours = rec["memory"]["model_state_breakdown_per_rank"]
    theirs = ddp["memory"]["model_state_breakdown_per_rank"]
    return [o[key] / t[key] for o, t in zip(ours, theirs)]


@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("fsdp_grad_op", marks=pytest.mark.slow), "tp"])
def test_params_grads_and_optimizer_state_halve_vs_ddp(strategy, request, ref):
    """FSDP shards every tensor along dim 0 over 2 ranks: exactly half. TP shards all matmul
    weights and the vocab-parallel embedding and head; pos_emb (64x64) and the LayerNorms
    (5 x 2 x 64) stay replicated on both TP ranks (their inputs are replicated, there is nothing
    to split), which is 4,736 of gpt_nano's 135,808 parameters: a TP rank holds 70,272 = 0.517 of
    the model. The optimizer state (SGD's momentum buffers here, Adam's moments alike) follows
    the parameters' DTensor layout, so it shrinks alike.
    SHARD_GRAD_OP frees the gathered parameters after backward, so after the step (when the
    bytes are measured) it holds what FULL_SHARD holds."""
    rec = _rec(_ten_steps(request, strategy))
    for key in ("params", "grads", "optimizer"):
        for r in _ratio(rec, ref["ddp"], key):
            assert 0.5 <= r <= 0.55, (key, r)  # half, within 10%
    if strategy.startswith("fsdp"):
        assert all(r == pytest.approx(0.5, abs=1e-3) for r in _ratio(rec, ref["ddp"], "params"))


# -- checkpoint round trip --------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_sharded_checkpoint_resumes_on_the_same_curve(strategy, request, ref):
    """The resumed job takes steps 11..20 and matches the uninterrupted 20-step curve. The
    uninterrupted reference is `single` (one device): the strategy equals it step for step
    (test above, same tolerance), and resuming must continue on that curve exactly (momentum
    buffers, step count and the data position are restored)."""
    r = request.getfixturevalue(f"{strategy}_runs")
    ckpt = r["ckpt"]
    assert ckpt.is_dir()  # torch.distributed.checkpoint: one shard file per rank + metadata
    assert len(list(ckpt.glob("*.distcp"))) == 2 and (ckpt / ".metadata").exists()
    assert_carries_its_config(ckpt, 10)
    rec = _rec(r["resumed"])
    assert rec["resumed_from"] == str(ckpt) and rec["resumed_at_step"] == 10 and rec["steps"] == 20
    assert rec["steps_this_attempt"] == 10
    _assert_same_curve(rec, ref["single"], range(11, 21))
    assert rec["loss"]["final"] == pytest.approx(ref["single"]["loss"]["final"], rel=REL)


def test_tp_on_one_device_resumes_a_sharded_checkpoint(tp_runs, tmp_path_factory, ref):
    """At one device tp applies neither TP nor replicate: plain parameters, which Lightning's loader
    refused ("Could not find a distributed model") for every checkpoint, the job's own included, so
    a tp@1 baseline never resumed. Here the 2-rank tp checkpoint, into tp@1: steps 11-20 on the
    uninterrupted curve (the same loader reads a tp@1 job's own checkpoint)."""
    job = _job(tmp_path_factory, "tp1_resumed", ["strategy=tp", "trainer.devices=1", "trainer.max_steps=20",
                                                  f"checkpoint.resume_from={tp_runs['ckpt']}"])
    rec = _rec(job)
    assert rec["status"] == "completed" and rec["resumed_at_step"] == 10 and rec["steps_this_attempt"] == 10
    _assert_same_curve(rec, ref["single"], range(11, 21))


@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_consolidated_export_loads_strict_into_plain_gpt(strategy, request, fsdp_runs, tp_runs):
    import torch

    from scalelab.models.gpt import GPT, GPTConfig

    job = request.getfixturevalue(f"{strategy}_runs")["saved"]
    state = torch.load(job / "model_consolidated.pt")
    nano = dict(n_layers=2, n_heads=4, d_model=64, seq_len=64, vocab_size=256, mlp_ratio=4)
    model = GPT(GPTConfig(**nano))
    model.load_state_dict(state, strict=True)  # same keys and full shapes as the plain GPT
    assert set(state) == set(model.state_dict())
    # The trained weights, not the initial ones: they differ from the job's own seeded initial
    # weights in every tensor (and equal them where no gradient ever flowed).
    assert_trained_from_seeded_init(state, _rec(job))
    # ... and whole, not a shard: fsdp and tp trained the same model for the same 10 steps, so
    # each export agrees with the other strategy's (measured max abs difference 1.2e-7 with SGD;
    # 2e-5 with AdamW, whose 1/sqrt(v) amplified noise on rows of never-seen bytes).
    other = torch.load({"fsdp": tp_runs, "tp": fsdp_runs}[strategy]["saved"] / "model_consolidated.pt")
    for k, v in state.items():
        assert torch.allclose(v, other[k], rtol=1e-4, atol=1e-5), k


# -- preflight --------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["strategy=fsdp_tp", "trainer.devices=4", "strategy.tensor_parallel_size=3"],
     "tensor_parallel_size=3 does not divide the world size 4: choose one of 1, 2, 4"),
    (["strategy=tp", "trainer.devices=8"],  # auto = 8 ranks, gpt_nano has 4 heads
     "tensor_parallel_size=8 does not divide model n_heads 4: choose one of 1, 2, 4"),
    (["strategy=fsdp_tp", "trainer.devices=6", "strategy.tensor_parallel_size=3"],
     "tensor_parallel_size=3 does not divide model n_heads 4: choose one of 1, 2"),
    (["strategy=tp", "trainer.devices=2", "strategy.tensor_parallel_size=0"],
     "tensor_parallel_size=0 must be a positive integer"),
    (["strategy=tp", "trainer.devices=2", "model=mlp"], "GPT models only"),
    (["strategy=fsdp", "trainer.devices=2", "trainer.precision=16-mixed"],
     "trainer.precision=16-mixed is not supported by strategy=fsdp: choose one of"),
])
def test_bad_tensor_parallel_setups_fail_at_preflight(args, needle):
    from scalelab.errors import ConfigError
    from scalelab.preflight import preflight

    with pytest.raises(ConfigError) as e:
        preflight([*args, "trainer.accelerator=cpu"])
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize("args", [
    ["strategy=fsdp", "trainer.devices=2"], ["strategy=fsdp_grad_op", "trainer.devices=2"],
    ["strategy=tp", "trainer.devices=2"], ["strategy=fsdp_tp", "trainer.devices=4"],
    ["strategy=tp", "trainer.devices=4", "strategy.tensor_parallel_size=2"],
    ["strategy=fsdp", "trainer.devices=2", "trainer.precision=bf16-mixed"]])
def test_good_setups_pass_preflight(args):
    from scalelab.preflight import preflight

    assert preflight([*args, "trainer.accelerator=cpu"]) == 1


def test_no_rank_outlives_its_job(fsdp_runs, tp_runs):
    for runs in (fsdp_runs, tp_runs):
        for job in (runs["saved"], runs["resumed"]):
            assert worker_pids(job) == []


# -- slow: 4 ranks, 2-D, and variants ---------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp_tp_runs(tmp_path_factory):
    return _saved_and_resumed(tmp_path_factory, ("fsdp_tp",), 4)["fsdp_tp"]


@pytest.mark.slow
def test_fsdp_tp_four_ranks_2d(fsdp_tp_runs, ref):
    """dp 2 x tp 2. Every TP-sharded tensor is sharded again over dp: 1/4 per rank; the
    TP-replicated remainder (pos_emb, LayerNorms: 4,736 parameters) is sharded over dp only:
    131,072 / 4 + 4,736 / 2 = 35,136 parameters per rank = 0.259 of the model (0.25 within 10%)."""
    rec = _rec(fsdp_tp_runs["saved"])
    assert rec["world_size"] == 4 and rec["parallel"] == {"dp": 2, "tp": 2, "pp": 1}
    assert rec["per_device_batch_size"] == 8
    _assert_same_curve(rec, ref["single"], range(1, 11))
    for key in ("params", "grads", "optimizer"):
        for r in _ratio(rec, ref["ddp"], key):
            assert 0.25 <= r <= 0.275, (key, r)
    assert len(list(fsdp_tp_runs["ckpt"].glob("*.distcp"))) == 4
    _assert_same_curve(_rec(fsdp_tp_runs["resumed"]), ref["single"], range(11, 21))
    import torch

    from scalelab.models.gpt import GPT, GPTConfig

    GPT(GPTConfig()).load_state_dict(torch.load(fsdp_tp_runs["saved"] / "model_consolidated.pt"), strict=True)


@pytest.mark.slow
def test_tp_groups_with_data_parallel_replicas(tmp_path_factory, ref):
    """tp at 4 ranks with tensor_parallel_size 2: 2 TP groups, gradients all-reduced between the
    replicas (FSDP2 replicate); TP peers read the same samples, the groups different ones."""
    rec = _rec(_job(tmp_path_factory, "tp_dp", ["strategy=tp", "trainer.devices=4", "trainer.max_steps=10",
                                                "strategy.tensor_parallel_size=2"]))
    assert rec["parallel"] == {"dp": 2, "tp": 2, "pp": 1} and rec["per_device_batch_size"] == 8
    _assert_same_curve(rec, ref["single"], range(1, 11))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_accumulation_and_activation_checkpointing_stay_equivalent(strategy, tmp_path_factory, ref):
    """micro-batch 4 with 2 accumulation steps and checkpointed blocks: the same gradient as
    one device on the whole batch (sums reordered only), so the same tolerance."""
    rec = _rec(_job(tmp_path_factory, f"{strategy}_acc_ac", [
        f"strategy={strategy}", "trainer.devices=2", "trainer.max_steps=10", "data.micro_batch_size=4",
        "model.arch.activation_checkpointing=true"]))
    assert rec["accumulate_grad_batches"] == (2 if strategy == "fsdp" else 4)
    _assert_same_curve(rec, ref["single"], range(1, 11))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_bf16_mixed_trains_close_to_fp32(strategy, tmp_path_factory, ref):
    """bf16-mixed: FSDP2 computes with bf16 copies of fp32 master parameters (fp32 gradient
    reduce-scatter); TP runs under autocast. bf16 has an 8-bit mantissa (~4e-3 relative per
    rounding), so the curve is only close to fp32's: 5% over 10 steps. State bytes are fp32."""
    rec = _rec(_job(tmp_path_factory, f"{strategy}_bf16", [
        f"strategy={strategy}", "trainer.devices=2", "trainer.max_steps=10", "trainer.precision=bf16-mixed"]))
    got, want = _losses(rec), _losses(ref["single"])
    for s in range(1, 11):
        assert abs(got[s] - want[s]) <= 0.05 * want[s], (s, got[s], want[s])
    assert got[10] < got[1] - 1.0
    for r in _ratio(rec, ref["ddp"], "params"):
        assert 0.5 <= r <= 0.55
