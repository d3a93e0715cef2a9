"""bf16-true in the planner: the module itself in bf16 (Lightning's bf16-true precision casts it),
so its gradients and the optimizer's states are bf16 too: 2 + 2 + 4 bytes per parameter with Adam,
2 + 2 + 2 with SGD's momentum, no fp32 master copy and no autocast weight copies; what DDP and
FSDP2 send is bf16. The states are measured here on the real objects (scalelab's GPT in bf16, one
torch optimizer step), counted as the worker counts them (strategies/base.py state_bytes and
grad_bytes); the activations and the step's peak are checked against the CPU allocator in
test_plan_allocator_peak.py. Before, the planner refused bf16-true."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scalelab.models.gpt import GPT, GPTConfig
from scalelab.plan import ModelSpec, build_terms
from scalelab.plan.comm import collectives


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_the_states_of_a_bf16_model_after_a_step(optimizer):
    cfg = GPTConfig(n_layers=2, d_model=64, n_heads=4, seq_len=32, vocab_size=256)
    torch.manual_seed(0)
    net = GPT(cfg).to(torch.bfloat16)
    opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if optimizer == "adam"
           else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    tokens = torch.randint(0, 256, (2, 33))
    logits = net(tokens[:, :-1])                                   # as LitModule.loss
    F.cross_entropy(logits.float().reshape(-1, 256), tokens[:, 1:].reshape(-1)).backward()
    grads = _bytes(p.grad for p in net.parameters())
    opt.step()
    params = _bytes(net.parameters())
    states = _bytes(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    n = sum(p.numel() for p in net.parameters())
    # by hand: 2 bytes a parameter, 2 a gradient, 2 a moment (Adam's m and v; SGD's momentum)
    assert (params, grads, states) == (2 * n, 2 * n, (4 if optimizer == "adam" else 2) * n)
    spec = ModelSpec(n, 2, 64, 4, 256, 32, 256)                   # the real count: an untied head
    st = build_terms(spec, "single", devices=1, micro_batch=2, global_batch=2, precision="bf16-true",
                     optimizer=optimizer).states
    assert (st.params_bytes, st.grads_bytes, st.optimizer_bytes) == (params, grads, states)
    assert st.buffers_bytes == 0            # no autocast: no 16-bit copies of fp32 weights (bf16-mixed has them)
    assert build_terms(spec, "single", devices=1, micro_batch=2, global_batch=2, precision="bf16-mixed",
                       optimizer=optimizer).states.buffers_bytes > 0


def test_sharded_states_and_what_ddp_and_fsdp_send():
    """1,000,000 parameters over 4 ranks: FSDP2 holds a quarter of 2 + 2 + 4 bytes each; DDP
    all-reduces 2 bytes a gradient (fp32 gradients, 4, under bf16-mixed's autocast); FSDP2 gathers
    and reduce-scatters bf16 (bf16-mixed: gathers bf16, reduces fp32)."""
    spec = ModelSpec.from_shape(4, 128, 4, 1000, 64)
    n = spec.n_params

    def terms(strategy, precision):
        return build_terms(spec, strategy, devices=4, micro_batch=1, global_batch=4, precision=precision,
                           optimizer="adam")

    st = terms("fsdp", "bf16-true").states
    assert (st.params_bytes, st.grads_bytes, st.optimizer_bytes) == pytest.approx((2 * n / 4, 2 * n / 4, 4 * n / 4))

    def sent(strategy, precision, name):
        t = terms(strategy, precision)
        (c,) = [c for c in collectives(t.model, t.strategy, t.layout, precision) if c.name == name]
        return c.bytes_per_call * c.calls

    assert sent("ddp", "bf16-true", "dp_grad_all_reduce") == pytest.approx(2 * n)
    assert sent("ddp", "bf16-mixed", "dp_grad_all_reduce") == pytest.approx(4 * n)
    for name in ("param_all_gather_fwd", "grad_reduce_scatter"):
        assert sent("fsdp", "bf16-true", name) == pytest.approx(2 * n), name
    assert sent("fsdp", "bf16-mixed", "grad_reduce_scatter") == pytest.approx(4 * n)
    # local SGD averages the parameters themselves (bf16: 2 bytes), every 4 steps (its default period);
    # PowerSGD's P and Q are in the buckets' dtype: half the bf16-mixed (fp32 gradient) bytes (review)
    assert sent("local_sgd", "bf16-true", "param_average_all_reduce") == pytest.approx(2 * n / 4)
    assert sent("local_sgd", "bf16-mixed", "param_average_all_reduce") == pytest.approx(4 * n / 4)
    assert sent("ddp_powersgd", "bf16-true", "dp_powersgd_all_reduce") * 2 == pytest.approx(
        sent("ddp_powersgd", "bf16-mixed", "dp_powersgd_all_reduce"))


def test_ddp_buckets_hold_twice_the_bf16_gradients():
    """DDP's buckets are bytes of the gradients' own dtype (bucket_cap_mb 25, the first 1 MiB): n
    parameters are 4n bytes of fp32 gradients under bf16-mixed, 1 + ceil((4n - 1 MiB) / 25 MiB)
    buckets, and 2n bytes of bf16 ones under bf16-true (the planner counted 4n for both)."""
    spec = ModelSpec.from_shape(8, 1024, 8, 50257, 1024)
    n = spec.n_params

    def calls(precision):
        t = build_terms(spec, "ddp", devices=2, micro_batch=1, global_batch=2, precision=precision)
        (c,) = [c for c in collectives(t.model, t.strategy, t.layout, precision) if c.name == "dp_grad_all_reduce"]
        return c.calls

    first, cap = 2**20, 25 * 2**20
    assert calls("bf16-mixed") == 1 + math.ceil((4 * n - first) / cap)
    assert calls("bf16-true") == 1 + math.ceil((2 * n - first) / cap)
    assert calls("bf16-true") < calls("bf16-mixed")


def test_the_plan_command_takes_it_and_its_same_job_runs_it():
    """(test_plan_review_2 checks each strategy's refusal against the trainer's own: DeepSpeed's.)"""
    import subprocess
    import sys

    def plan(*args):
        return subprocess.run([sys.executable, "-m", "scalelab.cli", "plan", *args], capture_output=True, text=True,
                              timeout=120)

    proc = plan("strategy=fsdp", "model=gpt_nano", "trainer.precision=bf16-true", "trainer.devices=2")
    assert proc.returncode == 0 and "bf16-true" in proc.stdout, proc.stderr
    flags = ["--model", "gpt_nano", "--devices", "2", "--precision", "bf16-true"]
    proc = plan(*flags, "--strategy", "ddp")
    assert proc.returncode == 0 and "trainer.precision=bf16-true" in proc.stdout, proc.stderr   # its same job
    proc = plan(*flags, "--strategy", "zero2")
    assert proc.returncode == 2 and proc.stderr == ("error: strategy=zero2: --precision bf16-true is not supported by "
                                                    "DeepSpeed here: use bf16-mixed or 32\n"), proc.stderr


def test_recommend_leaves_out_what_the_trainer_refuses_at_the_precision_asked(tmp_path):
    """--precision bf16-true: the ZeRO strategies are not searched (were 'fits nowhere ... or the
    planner refused each'); with another precision beside it they are, at that one only. (Under
    fp16-mixed on a GPU, FSDP2, TP and the pipelines were ranked and refused only afterwards.)"""
    import subprocess
    import sys

    def rec(precision, *more):
        proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "recommend", "--model", "gpt_nano", "--devices",
                               "2", "--precision", precision, "--out", str(tmp_path / precision), *more],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = rec("bf16-true")
    assert ("not searched: zero1, zero2, zero3: the trainer refuses it: trainer.precision=bf16-true is not supported "
            "by DeepSpeed here") in out, out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert rows and {r[1] for r in rows} == {"ddp", "fsdp_grad_op", "fsdp", "pipeline", "nd", "tp"}, rows
    assert {r[10] for r in rows} == {"bf16-true"}                            # (micro x m is three words)
    both = [line.split() for line in rec("bf16-true,32").splitlines() if line[:1].isdigit()]
    assert {r[10] for r in both if r[1].startswith("zero")} == {"32"}, both


def test_the_mlp_task_feeds_a_bf16_module_bf16():
    """model=mlp at bf16-true (the module itself in bf16) failed in its first matmul: the bytes were
    scaled to an fp32 input ('mat1 and mat2 must have the same dtype'), while plan and recommend
    printed the job as one to run (review)."""
    from scalelab.models.lit import LitModule
    from scalelab.models.mlp import MLPConfig

    lit = LitModule(MLPConfig(), "classify", torch.optim.SGD, 0.1, 10, 0, "constant", 0.1)
    batch = torch.randint(0, 256, (4, MLPConfig().in_features + 1))
    fp32 = lit.loss(batch)
    lit.net.to(torch.bfloat16)                                  # as Lightning's bf16-true precision does
    bf16 = lit.loss(batch)
    assert bf16.dtype == torch.float32 and abs(bf16.item() - fp32.item()) < 0.05 * fp32.item()


def test_the_nearest_layouts_that_fit_are_ones_the_trainer_runs():
    """30B parameters (47 x 7168) on 8 H200s under ddp at bf16-true does not fit; the layouts said to
    fit instead named strategy=zero3, which the trainer refuses at bf16-true (review)."""
    from scalelab.plan.alternatives import nearest_fitting
    from scalelab.plan.hardware import load_hardware

    spec = ModelSpec.trainer_gpt(47, 7168, 56, 50257, 2048)
    hw = load_hardware("h200")
    terms = build_terms(spec, "ddp", devices=8, micro_batch=2, global_batch=16, precision="bf16-true")
    names = {alt["strategy"] for alt in nearest_fitting(terms, hw)}
    assert names and not any(n.startswith("zero") for n in names), names
