"""`scalelab recommend`: the search space, pruning, ranking, the LR advice, the candidates in the
trainer's vocabulary, bad input. Expected values are worked out by hand in each test."""
from __future__ import annotations

import json
import math

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from scalelab.cli import build_parser
from scalelab.config import validate
from scalelab.paths import conf_dir
from scalelab.plan.hardware import parse_hardware
from scalelab.plan.spec import ModelSpec
from scalelab.recommend import lr as lr_mod
from scalelab.recommend.published import MEGATRON, megatron_published, megatron_rows
from scalelab.recommend.rank import best_per_strategy, rank, reason, score
from scalelab.recommend.recommend import shortlist
from scalelab.recommend.space import (Request, batch_splits, degrees, device_layouts, enumerate_candidates,
                                      tp_degrees, train_overrides)
from scalelab.recommend.verify import overlay

GiB = 2 ** 30
# gpt_small (conf/model/gpt_small.yaml): 4 layers, d_model 256, 4 heads, vocab 256, seq 128, MLP x4,
# at the count scalelab-train builds (3,314,176): the trainer check compares the model's count too.
SMALL = ModelSpec.trainer_gpt(4, 256, 4, 256, 128, 1024)


def cpu(memory=12 * GiB, name="test_cpu"):
    """A CPU profile like this host's probe (plenty of memory for gpt_small), without probing."""
    # kind: cpu (a name without this_cpu is a GPU profile's by default; recommend reads the kind)
    return parse_hardware({"name": name, "kind": "cpu", "peak_flops": {"fp32": 1e11, "bf16": 2e11, "fp16": 3e9},
                           "memory_bytes": memory, "memory_bandwidth_bytes_per_s": 3.5e10,
                           "intra_node": {"bandwidth_bytes_per_s": 1.3e9, "latency_s": 1e-4},
                           "devices_per_node": 2, "runtime_memory_bytes": 3.5e8, "step_overhead_s": 0.003})


def gpu(memory, name="test_gpu"):
    return parse_hardware({"name": name, "peak_flops": {"fp32": 2e13, "bf16": 3e14, "fp16": 3e14},
                           "memory_bytes": memory, "memory_bandwidth_bytes_per_s": 2e12,
                           "intra_node": {"bandwidth_bytes_per_s": 2.3e11, "latency_s": 1e-6},
                           "inter_node": {"bandwidth_bytes_per_s": 2e10, "latency_s": 5e-6},
                           "runtime_memory_bytes": 0, "comm_overlap": 0.9, "cost_per_device_hour": 2.0})


def small_request(**kw) -> Request:
    base = dict(model=SMALL, model_name="gpt_small", hardware=cpu(), hardware_name="this_cpu", devices=2,
                global_batches=(16,), precisions=("32",), checkpointing=("none",))
    return Request(**{**base, **kw})


# ---------------------------------------------------------------------------- enumeration
def test_degrees_and_splits_by_hand():
    # TP degrees must divide heads 4, width 256, MLP 1024 and vocab 256, inside a node of 2: only 2.
    assert tp_degrees(SMALL, 2) == [2]
    # GPT-2-like: 12 heads, vocab 50304: 8 does not divide 12 heads -> 2, 4.
    assert tp_degrees(ModelSpec.from_shape(12, 768, 12, 50304, 1024), 8) == [2, 4]
    # an odd vocabulary (GPT-2's 50257) rules out every TP degree
    assert tp_degrees(ModelSpec.from_shape(12, 768, 12, 50257, 1024), 8) == []
    assert degrees("ddp", SMALL, 2, 2) == [(1, 1)]
    assert degrees("tp", SMALL, 2, 2) == [(2, 1)]
    assert degrees("fsdp_tp", SMALL, 2, 2) == []           # tp 2 on 2 ranks leaves dp 1: nothing to shard over
    assert degrees("pipeline", SMALL, 2, 2) == [(1, 2)]
    assert degrees("nd", SMALL, 2, 2) == [(1, 2), (2, 1)]    # not (1, 1): that is fsdp; (2, 2) needs 4 ranks
    # 8 per replica: micro x accumulation 8x1, 4x2, 2x4, 1x8; a 2-stage 1F1B pipeline needs m >= 2
    assert batch_splits("ddp", 8, 1, 64) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert batch_splits("pipeline", 16, 2, 64) == [(8, 2), (4, 4), (2, 8), (1, 16)]
    assert batch_splits("ddp", 8, 1, 4) == [(8, 1), (4, 2), (2, 4)]
    # on one device only single and the offloading strategies are distinct trainings
    from scalelab.recommend.space import skip_reason
    one_gpu = small_request(hardware=gpu(80 * GiB), hardware_name="test_gpu")
    assert skip_reason("single", one_gpu, 1) is None and skip_reason("zero3_offload", one_gpu, 1) is None
    assert skip_reason("ddp", one_gpu, 1) and skip_reason("zero3", one_gpu, 1) and skip_reason("single", one_gpu, 2)
    assert skip_reason("zero3_offload", small_request(), 2)         # a CPU profile: no offload
    # the cost objective also tries fewer devices: fewer whole nodes, then divisors on one node
    req = small_request(devices=8, nodes=2, smaller_worlds=True)
    assert device_layouts(req) == [(8, 2), (8, 1), (4, 1), (2, 1), (1, 1)]


def test_gpt_small_on_two_cpu_ranks_enumerates_42_layouts():
    cands, pruned = enumerate_candidates(small_request())
    per = {}
    for c in cands:
        per[c.strategy] = per.get(c.strategy, 0) + 1
    # dp 2: 8 per rank -> 4 splits each for ddp, fsdp, fsdp_grad_op, zero1-3 (24); tp 2 (dp 1): 16 ->
    # 5 splits; pipeline pp 2: m in 2, 4, 8, 16 (4); nd: tp2 x pp1 (5) + tp1 x pp2 (4) = 9. Total 42.
    assert per == {"ddp": 4, "fsdp": 4, "fsdp_grad_op": 4, "zero1": 4, "zero2": 4, "zero3": 4, "tp": 5,
                   "pipeline": 4, "nd": 9}
    assert len(cands) == 42
    # single at 2 ranks (replicas), offload on a CPU, fsdp_tp (dp 1): each named once, not searched
    assert sum(pruned.values()) == 4 and all(k.split(":")[0] in ("single", "zero2_offload", "zero3_offload", "fsdp_tp")
                                             for k in pruned)
    # three checkpointing modes triple it
    assert len(enumerate_candidates(small_request(checkpointing=("none", "selective", "full")))[0]) == 126


def test_a_model_that_fits_only_with_sharded_parameters():
    """7.5B parameters (ZeRO paper Fig. 1's model) on 8 devices of 22 GiB (23.6 GB), bf16 Adam, micro 1,
    full recomputation, a short sequence so that activations are small (< 1 GB):
    - ddp: fp32 weights + grads + Adam m, v = 16 B/param = 120 GB                  -> pruned
    - zero1: 2 B bf16 params + 2 B grads (partitioned at best: 2/8) + 12 B/8 states >= 3.5 B/param = 26 GB -> pruned
    - zero2: 2 B params + (2 + 12) B / 8 = 3.75 B/param = 28 GB                    -> pruned
    - zero3: (2 + 2 + 12) B / 8 = 2 B/param = 15 GB (+ gathered-layer buffers)     -> fits
    - tp 8: 16 B/param / 8 = 2 B/param = 15 GB                                     -> fits"""
    model = ModelSpec.from_shape(36, 4096, 32, 51200, 128, n_params=7_500_000_000)
    req = Request(model, None, gpu(22 * GiB), "test_gpu", 8, 1, (8,), ("bf16-mixed",), "adam",
                  checkpointing=("full",))
    cands, pruned = enumerate_candidates(req)
    fitting = {c.strategy for c in cands}
    assert not fitting & {"ddp", "zero1", "zero2"}
    assert {"zero3", "tp"} <= fitting
    assert pruned["does not fit device memory"] >= 3
    for c in cands:
        assert c.memory_bytes <= 22 * GiB
    # with 10 % headroom (19.8 GiB) ZeRO-3 and TP at 15 GB + activations still fit
    tight = enumerate_candidates(Request(**{**req.__dict__, "headroom": 0.1}))[0]
    assert {"zero3", "tp"} <= {c.strategy for c in tight}


# ---------------------------------------------------------------------------- ranking
def test_scores_and_reason_by_hand():
    cands, _ = enumerate_candidates(small_request())
    c = next(c for c in cands if c.strategy == "ddp" and c.micro_batches == 1)
    c.times = {"step_s": 0.5, "compute_s": 0.1, "comm_exposed_s": 0.3, "comm_total_s": 0.3, "bubble_s": 0.0,
               "optimizer_s": 0.05, "overhead_s": 0.05}
    hw = gpu(80 * GiB)
    # 16 sequences x 128 tokens per 0.5 s step = 4096 tokens/s
    assert score(c, "throughput", hw, None) == pytest.approx(4096)
    assert score(c, "time-to-tokens", hw, 4096 * 60) == pytest.approx(60)
    # 2 devices x 2.0 per device-hour / 3600 s / 4096 tokens/s, per token
    assert score(c, "cost", hw, None) == pytest.approx(2 * 2.0 / 3600 / 4096)
    why = reason(c, hw)
    assert why["bound"] == "communication" and why["shares"]["communication"] == pytest.approx(0.6)


def test_reason_prints_the_interleaved_bubble_the_planner_uses():
    """nd at pp 2 with 2 virtual stages per rank and 4 micro-batches: the bubble is
    (p-1)/(v m) = 1/8 = 0.125 (step_time.build_terms), not (p-1)/m = 0.25."""
    from dataclasses import replace as _replace

    from scalelab.plan.step_time import build_terms
    from scalelab.plan.strategies import get_strategy
    from scalelab.recommend.space import Candidate

    st = get_strategy("nd", {"pp": 2, "tp": 1, "schedule": "interleaved_1f1b", "stages_per_rank": 2})
    terms = build_terms(SMALL, st, devices=2, pp=2, micro_batch=1, global_batch=4)
    assert (terms.layout.pp, terms.layout.stages_per_rank, terms.layout.micro_batches) == (2, 2, 4)
    times = {"step_s": 0.5, "compute_s": 0.3, "comm_exposed_s": 0.05, "comm_total_s": 0.05, "bubble_s": 0.05,
             "optimizer_s": 0.05, "overhead_s": 0.05}
    c = Candidate("nd", 2, 1, 1, 2, 1, 1, 4, 4, "none", "32", terms, times)
    assert "bubble (p-1)/(v m) = 0.12" in reason(c, gpu(80 * GiB))["text"]
    plain = _replace(c, terms=build_terms(SMALL, get_strategy("nd", {"pp": 2, "tp": 1}), devices=2, pp=2,
                                          micro_batch=1, global_batch=4))
    assert "bubble (p-1)/m = 0.25" in reason(plain, gpu(80 * GiB))["text"]


def test_rank_orders_by_objective_and_breaks_ties_to_fewer_micro_batches():
    req = small_request()
    cands, _ = enumerate_candidates(req)
    ranked = rank(cands, "throughput", req.hardware)
    tps = [score(c, "throughput", req.hardware, None) for c in ranked]
    assert tps == sorted(tps, reverse=True)
    firsts = best_per_strategy(ranked)
    assert len(firsts) == 9 and len({c.strategy for c in firsts}) == 9
    for c in ranked[:-1]:
        nxt = ranked[ranked.index(c) + 1]
        if math.isclose(tps[ranked.index(c)], tps[ranked.index(nxt)], rel_tol=1e-9):
            assert c.micro_batches <= nxt.micro_batches


# ---------------------------------------------------------------------------- trainer vocabulary
@pytest.fixture()
def hydra_ctx():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def test_every_candidate_is_a_valid_scalelab_train_command(hydra_ctx):
    """Each candidate's overrides compose through the real config and pass the trainer's schema
    and cross-key validation, and the trainer derives the candidate's own batch split and degrees."""
    req = small_request(checkpointing=("none", "full"))
    cands, _ = enumerate_candidates(req)
    # every layout and micro-batch split without checkpointing; with it, each layout once (the
    # split does not touch the checkpointing override; a compose is ~0.5 s, 84 took 50-77 s)
    seen = set()
    for c in cands:
        layout = (c.strategy, c.dp, c.tp, c.pp)
        if c.checkpointing == "full":
            if layout in seen:
                continue
            seen.add(layout)
        ov = train_overrides(c, req)
        spec = validate(compose("train", overrides=ov))
        assert spec.run.world_size == 2 and spec.batch.global_batch_size == 16
        assert spec.plan.parallel_degrees(2) == {"dp": c.dp, "tp": c.tp, "pp": c.pp}, ov
        if c.pp == 1 and c.strategy != "nd":
            # accumulation strategies: micro x accumulation as enumerated (16 / dp = micro x m)
            assert (spec.batch.per_device_batch_size, spec.batch.accumulate_grad_batches) == (c.micro_batch,
                                                                                               c.micro_batches)
        assert ("model.arch.activation_checkpointing=full" in ov) == (c.checkpointing == "full")


def test_shortlist_keeps_the_best_layout_of_each_strategy_the_trainer_accepts():
    req = small_request()
    shown, rejected = shortlist(rank(enumerate_candidates(req)[0], "throughput", req.hardware), req, 3)
    assert len(shown) == 3 and len({c.strategy for c, _ in shown}) == 3 and rejected == []
    assert all(ov[0].startswith("strategy=") and "trainer.devices=2" in ov for _, ov in shown)


def test_overlay_is_the_overrides_as_a_global_config():
    text = overlay(["strategy=zero2", "model=gpt_small", "trainer.devices=2", "data.micro_batch_size=4",
                    "trainer.precision=32-true", "hardware_profile=this_cpu"])
    assert text.startswith("# @package _global_\n")
    assert "- override /strategy: zero2" in text and "- override /model: gpt_small" in text
    assert "trainer:\n  devices: 2\n  precision: 32-true" in text and "micro_batch_size: 4" in text
    assert "hardware_profile: this_cpu" in text


# ---------------------------------------------------------------------------- LR
def test_lr_advice_by_hand():
    a = lr_mod.advice("adam", 3e-3, 16, 64)       # B / B0 = 4: sqrt -> x2, linear -> x4
    assert a["rule"] == "sqrt" and a["lr"] == pytest.approx(6e-3) and a["warmup_steps"] == 0.1
    assert a["by_rule"] == pytest.approx({"none": 3e-3, "sqrt": 6e-3, "linear": 1.2e-2})
    assert "lr_scaling=sqrt" in a["overrides"] and "lr_scaling.base_batch_size=16" in a["overrides"]
    s = lr_mod.advice("sgd", 0.1, 256, 1024)
    assert s["rule"] == "linear" and s["lr"] == pytest.approx(0.4)
    same = lr_mod.advice("adam", 3e-3, 16, 16)
    assert same["rule"] == "none" and same["lr"] == 3e-3 and same["warmup_steps"] == 0
    # the check varies the rule when they differ (every rule with the advised one's schedule: 10 %
    # warm-up, cosine to 0.1x, conf/lr_scaling/sqrt.yaml; none alone was constant), the base LR
    # (x 1/2, 1, 2) when they coincide
    assert lr_mod.check_grid(a) == ("lr_scaling", ["lr_scaling=none,sqrt,linear", "optim.lr=0.003",
                                                   "lr_scaling.base_batch_size=16", "lr_scaling.warmup_steps=0.1",
                                                   "lr_scaling.decay=cosine", "lr_scaling.min_lr_ratio=0.1"])
    assert lr_mod.check_grid(same) == ("optim.lr", ["lr_scaling=none", "optim.lr=0.0015,0.003,0.006"])


def test_lr_formula_matches_the_trainers():
    from scalelab.scaling.lr import scaled_lr

    for rule in ("none", "linear", "sqrt"):
        assert lr_mod.scaled_lr(3e-3, 16, 48, rule) == pytest.approx(scaled_lr(3e-3, 16, 48, rule))


# ---------------------------------------------------------------------------- published configurations
def test_megatron_published_throughput_by_hand():
    # 1.7B: 96 B s l h^2 (1 + s / 6h + V / 16 l h) FLOPs per step (with recompute) at 137 TFLOP/s x 32 GPUs
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    step = flops / (32 * 137e12)
    pub = megatron_published(MEGATRON[0])
    assert pub["step_s"] == pytest.approx(step) and pub["tokens_per_s"] == pytest.approx(B * s / step)
    assert (pub["tp"], pub["pp"], pub["dp"]) == (1, 1, 32)


def test_published_configurations_get_a_layout_that_fits():
    rows = megatron_rows(["1.7B", "1T"])
    assert [r["published"]["model"] for r in rows] == ["1.7B", "1T"]
    for r in rows:
        rec = r["recommended"]
        assert rec is not None and rec["fits"] and rec["total_bytes"] <= 0.9 * 80 * GiB
        assert rec["tokens_per_s"] > 0 and r["planner_on_published"]["tokens_per_s"] > 0
    # 1T parameters cannot be replicated: at least 16 B/param / 80 GiB -> sharded or model parallel
    assert rows[1]["recommended"]["strategy"] not in ("ddp", "zero1", "zero2")


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv,named", [
    (["--objective", "fastest"], "'fastest'"),
    (["--verify", "-1"], "--verify"),
    (["--global-batch", "0"], "--global-batch"),
    (["--global-batch", "16,x"], "'x'"),
    (["--model", "gpt_huge"], "'gpt_huge'"),
    (["--hardware", "tpu_v9"], "'tpu_v9'"),
    (["--precision", "fp8"], "'fp8'"),
    (["--strategies", "ddp,magic"], "'magic'"),
    (["--objective", "time-to-tokens"], "--tokens"),
    (["--budget-minutes", "10"], "--tokens"),
    (["--lr-check", "optuna"], "'optuna'"),
    (["--memory-headroom", "1.5"], "--memory-headroom"),
    (["--verify", "1", "--nodes", "2"], "--slurm"),
    (["--published", "gpt3"], "'gpt3'"),
    # tp 2 divides gpt_small (the plan accepts fsdp_tp at dp 1): what rules it out is dp 2 / 2 = 1
    (["--strategies", "fsdp_tp"], "leaves dp 1 on 1x2 devices"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, named):
    base = ["recommend", "--model", "gpt_small", "--devices", "2", "--hardware", "this_cpu"]
    args = build_parser().parse_args(base + argv)
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and named in err, err


# ---------------------------------------------------------------------------- verification read-back
def _rec(tps: float, num: int, cand: int) -> dict:
    return {"status": "completed", "throughput": {"tokens_per_s": tps}, "step_time_s": {"median": 2048 / tps},
            "loss": {"final": 3.0}, "memory": {"peak_rss_bytes_per_rank": [100, 200]},
            "job": {"num": num, "overrides": [f"+recommend_candidate=c{cand}"], "dir": f"/x/{num}"}}


def test_measured_ranking_takes_the_median_of_repeats_and_flags_noise():
    from scalelab.recommend.recommend import measured_ranking

    req = small_request()
    cands = best_per_strategy(rank(enumerate_candidates(req)[0], "throughput", req.hardware))[:3]
    recs = {0: [_rec(1000, 0, 0), _rec(1200, 3, 0), _rec(1100, 6, 0)], 1: [_rec(1150, 1, 1), _rec(1130, 4, 1)],
            2: [{"status": "failed", "error": "rank 1 failed first", "job": {"num": 2}}]}
    rows, best, note = measured_ranking(cands, recs, "throughput", req, None)
    # medians: c0 1100, c1 1140 -> c1 first; c2 failed, last, unmeasured
    assert best == 1 and [r["planner_rank"] for r in rows] == [2, 1, 3]
    assert rows[0]["measured_tokens_per_s"] == 1140 and rows[1]["measured_tokens_per_s"] == 1100
    assert rows[2]["status"] == "failed" and "measured_score" not in rows[2] and rows[2]["error"]
    assert rows[0]["measured_peak_bytes"] == 200
    # c1 leads by 1140 / 1100 - 1 = 3.6 %, less than c0's own spread 1200 / 1000 - 1 = 20 %
    assert note and "3.6%" in note and "20%" in note


def test_lr_check_compares_the_tail_of_the_loss_curve():
    from scalelab.recommend.verify import tail_mean

    assert tail_mean([[1, 4.0], [2, 3.0], [3, 2.0], [4, 1.0]]) == 1.0              # last quarter: 1 step
    assert tail_mean([[s, float(10 - s)] for s in range(1, 9)]) == pytest.approx(2.5)   # last 2 of 8: 3, 2
    assert tail_mean([]) is None


def test_a_bad_train_arg_stops_before_any_process(capsys, tmp_path, monkeypatch):
    import subprocess

    def no_process(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "run", no_process)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    argv = ["recommend", "--model", "gpt_nano", "--devices", "2", "--hardware", "this_cpu", "--verify", "1",
            "--activation-checkpointing", "none", "--train-arg", "data.num_workers=many", f"--out={tmp_path}"]
    args = build_parser().parse_args(argv)
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    # refused up front, before the search (it was refused after ~5 s of search and a printed table)
    assert err.startswith("error: --train-arg is not valid") and "num_workers" in err and "\n" not in err


def test_nothing_fits_is_exit_1_with_what_was_pruned(capsys, tmp_path):
    # 1e12 parameters x 16 B (fp32 weights, grads, Adam) on 2 x 80 GB: nothing replicated fits
    args = build_parser().parse_args(["recommend", "--params", "1T", "--devices", "2", "--hardware", "h100_sxm",
                                      "--strategies", "ddp,zero1", f"--out={tmp_path}"])
    assert args.func(args) == 1
    err = capsys.readouterr().err.strip()
    # zero1 shards the optimizer states ddp replicates: the closest; the prune tally is in the json
    assert err.startswith("error: no layout fits device memory: the closest is zero1, whose smallest layout needs ")
    assert err.endswith("(recommendation.json: search.pruned)") and "\n" not in err
    pruned = json.loads((tmp_path / "recommendation.json").read_text())["search"]["pruned"]
    assert any(k.startswith("does not fit device memory") for k in pruned)
    assert "No layout fits" in (tmp_path / "recommendation.md").read_text()


def test_lr_check_disagreement_names_the_direction():
    # the walkthrough's case: 0.0015 won over the advised 0.003, and the line said "favours large LRs"
    from scalelab.recommend.recommend import _why_not_advice

    adv = {"base_lr": 0.003}
    lower = _why_not_advice({"varied": "optim.lr", "best": 0.0015, "steps": 30}, adv)
    higher = _why_not_advice({"varied": "optim.lr", "best": 0.006, "steps": 30}, adv)
    assert lower.startswith("lower than advised") and "large" not in lower
    assert "favours large LRs" in higher and "--lr-steps" in higher
    assert "rules" in _why_not_advice({"varied": "lr_scaling", "best": "sqrt", "steps": 30}, adv)
    assert _why_not_advice({"varied": "optim.lr", "best": None, "steps": 30}, adv).startswith("no LR-check run")


# ---------------------------------------------------------------------------- recommendation.html
def _html_doc(out) -> dict:
    """A recommendation.json with one verified candidate and a 3-LR check (the walkthrough's figures);
    a command and an error with characters HTML and markdown tables must escape."""
    row = {"planner_rank": 1, "strategy": "fsdp_grad_op", "split": "8 x 1", "predicted_step_s": 0.3,
           "measured_step_s": 0.33, "step_ratio": 0.91, "step_ratio_at_host_speed": 0.95, "measured_score": 6173.0,
           "loss_final": 3.1, "status": "completed"}
    bad = {"planner_rank": 2, "strategy": "zero3", "split": "8 x 1", "predicted_step_s": 0.31,
           "status": "failed", "error": "RuntimeError: a | b <oom>"}
    return {"request": {"model": {"name": "gpt_nano"}, "nodes": 1, "devices": 2, "hardware": "this_cpu",
                        "global_batches": [16]}, "objective": "throughput",
            "search": {"fitting": 2, "built": 3, "pruned_total": 1, "pruned": {"too big": 1}},
            "winner": {"source": "measured best of the verified", "reason": "compute-bound",
                       "command": "scalelab-train strategy=fsdp_grad_op +tag='<b>&x'"},
            "ranking": [], "rejected_by_trainer": [],
            "verification": {"argv": ["-m"], "steps": 20, "wall_s": 30.0, "sweep_dir": str(out / "verify"),
                             "ranking": [row, bad], "measured_best": "fsdp_grad_op 8 x 1", "measured_best_index": 0},
            "lr": {"advice": {"rule": "none", "lr": 0.003, "base_lr": 0.003, "base_batch": 16, "warmup_steps": 2,
                              "why": "base batch", "global_batch": 16, "by_rule": {"none": 0.003}},
                   "check": {"argv": ["-m"], "wall_s": 40.0, "varied": "optim.lr", "best": 0.003,
                             "report": "r.html", "sweep_dir": str(out / "lr_check"), "runs": []}}}


def test_recommendation_html_charts_the_verified_figure_and_renders_its_summary(tmp_path):
    """Walkthrough: the chart showed 5,507 tokens/s for the winner, the median of its verification run
    (6,173, as in the table) and the three LR-check runs; the summary was raw markdown text."""
    from scalelab.recommend.report import write_all

    from .test_report import _rec as run_record

    out = tmp_path / "rec"
    records = []
    for sweep, tokens in (("verify", [6173.0]), ("lr_check", [5013.0, 6002.0, 4852.0])):
        for i, tok in enumerate(tokens):
            records.append(run_record(i, "fsdp_grad_op", 2, 16, tok / 64, lr=0.0015 * 2 ** i,
                                      job={"name": f"{sweep}/{i}", "sweep_dir": str((out / sweep).resolve())}))
    page = write_all(_html_doc(out), out, records, [])["html"].read_text()
    start = page.index("const FIGS=") + len("const FIGS=")
    thr = {d["name"]: d["y"] for d in json.JSONDecoder().raw_decode(page, start)[0]["throughput"]["data"]}
    assert thr == {"LR check: fsdp_grad_op b16": [5013.0], "verification: fsdp_grad_op b16": [6173.0]}
    summary = page[page.index('<section class="summary">'):page.index("</section>")]
    assert "<h3>Planner ranking (best layout of each strategy)</h3>" in summary and "<table>" in summary
    assert "<b>Run this</b>" in summary and "<b>fsdp_grad_op 8 x 1</b>" in summary
    assert "<code>scalelab-train strategy=fsdp_grad_op +tag=&#x27;&lt;b&gt;&amp;x&#x27;</code>" in summary
    assert "<td>failed: RuntimeError: a | b &lt;oom&gt;</td>" in summary
    for raw in ("| # |", "|---", "**", "## ", "`"):
        assert raw not in summary, raw


def test_markdown_html_constructs():
    from scalelab.recommend.report import markdown_html

    md = "# T <1>\n\npara **b** and `a**b**<c>`\nsame para\n\n- one `x`\n- two\n\n| h \\| 1 | h2 |\n|---|---|\n| a | b |"
    assert markdown_html(md).splitlines() == [
        "<h2>T &lt;1&gt;</h2>", "<p>para <b>b</b> and <code>a**b**&lt;c&gt;</code> same para</p>",
        "<ul><li>one <code>x</code></li><li>two</li></ul>",
        '<div class="scroll"><table><thead><tr><th>h | 1</th><th>h2</th></tr></thead>'
        "<tbody><tr><td>a</td><td>b</td></tr></tbody></table></div>"]
