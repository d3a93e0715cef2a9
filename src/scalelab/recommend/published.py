"""Published large-scale configurations the recommender is checked against.

Megatron-LM: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters on DGX A100
(80 GB) nodes of 8 GPUs, sequence 2048, vocabulary 51,200, with activation recomputation; the
achieved TFLOP/s per GPU count the recomputation's FLOPs (their Eq. 3, plan.flops.megatron_flops
with recompute=True), so a published step time is those FLOPs / (GPUs x TFLOP/s).

ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv:1910.02054), Figure 1: a 7.5B model on 64 GPUs, model states per GPU 120 GB (plain
data parallelism), 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p), mixed-precision Adam
(K = 12). The paper gives memory, not a throughput, for this configuration; it is planned here
on the A100 profile with a global batch of one sequence per GPU.
"""
from __future__ import annotations

import json

from scalelab.plan.flops import megatron_flops
from scalelab.plan.hardware import load_hardware
from scalelab.plan.report import fmt_bytes
from scalelab.plan.spec import ModelSpec, PlanError
from scalelab.plan.peak_memory import HEADROOM, device_total_bytes, fits   # HEADROOM: recommend's default
from scalelab.plan.step_time import build_terms, step_time

from .rank import PLANNER_MARGIN, best_per_strategy, break_ties, rank, tokens_per_s
from .space import Candidate, Request

HARDWARE = "a100_80g_nvlink"
SEQ, VOCAB = 2048, 51200

# (name, heads, hidden, layers, tp, pp, GPUs, global batch, achieved TFLOP/s per GPU): Table 1.
MEGATRON = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# ZeRO Figure 1: Psi = 7.5e9 on N_d = 64; published model-state bytes per GPU by ZeRO stage.
ZERO_FIG1 = {"psi": 7.5e9, "gpus": 64, "states": {"ddp": 120e9, "zero1": 31.4e9, "zero2": 16.6e9, "zero3": 1.9e9}}


def megatron_published(row) -> dict:
    name, heads, h, L, tp, pp, gpus, B, tflops = row
    flops = megatron_flops(B, SEQ, L, h, VOCAB, recompute=True)
    step = flops / (gpus * tflops * 1e12)
    return {"model": name, "gpus": gpus, "global_batch": B, "tp": tp, "pp": pp, "dp": gpus // (tp * pp),
            "tflops_per_gpu": tflops, "step_s": step, "tokens_per_s": B * SEQ / step}


def _request(model: ModelSpec, gpus: int, batch: int, hw) -> Request:
    return Request(model, None, hw, hw.name, min(8, gpus), max(1, gpus // 8), (batch,), ("bf16-mixed",), "adam",
                   headroom=HEADROOM)


def _best(req: Request) -> Candidate | None:
    """What `scalelab recommend` recommends for this job without --verify: of each strategy's best
    layout that the trainer's own validation accepts (recommend.shortlist), the first after the
    planner's tie rule (rank.break_ties: the simplest within its margin). The planner's first alone
    put zero3 in this column for the 1.7B row, where recommend on the same job answers ddp."""
    from .recommend import shortlist
    from .space import enumerate_candidates

    cands, _ = enumerate_candidates(req)
    ranked = rank(cands, "throughput", req.hardware)
    # the layout the trainer accepts, for the published model's own count (Megatron's tied embeddings,
    # not scalelab-train's GPT): no command is printed here, so the model's count is not compared
    first, _ = shortlist(ranked, req, 1, same_model=False)
    if not first:
        return None
    # only the strategies predicted within the tie margin of it can win (a trainer check each: ~0.1 s)
    floor = tokens_per_s(first[0][0]) * (1 - PLANNER_MARGIN)
    near = [c for c in ranked if tokens_per_s(c) >= floor]
    shown, _ = shortlist(near, req, len(best_per_strategy(near)), same_model=False)
    order, _ = break_ties([c for c, _ in shown], "throughput", req.hardware)
    return order[0]


def _published_layout(model: ModelSpec, pub: dict, hw) -> dict | None:
    """The planner on the published degrees (Megatron: TP + DP, or TP + PP + DP; here `tp` for pp = 1,
    else `nd`, whose data parallelism is FSDP rather than Megatron's replicated DP), with full
    recomputation as published and the fastest micro-batch split that fits."""
    name = "tp" if pub["pp"] == 1 and pub["tp"] > 1 else ("ddp" if pub["pp"] == 1 else "nd")
    per_replica = pub["global_batch"] // pub["dp"]
    best = None
    for m in range(1, per_replica + 1):
        if per_replica % m or (pub["pp"] > 1 and m < pub["pp"]):
            continue
        try:
            t = build_terms(model, name, devices=8, nodes=pub["gpus"] // 8, tp=pub["tp"], pp=pub["pp"],
                            micro_batch=per_replica // m, global_batch=pub["global_batch"], precision="bf16-mixed",
                            activation_checkpointing="full")
        except PlanError:
            continue
        step = step_time(t, hw)["step_s"]
        if best is None or step < best["step_s"]:
            best = {"strategy": name, "micro_batch": per_replica // m, "micro_batches": m, "step_s": step,
                    "tokens_per_s": pub["global_batch"] * SEQ / step, "fits": fits(t, hw),
                    "total_bytes": device_total_bytes(t, hw)}
    return best


def megatron_rows(which: list[str] | None = None) -> list[dict]:
    hw = load_hardware(HARDWARE)
    rows = []
    for row in MEGATRON:
        if which and row[0] not in which:
            continue
        pub = megatron_published(row)
        model = ModelSpec.from_shape(row[3], row[2], row[1], VOCAB, SEQ)
        rec = _best(_request(model, pub["gpus"], pub["global_batch"], hw))
        rows.append({"published": pub, "planner_on_published": _published_layout(model, pub, hw),
                     "recommended": _cand(rec, hw)})
    return rows


def zero_rows() -> list[dict]:
    hw = load_hardware(HARDWARE)
    f = ZERO_FIG1
    # A 7.5B GPT: the 7.5B row of Megatron's Table 1 (36 layers, hidden 4096); Psi as published.
    model = ModelSpec.from_shape(36, 4096, 32, VOCAB, SEQ, n_params=int(f["psi"]))
    req = _request(model, f["gpus"], f["gpus"], hw)
    from .space import enumerate_candidates

    cands, _ = enumerate_candidates(req)
    ranked = rank(cands, "throughput", hw)
    fitting = {c.strategy for c in best_per_strategy(ranked)}
    best = _best(req)
    rows = []
    for s, published in f["states"].items():
        t = build_terms(model, s, devices=8, nodes=f["gpus"] // 8, micro_batch=1, global_batch=f["gpus"],
                        precision="bf16-mixed")
        rows.append({"published": {"model": "7.5B (ZeRO Fig. 1)", "gpus": f["gpus"], "strategy": s,
                                   "model_states_bytes": published},
                     "planner_model_states_bytes": t.states.total_bytes, "fits": s in fitting,
                     "recommended": _cand(best, hw)})
    return rows


def _cand(c: Candidate | None, hw) -> dict | None:
    if c is None:
        return None
    return {"strategy": c.strategy, "tp": c.tp, "pp": c.pp, "dp": c.dp, "micro_batch": c.micro_batch,
            "micro_batches": c.micro_batches, "activation_checkpointing": c.checkpointing,
            "total_bytes": c.memory_bytes, "fits": c.memory_bytes <= hw.memory_bytes,
            "step_s": c.times["step_s"], "tokens_per_s": tokens_per_s(c),
            "model_states_bytes": c.terms.states.total_bytes}


def run_published(which: str, as_json: bool) -> int:
    if which not in ("megatron", "zero", "all"):
        raise PlanError(f"--published {which!r} is not valid; valid: megatron, zero, all")
    doc = {}
    if which in ("megatron", "all"):
        doc["megatron"] = megatron_rows()
    if which in ("zero", "all"):
        doc["zero"] = zero_rows()
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    from .report import text_table

    if "megatron" in doc:
        print(f"Megatron-LM (Narayanan et al. 2021, Table 1) on {HARDWARE}, bf16, seq {SEQ}, vocab {VOCAB}; "
              f"{HEADROOM:.0%} of memory kept free; published tok/s from the paper's TFLOP/s per GPU (with recompute):")
        head = ["model", "GPUs", "batch", "published tp/pp/dp", "published tok/s", "planner on published",
                "recommended", "memory/GPU", "fits", "recommended tok/s", "rec / published"]
        rows = []
        for r in doc["megatron"]:
            p, q, c = r["published"], r["planner_on_published"], r["recommended"]
            on_pub = f"{q['tokens_per_s']:,.0f} ({q['tokens_per_s'] / p['tokens_per_s']:.2f}x)" if q else "-"
            rows.append([p["model"], str(p["gpus"]), str(p["global_batch"]), f"{p['tp']}/{p['pp']}/{p['dp']}",
                         f"{p['tokens_per_s']:,.0f}", on_pub, _layout(c), fmt_bytes(c["total_bytes"]) if c else "-",
                         "yes" if c and c["fits"] else "NO", f"{c['tokens_per_s']:,.0f}" if c else "-",
                         f"{c['tokens_per_s'] / p['tokens_per_s']:.2f}" if c else "-"])
        print(text_table(head, rows))
    if "zero" in doc:
        print(f"\nZeRO (Rajbhandari et al. 2020, Fig. 1): 7.5B on 64 GPUs ({HARDWARE}, batch 64, bf16):")
        head = ["strategy", "published states/GPU", "planner states/GPU", "a layout fits (micro 1, any ckpt)"]
        rows = [[r["published"]["strategy"], f"{r['published']['model_states_bytes'] / 1e9:.1f} GB",
                 f"{r['planner_model_states_bytes'] / 1e9:.1f} GB", "yes" if r["fits"] else "NO"]
                for r in doc["zero"]]
        print(text_table(head, rows))
        c = doc["zero"][0]["recommended"]
        print(f"recommended: {_layout(c)}, {fmt_bytes(c['total_bytes'])}/GPU, {c['tokens_per_s']:,.0f} tokens/s "
              "predicted (the paper gives memory only for this configuration)")
        print("planner vs paper: ZeRO-1 as DeepSpeed runs it partitions the gradients too when nothing accumulates "
              "(plan/model_states.py), hence ZeRO-2's figure")
    return 0


def _layout(c: dict | None) -> str:
    if not c:
        return "none fits"
    return (f"{c['strategy']} tp{c['tp']} pp{c['pp']} dp{c['dp']} micro {c['micro_batch']}x{c['micro_batches']} "
            f"ckpt {c['activation_checkpointing']}")
