"""`scalelab plan` / `scalelab recommend`: review findings. A TP group across nodes is refused as the
trainer refuses it (config.validate: a TP group stays inside a node); a global batch no layout
splits is one line naming the smallest valid one, not "no layout fits device memory"; an MLP width
scalelab-train cannot build is refused before the search; a negative --global-batch is named as
such (it was "--micro-batch must be >= 1, got -1"); recommend says which strategies it left out
and why. Bad input: one line, exit 2. Expected values are worked out by hand."""
from __future__ import annotations

import json

import pytest

from scalelab.cli import build_parser
from scalelab.plan.spec import ModelSpec, PlanError, get_strategy, resolve_layout
from scalelab.recommend.cli import _request

from ..conftest import run_cli


def one_line_error(code, cap) -> str:
    assert code == 2 and cap.err.startswith("error: ") and cap.err.count("\n") == 1, (code, cap.err)
    return cap.err


# ----------------------------------------------------------------- 1. tensor parallel across nodes
@pytest.mark.parametrize("strategy,extra", [("tp", []), ("fsdp_tp", []), ("nd", ["--pp", "1"])])
def test_plan_refuses_a_tp_group_across_nodes(capsys, strategy, extra):
    # 7B guessed: 32 heads, width 4096, MLP 16384, vocab 50304: every divisor of 8 splits it
    code, cap = run_cli(["plan", "--params", "7B", "--vocab", "50304", "--strategy", strategy, "--tp", "16",
                         "--devices", "8", "--nodes", "2", *extra], capsys)
    err = one_line_error(code, cap)
    assert "--tp 16 does not divide --devices 8 (devices per node, 2 nodes)" in err, err
    assert f"strategy={strategy}" in err and "valid tp: 1, 2, 4, 8" in err, err


def test_plan_names_the_tp_flag_before_the_vocabulary(capsys):
    # the finding's command (vocab 50257: only tp 1 splits it) names the node, not the vocabulary
    code, cap = run_cli(["plan", "--params", "7B", "--strategy", "tp", "--tp", "16", "--devices", "8",
                         "--nodes", "2"], capsys)
    err = one_line_error(code, cap)
    assert "--tp 16 does not divide --devices 8" in err and "valid tp: 1" in err, err


def test_tp_not_dividing_the_devices_per_node_on_two_nodes():
    # 6 devices per node x 2, tp 4: world 12 divides, but the group of ranks 4..7 is on nodes 0 and 1
    model = ModelSpec.trainer_gpt(2, 256, 4, 256, 64)
    with pytest.raises(PlanError, match=r"--tp 4 does not divide --devices 6 \(devices per node, 2 nodes\)"):
        resolve_layout(get_strategy("tp"), model, 6, nodes=2, tp=4, global_batch=12)
    L = resolve_layout(get_strategy("tp"), model, 6, nodes=2, tp=2, global_batch=12)   # inside a node: planned
    assert (L.tp, L.dp, L.group_spans_nodes("tp")) == (2, 6, False)


def test_plan_and_trainer_agree_on_tp_across_nodes(capsys):
    # the trainer's own config code (the override form) refuses what the flag form now refuses
    code, cap = run_cli(["plan", "strategy=tp", "strategy.tensor_parallel_size=4", "trainer.devices=2",
                         "trainer.num_nodes=2", "launcher=srun", "model=gpt_nano"], capsys)
    err = one_line_error(code, cap)
    assert "a TP group must stay inside a node" in err, err
    code, cap = run_cli(["plan", "--model", "gpt_nano", "--strategy", "tp", "--tp", "4", "--devices", "2",
                         "--nodes", "2"], capsys)
    assert "--tp 4 does not divide --devices 2" in one_line_error(code, cap)


def test_plan_keeps_tp_inside_a_node_on_several_nodes(capsys):
    code, cap = run_cli(["plan", "--params", "7B", "--vocab", "50304", "--strategy", "tp", "--tp", "8",
                         "--devices", "8", "--nodes", "2", "--json"], capsys)
    assert code == 0, cap.err
    par = json.loads(cap.out)["inputs"]["parallel"]
    assert (par["nodes"], par["devices_per_node"]) == (2, 8), par


# ----------------------------------------------------------------- 2. a global batch no layout splits
def test_recommend_names_the_global_batch_not_memory(capsys, tmp_path):
    # 4 x 8 = 32 devices, vocab 50257 rules tp out: every dp (and every pipeline's dp x pp) is 32,
    # the default global batch is 16: the smallest that splits is 32
    out = tmp_path / "r"
    code, cap = run_cli(["recommend", "--params", "7B", "--devices", "8", "--nodes", "4", "--hardware",
                         "h100_sxm", "--out", str(out)], capsys)
    err = one_line_error(code, cap)
    assert err.startswith("error: --global-batch 16 does not split over any layout searched on 4x8 devices"), err
    assert "dp 32" in err and "the smallest valid --global-batch is 32" in err, err
    assert "fits device memory" not in err and not out.exists()


def test_recommend_global_batch_list_and_strategies(capsys, tmp_path):
    code, cap = run_cli(["recommend", "--params", "7B", "--devices", "8", "--nodes", "4", "--hardware", "h100_sxm",
                         "--strategies", "ddp,fsdp", "--global-batch", "8,24", "--out", str(tmp_path / "r")], capsys)
    err = one_line_error(code, cap)
    assert "--global-batch 8,24 does not split" in err and "multiple of the data-parallel ranks: dp 32)" in err, err
    assert "pipeline" not in err and "the smallest valid --global-batch is 32" in err, err


def test_recommend_keeps_no_layout_fits_memory_when_memory_is_the_reason(capsys, tmp_path):
    # 70B on one 80 GB device: the batch splits (dp 1), nothing fits
    code, cap = run_cli(["recommend", "--params", "70B", "--devices", "1", "--hardware", "h100_sxm",
                         "--strategies", "single", "--activation-checkpointing", "full",
                         "--out", str(tmp_path / "r")], capsys)
    assert code == 1 and "error: no layout fits device memory" in cap.err, cap.err


# ----------------------------------------------------------------- 3. --ffn-hidden the trainer cannot build
def test_recommend_refuses_an_mlp_width_that_is_no_multiple_before_the_search(capsys, tmp_path):
    out = tmp_path / "r"
    code, cap = run_cli(["recommend", "--layers", "4", "--hidden", "256", "--heads", "4", "--ffn-hidden", "1000",
                         "--devices", "2", "--hardware", "h100_sxm", "--out", str(out)], capsys)
    err = one_line_error(code, cap)
    assert "--ffn-hidden 1000 is not a multiple of --hidden 256" in err, err
    assert "valid: 256, 512, 768, ... (default 4 x hidden = 1024)" in err and not out.exists(), err


def test_recommend_accepts_a_multiple_mlp_width(tmp_path):
    a = build_parser().parse_args(["recommend", "--layers", "4", "--hidden", "256", "--heads", "4",
                                   "--ffn-hidden", "512", "--devices", "2", "--hardware", "h100_sxm",
                                   "--out", str(tmp_path / "r")])
    req, _ = _request(a)
    assert (req.model.ffn, req.model.hidden) == (512, 256)


@pytest.mark.parametrize("command", [["plan", "--strategy", "ddp"], ["recommend", "--hardware", "h100_sxm"]])
def test_ffn_hidden_with_params_alone_is_refused(capsys, tmp_path, command):
    # the guessed shape's MLP is 4 x hidden: --ffn-hidden was dropped without a word
    code, cap = run_cli([*command, "--params", "1B", "--ffn-hidden", "1000", "--out", str(tmp_path / "r")]
                        if command[0] == "recommend" else [*command, "--params", "1B", "--ffn-hidden", "1000"], capsys)
    err = one_line_error(code, cap)
    assert "--ffn-hidden 1000 needs the whole shape (--layers --hidden --heads)" in err, err


def test_plan_says_why_an_mlp_width_has_no_same_job(capsys):
    code, cap = run_cli(["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--ffn-hidden", "1000",
                         "--strategy", "ddp"], capsys)
    assert code == 0, cap.err
    assert "no same job: --ffn-hidden 1000 is not a multiple of --hidden 256" in cap.out, cap.out


# ----------------------------------------------------------------- 4. a negative --global-batch
@pytest.mark.parametrize("value", ["-8", "0"])
def test_plan_names_a_bad_global_batch(capsys, value):
    code, cap = run_cli(["plan", "--params", "1B", "--strategy", "ddp", "--devices", "8", "--global-batch", value],
                        capsys)
    err = one_line_error(code, cap)
    assert err == f"error: --global-batch must be >= 1 (sequences per optimizer step), got {value}\n", err


def test_resolve_layout_names_a_bad_global_batch():
    model = ModelSpec.trainer_gpt(2, 256, 4, 256, 64)
    with pytest.raises(PlanError, match=r"^--global-batch must be >= 1, got -8; valid: multiples of dp x micro-batch "
                                        r"= 8 x 1 = 8$"):
        resolve_layout(get_strategy("ddp"), model, 8, global_batch=-8)


# ----------------------------------------------------------------- 5. strategies left out, said
def test_recommend_says_which_strategies_it_left_out(capsys, tmp_path):
    # vocab 50257 is odd: no tp degree (2, on a node of 2) splits it; tp and fsdp_tp share the reason
    out = tmp_path / "r"
    code, cap = run_cli(["recommend", "--layers", "2", "--hidden", "128", "--heads", "2", "--seq-len", "128",
                         "--devices", "2", "--hardware", "h100_sxm", "--global-batch", "4", "--strategies",
                         "ddp,tp,fsdp_tp", "--activation-checkpointing", "none", "--out", str(out)], capsys)
    assert code == 0, cap.err
    lines = [x for x in cap.out.splitlines() if x.startswith("not searched: ")]
    assert len(lines) == 1 and lines[0].startswith("not searched: tp, fsdp_tp: no tp degree inside a node of 2 "
                                                   "divides the model"), cap.out
    assert "vocab_size 50257 is not divisible by tp 2" in lines[0], lines
    doc = json.loads((out / "recommendation.json").read_text())
    assert sorted(doc["search"]["excluded"]) == ["fsdp_tp", "tp"], doc["search"]
