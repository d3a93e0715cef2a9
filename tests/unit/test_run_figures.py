"""The run record's figures against values computed by hand: FLOPs per token, MFU, step-time
statistics, the compute/comm/wait breakdown (CPU and CUDA traces), sweep efficiency, device
memory, and the CPU peak MFU divides by. Each expected value is written out, not recomputed by
the code under test."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from scalelab.models.gpt import GPT, GPTConfig, flops_per_token, non_embedding_params
from scalelab.models.mlp import MLPClassifier, MLPConfig, mlp_params
from scalelab.plan import hardware
from scalelab.scaling import mfu as mfu_mod
from scalelab.scaling.breakdown import combine, device_anatomy, gpu_comm
from scalelab.scaling.metrics import StepMetrics, read_peaks
from scalelab.scaling.run_summary import p90, summarize

NANO = GPTConfig(n_layers=2, n_heads=4, d_model=64, seq_len=64, vocab_size=256)
# gpt_nano by hand: per block q,k,v,out 4 x 64^2 = 16,384, MLP 2 x 64 x 256 = 32,768, two
# LayerNorms 4 x 64 = 256 -> 49,408; x 2 blocks + final LN 128 + LM head 256 x 64 = 16,384.
NANO_N = 2 * 49_408 + 128 + 16_384                      # 115,328
NANO_FLOPS_PER_TOKEN = 6 * 115_328 + 12 * 2 * 64 * 64     # 691,968 + 98,304 = 790,272


def test_gpt_flops_per_token_by_hand():
    assert non_embedding_params(NANO) == NANO_N == 115_328
    assert flops_per_token(NANO) == NANO_FLOPS_PER_TOKEN == 790_272
    # gpt_small (4 x 256, 4 heads, context 128): per block 4 x 65,536 + 2 x 262,144 + 1,024 = 787,456
    small = GPTConfig(n_layers=4, n_heads=4, d_model=256, seq_len=128, vocab_size=256)
    assert flops_per_token(small) == 6 * (4 * 787_456 + 512 + 65_536) + 12 * 4 * 128 * 256


def test_flops_matmul_term_matches_torch_flop_counter():
    """6N counts 2 FLOPs forward + 4 backward per weight per token; torch's FlopCounterMode counts
    the matmuls actually run. LayerNorm weights are in N but do no matmul: 640 of them here."""
    from torch.utils.flop_counter import FlopCounterMode

    net, x = GPT(NANO), torch.randint(0, 256, (2, 64))
    with FlopCounterMode(display=False) as fc:
        net(x).float().sum().backward()
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    matmul_weights = NANO_N - (2 * 2 * 2 * 64 + 2 * 64)            # minus LayerNorm weights and biases
    assert counts["aten.mm"] == 6 * matmul_weights * 2 * 64          # 128 tokens


def test_flops_attention_term_matches_math_attention():
    """12 L T d per token: QK^T and AV, 2 T^2 d FLOPs each per layer and sequence forward, x3
    with backward (the full square, as the formula counts it; the math kernel computes it too)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    net, x = GPT(NANO), torch.randint(0, 256, (2, 64))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        net(x).float().sum().backward()
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    assert counts["aten.bmm"] == 12 * 2 * 64 * 64 * 2 * 64


def test_mlp_flops_from_config():
    cfg = MLPConfig(in_features=8, hidden=[16, 4], num_classes=3)
    assert mlp_params(cfg) == (8 * 16 + 16) + (16 * 4 + 4) + (4 * 3 + 3) == 227
    assert mlp_params(cfg) == sum(p.numel() for p in MLPClassifier(cfg).parameters())
    assert mfu_mod.model_flops_per_sample(cfg) == (6 * 227, mfu_mod.FORMULA_MLP)


def _hw(name="h", peaks=None, threads=1):
    peaks = peaks or {"fp32": 1e9, "bf16": 4e9, "fp16": 4e9}
    return SimpleNamespace(name=name, peak_flops=peaks, threads_per_device=threads, note="probe",
                           peak=lambda d: float(peaks[d]))


def _record(samples_per_s=10.0, world=2, precision="32-true", accel="cpu", threads=2):
    return {"throughput": {"samples_per_s": samples_per_s}, "world_size": world, "precision": precision,
            "hardware": {"accelerator": accel, "threads_per_rank": threads}}


def test_mfu_by_hand_on_cpu():
    # 10 samples/s x 64 tokens x 790,272 FLOPs = 505,774,080 FLOP/s; peak 1e9 per thread x 2
    # threads per rank x 2 ranks = 4e9 -> 0.12644352
    out = mfu_mod.compute_mfu(_record(), NANO, _hw())
    assert out["model_flops_per_sample"] == 50_577_408
    assert out["model_flops_per_s"] == pytest.approx(505_774_080)
    assert out["peak_flops_per_device"] == 2e9
    assert out["value"] == pytest.approx(0.12644352, rel=1e-12)


def test_mfu_cpu_low_precision_uses_the_larger_peak():
    slow_bf16 = _hw(peaks={"fp32": 1e9, "bf16": 2e7, "fp16": 2e7})   # no fast bf16 kernel
    out = mfu_mod.compute_mfu(_record(precision="bf16-mixed"), NANO, slow_bf16)
    assert out["dtype"] == "fp32" and out["value"] == pytest.approx(0.12644352)
    assert "bf16" in out["note"]
    out = mfu_mod.compute_mfu(_record(precision="bf16-mixed"), NANO, _hw())  # bf16 4x fp32
    assert out["dtype"] == "bf16" and out["value"] == pytest.approx(0.12644352 / 4)


def test_mfu_on_gpu_uses_the_precision_peak_and_no_thread_scaling():
    out = mfu_mod.compute_mfu(_record(precision="bf16-mixed", accel="gpu", threads=8), NANO, _hw())
    assert out["peak_flops_per_device"] == 4e9
    assert out["value"] == pytest.approx(505_774_080 / 8e9)


def test_mfu_is_a_model_property_not_a_ranks():
    """ZeRO-3 partitions parameters and a pipeline stage holds a few layers: the record's FLOPs
    come from the config, so a net that lost its parameters changes nothing."""
    out = mfu_mod.compute_mfu(_record(), NANO, _hw())
    assert out["model_flops_per_sample"] == NANO_FLOPS_PER_TOKEN * 64
    assert mfu_mod.compute_mfu(_record(samples_per_s=0.0), NANO, _hw()) is None


def test_cpu_peak_is_probed_on_this_host_and_cached(tmp_path, monkeypatch):
    calls = []

    def fake_probe(out_path, *a, **k):
        calls.append(out_path)
        out_path.write_text("name: this_cpu\npeak_flops: {fp32: 12345.0, bf16: 1.0, fp16: 1.0}\n"
                            "memory_bytes: 1.0\nmemory_bandwidth_bytes_per_s: 1.0\nthreads_per_device: 1\n"
                            "intra_node: {bandwidth_bytes_per_s: 1.0, latency_s: 0.0}\n"
                            "inter_node: {bandwidth_bytes_per_s: 1.0, latency_s: 0.0}\nnote: fake host\n")

    monkeypatch.setattr("scalelab.plan.hardware.probe_cpu", fake_probe)
    hw = mfu_mod.load_profile("auto", "cpu", tmp_path)
    assert hw.peak("fp32") == 12345.0 and len(calls) == 1      # the host's probe, not conf/hardware/this_cpu.yaml
    assert mfu_mod.load_profile("this_cpu", "cpu", tmp_path).peak("fp32") == 12345.0
    assert len(calls) == 1                                    # cached: probed once per host
    path = hardware.host_cpu_profile_path(tmp_path)
    assert path.parent == tmp_path / "hardware" and path.is_file()
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path))
    assert hardware.load_hardware("this_cpu").peak("fp32") == 12345.0  # the planner's this_cpu is the same
    assert len(calls) == 1
    monkeypatch.setattr(hardware, "_host_key", lambda: "another-host")
    mfu_mod.load_profile("auto", "cpu", tmp_path)
    assert len(calls) == 2                                    # another CPU/torch: probed anew


def _rank(times, losses, steps=None, **extra):
    return {"step_times": times, "losses": losses, "global_steps": steps or list(range(1, len(times) + 1)),
            "peak_rss_bytes": 100, "params": 1, "grads": 2, "optimizer": 3, "host_flops": [], **extra}


def test_summarize_by_hand():
    # 12 steps; rank 1 is slower on some steps; warm-up 2 and profiled 3 steps excluded.
    r0 = [9.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0]
    r1 = [9.0, 5.0, 2.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0]
    per_rank = [_rank(r0, [float(i) for i in range(12)]), _rank(r1, [float(i + 1) for i in range(12)])]
    out = summarize(per_rank, global_batch=8, tokens_per_sample=64, warmup_steps=2, profiled_steps=3)
    # steady = steps 3..9 (7 steps) of the per-step max: [2, 1, 3, 1, 1, 1, 1] -> sum 10
    assert out["step_time_s"]["measured_steps"] == 7
    assert out["step_time_s"]["median"] == 1.0
    assert out["step_time_s"]["p90"] == 3.0          # ceil(0.9 x 7) = 7th of [1,1,1,1,1,2,3]
    assert out["step_time_s"]["mean"] == pytest.approx(10 / 7)
    assert out["throughput"]["samples_per_s"] == pytest.approx(8 * 7 / 10)
    assert out["throughput"]["tokens_per_s"] == pytest.approx(8 * 7 / 10 * 64)
    assert out["step_time_s"]["warmup_steps_excluded"] == 2
    assert out["step_time_s"]["profiled_steps_excluded"] == 3
    assert out["step_time_per_rank_s"] == [1.0, 1.0]  # r1's steady [2,1,3,1,1,1,1]: median 1
    assert out["loss"]["first"] == 0.5 and out["loss"]["final"] == 11.5
    assert out["memory"]["model_state_bytes_per_rank"] == [6, 6]


def test_jittered_step_boundaries_are_not_summed_as_maxima():
    """Two ranks in lockstep whose step boundaries jitter apart: rank 0 logs 1, 3, 1, 3 ms where
    rank 1 logs 3, 1, 3, 1 ms, 8 ms each in all. The max per step (3, 3, 3, 3: 12 ms) was more
    than either rank's elapsed time; the run takes 8 ms: 4 x 4 samples / 8 ms."""
    r0, r1 = [9.0, 1.0, 3.0, 1.0, 3.0], [9.0, 3.0, 1.0, 3.0, 1.0]
    out = summarize([_rank(r0, [1.0] * 5), _rank(r1, [1.0] * 5)], global_batch=4, tokens_per_sample=None,
                    warmup_steps=1)
    assert out["step_time_s"]["mean"] == 2.0 and out["step_time_s"]["median"] == 2.0
    assert out["throughput"]["samples_per_s"] == 4 * 4 / 8.0
    # a straggler is still the run's pace: rank 1's steady 12 ms, not rank 0's 4
    out = summarize([_rank([9.0, 1.0, 1.0, 1.0, 1.0], [1.0] * 5), _rank([9.0, 3.0, 3.0, 3.0, 3.0], [1.0] * 5)],
                    global_batch=4, tokens_per_sample=None, warmup_steps=1)
    assert out["step_time_s"]["median"] == 3.0 and out["throughput"]["samples_per_s"] == 4 * 4 / 12.0


def test_p90_is_nearest_rank_not_the_maximum():
    assert p90([float(i) for i in range(1, 11)]) == 9.0    # of 10 values: the 9th
    assert p90([1.0]) == 1.0 and p90([]) is None
    assert p90([float(i) for i in range(1, 21)]) == 18.0


def test_short_run_says_what_it_excluded():
    per_rank = [_rank([5.0, 1.0, 2.0], [1.0, 1.0, 1.0])]
    out = summarize(per_rank, global_batch=4, tokens_per_sample=None, warmup_steps=5)
    assert out["step_time_s"]["warmup_steps_excluded"] == 1    # not 5: only the first step went
    assert out["step_time_s"]["measured_steps"] == 2
    assert out["throughput"]["samples_per_s"] == pytest.approx(4 * 2 / 3)


def test_loss_from_the_ranks_that_compute_it():
    per_rank = [_rank([1.0, 1.0], [0.0, 0.0]), _rank([1.0, 1.0], [3.0, 2.0])]
    out = summarize(per_rank, 2, None, 0, loss_ranks=[1])
    assert out["loss"]["curve"] == [[1, 3.0], [2, 2.0]]


def test_device_memory_is_read_from_the_ranks_own_device():
    seen = []

    def fake_reader(device):
        seen.append(device)
        return {"peak_allocated": 7 * 2 ** 30, "peak_reserved": 8 * 2 ** 30}

    m = StepMetrics(1, plan=None)
    m.step_times, m.losses, m.global_steps = [1.0], [2.0], [1]
    m.peaks = read_peaks(torch.device("cuda", 3), read_device_memory=fake_reader)
    assert seen == [torch.device("cuda", 3)]
    rank = m.rank_summary()
    assert rank["peak_device_bytes"] == 7 * 2 ** 30 and rank["peak_device_reserved_bytes"] == 8 * 2 ** 30
    assert rank["peak_rss_bytes"] > 0
    out = summarize([rank, {**rank, "peak_device_bytes": 5}], 1, None, 0)
    assert out["memory"]["peak_device_bytes_per_rank"] == [7 * 2 ** 30, 5]
    assert out["memory"]["peak_device_reserved_bytes_per_rank"] == [8 * 2 ** 30] * 2
    assert "peak_device_bytes" not in read_peaks(torch.device("cpu"), read_device_memory=fake_reader)
    assert len(seen) == 1


def test_peaks_are_read_at_the_end_of_training_from_the_strategys_device():
    """Before Lightning's teardown and before any checkpoint/export after fit; from the
    strategy's root device, whatever device the module sits on then."""
    m = StepMetrics(1, plan=None)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")))
    m.on_train_end(trainer, SimpleNamespace(device=torch.device("meta")))
    assert set(m.peaks) == {"peak_rss_bytes"} and m.rank_summary()["peak_rss_bytes"] == m.peaks["peak_rss_bytes"]


@pytest.mark.parametrize("wrapped", [True, False])
def test_teardown_leaves_model_and_optimizer_state_where_they_are(monkeypatch, wrapped):
    """Lightning's Strategy.teardown copies both to host memory (12 bytes/param with Adam); the
    unwrapped strategy shows the copies this test would catch."""
    from lightning.fabric.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from scalelab.models.lit import LitModule
    from scalelab.strategies.base import without_teardown_copies

    module_moves, optimizer_moves = [], []
    monkeypatch.setattr(_DeviceDtypeModuleMixin, "cpu", lambda self: module_moves.append(self) or self)
    monkeypatch.setattr("lightning.pytorch.strategies.strategy._optimizers_to_device",
                        lambda opts, dev: optimizer_moves.extend(opts))
    lit = LitModule(NANO, "lm", torch.optim.SGD, 0.1, 10, 0, "constant", 0.1)
    opt = torch.optim.SGD(lit.parameters(), lr=0.1)
    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    if wrapped:
        strategy = without_teardown_copies(strategy)
    strategy._lightning_module, strategy.optimizers = lit, [opt]
    strategy.accelerator = SimpleNamespace(teardown=lambda: None)
    strategy.teardown()
    if wrapped:
        assert module_moves == [] and optimizer_moves == []
        assert strategy.optimizers == [opt] and lit.keep_on_device is False   # restored for later use
    else:
        assert module_moves == [lit] and optimizer_moves == [opt]


def test_breakdown_combine_by_hand():
    out = combine([{"step_s": 1.0, "comm_s": 0.3, "steps": 3}, {"step_s": 1.0, "comm_s": 0.1, "steps": 3}])
    r0, r1 = out["per_rank"]
    assert (r0["compute_s"], r0["transfer_s"], r0["wait_s"]) == pytest.approx((0.7, 0.1, 0.2))
    assert (r1["compute_s"], r1["transfer_s"], r1["wait_s"]) == pytest.approx((0.9, 0.1, 0.0))
    assert out["straggler_rank"] == 1                       # it computed longest; rank 0 waited for it
    assert out["compute_imbalance"] == pytest.approx(0.9 / 0.8)
    assert out["comm_fraction"] == pytest.approx(0.2) and out["wait_fraction"] == pytest.approx(0.1)
    assert combine([{"step_s": 1.0, "comm_s": 0.1, "steps": 3}, None]) is None


def test_gpu_breakdown_reads_nccl_kernels_from_a_trace():
    """A chrome trace as torch.profiler writes it with CUDA activity: CPU ops (ignored: on CUDA
    they only launch kernels), compute kernels and NCCL kernels, partly overlapped."""
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
         "ts": 50, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllGather_RING_LL_Sum_int8_t", "ts": 200, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel", "ts": 220, "dur": 10},
        {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 10},
    ]}
    out = gpu_comm(json.loads(json.dumps(trace)))
    # NCCL union: [50,150] + [200,250] = 150 us; hidden behind compute: [50,100] + [220,230] = 60 us
    assert out == {"total_us": 150.0, "exposed_us": 90.0, "kernels": 2}


def test_device_anatomy_splits_a_step_into_busy_and_idle_and_names_the_top_kernels():
    """Two profiled steps of 1000 us: kernels and a memcpy cover [0,300] + [400,500] + [1000,1200]
    (overlaps counted once) = 600 us busy in 2 steps: 0.3 ms busy, 0.7 ms idle per step."""
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 2000},        # host: not device time
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 0, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "elementwise", "ts": 100, "dur": 200},  # overlaps the gemm
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 400, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 1000, "dur": 200},
    ]}
    out = device_anatomy(json.loads(json.dumps(trace)), steps=2, step_s=1e-3)
    assert out["busy_s"] == pytest.approx(300e-6) and out["idle_s"] == pytest.approx(700e-6)
    assert out["kernels_per_step"] == 2.0
    assert out["top_kernels_ms"][0] == {"name": "sm90_gemm", "ms": pytest.approx(0.2), "calls": 1.0}
    assert [k["name"] for k in out["top_kernels_ms"]] == ["sm90_gemm", "elementwise", "Memcpy HtoD"]
    # and the per-rank breakdown keeps it
    r = combine([{"step_s": 1e-3, "comm_s": 0.0, "steps": 2, "device": out}])
    assert r["per_rank"][0]["device"]["busy_s"] == pytest.approx(300e-6)


def test_sweep_efficiency_and_counts(tmp_path):
    from scalelab.results.sweep import aggregate

    def write(job, world, thr, status="completed"):
        d = tmp_path / job
        d.mkdir()
        rec = {"status": status, "strategy": "ddp", "world_size": world, "global_batch_size": 16,
               "parallel": {"dp": world}, "throughput": {"samples_per_s": thr},
               "config": {"strategy": {"name": "ddp"}, "trainer": {"devices": world}}, "job": {"name": job}}
        (d / "run.json").write_text(json.dumps(rec))

    write("0", 1, 100.0)
    write("1", 2, 150.0)
    write("2", 4, 200.0)
    write("3", 2, 0.0)             # completed, but no steady step measured
    write("4", 2, None, "failed")
    out = aggregate(tmp_path, write=False)
    (g,) = [g for g in out["groups"] if g["kind"] == "strong"]
    assert [r["scaling_efficiency"] for r in g["runs"]] == pytest.approx([1.0, 0.75, 0.5])
    assert out["num_completed"] == 4 and out["num_failed"] == 1 and out["unmeasured"] == ["3"]


def test_cuda_step_times_come_from_events_read_once_after_training(monkeypatch):
    """On CUDA a step's time is the interval between consecutive events on the stream, read after
    training: no host sync per step (it would drain the queue each step). Fake events at device
    times 0, 40, 75, 115 ms give steps of 40, 35 and 40 ms; losses stay tensors until then."""
    from scalelab.scaling import metrics

    class Event:
        clock = iter([0.0, 40.0, 75.0, 115.0])
        synced = 0

        def __init__(self):
            self.t = next(Event.clock)

        def elapsed_time(self, end):          # ms, as torch.cuda.Event.elapsed_time
            return end.t - self.t

        def synchronize(self):
            Event.synced += 1

    monkeypatch.setattr(metrics, "record_event", lambda device: Event())
    monkeypatch.setattr(metrics, "_sync", lambda device: None)
    cb = StepMetrics(accumulate=1, plan=SimpleNamespace(state_bytes=lambda *a: {}, grad_bytes=lambda *a: 0))
    module = SimpleNamespace(device=torch.device("cuda"))
    trainer = SimpleNamespace(global_step=0)
    cb.on_train_start(trainer, module)
    for step, loss in enumerate([3.0, 2.5, 2.0], start=1):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, {"raw_loss": torch.tensor(loss)}, None, step - 1)
    assert cb.step_times == [] and cb.losses == [] and Event.synced == 0   # nothing read during training
    summary = cb.rank_summary()
    assert summary["step_times"] == pytest.approx([0.040, 0.035, 0.040])
    assert summary["losses"] == [3.0, 2.5, 2.0] and summary["global_steps"] == [1, 2, 3]
    assert Event.synced == 1


def test_long_runs_move_old_step_events_and_losses_off_the_device(monkeypatch):
    """Every FLUSH_EVERY steps the events older than LAG_STEPS are read (one wait, on an old
    event) and released, and the losses go to a host copy: pending device objects stay bounded,
    and the figures are the ones read all at once. Fake device times: step k ends at 10*k*(k+1)/2
    ms (steps of 10, 20, 30, ... ms); the loss of step k is k."""
    from scalelab.scaling import metrics

    times = iter([0.0] + [10.0 * k * (k + 1) / 2 for k in range(1, 11)])

    class Event:
        waited_on: list = []

        def __init__(self):
            self.t = next(times)

        def elapsed_time(self, end):
            return end.t - self.t

        def synchronize(self):
            Event.waited_on.append(self.t)

    copies = []

    class CopyDone:
        def synchronize(self):
            copies.append("waited")

    def fake_host_copy(value):       # what host_copy does on CUDA: a host tensor and an event
        copies.append(value.tolist())
        return value.clone(), CopyDone()

    monkeypatch.setattr(metrics, "record_event", lambda device: Event())
    monkeypatch.setattr(metrics, "_sync", lambda device: None)
    monkeypatch.setattr(metrics, "host_copy", fake_host_copy)
    monkeypatch.setattr(metrics, "FLUSH_EVERY", 4)
    monkeypatch.setattr(metrics, "LAG_STEPS", 2)
    cb = StepMetrics(accumulate=1, plan=SimpleNamespace(state_bytes=lambda *a: {}, grad_bytes=lambda *a: 0))
    module, trainer = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(global_step=0)
    cb.on_train_start(trainer, module)
    most_pending = 0
    for step in range(1, 11):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, {"raw_loss": torch.tensor(float(step))}, None, step - 1)
        most_pending = max(most_pending, len(cb._events), len(cb._pending_losses))
    assert most_pending == 5                              # FLUSH_EVERY + LAG_STEPS - 1 at most
    # flushes at steps 4 and 8 (losses 1-4, then 5-8 while 3-4's events were kept), each waiting
    # on the end of the step LAG_STEPS before the newest only: steps 2 (30 ms) and 6 (210 ms)
    # (the first copy read when the next one is made, the second after training)
    assert copies == [[1.0, 2.0, 3.0, 4.0], "waited", [5.0, 6.0, 7.0, 8.0]]
    assert Event.waited_on == [30.0, 210.0]
    summary = cb.rank_summary()
    assert summary["step_times"] == pytest.approx([0.01 * k for k in range(1, 11)])
    assert summary["losses"] == [float(k) for k in range(1, 11)] and summary["global_steps"] == list(range(1, 11))
    assert copies[-1] == "waited" and Event.waited_on[-1] == 550.0    # the rest: one wait, on the last event
