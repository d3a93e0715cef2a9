"""Step time assembly: bubble, overlap, MFU, scaling efficiency, cost, and the hardware profiles."""
import pytest

from scalelab.plan import Hardware, Link, ModelSpec, list_hardware, load_hardware, plan
from scalelab.plan.step_time import build_terms, linear_features, step_time, theta_of

M = ModelSpec.from_shape(8, 1024, 16, 32000, 1024)


def ideal(**kw) -> Hardware:
    """A device with no overhead, free optimizer step and (by default) free communication."""
    d = dict(name="ideal", peak_flops={"fp32": 1e14, "bf16": 4e14, "fp16": 4e14},
             memory_bytes=80e9, memory_bandwidth_bytes_per_s=1e30,
             intra_node=Link(1e30, 0.0), inter_node=Link(1e30, 0.0), devices_per_node=8,
             compute_efficiency=0.5, comm_overlap=0.0, step_overhead_s=0.0,
             host={"link_bandwidth_bytes_per_s": 1e30, "memory_bandwidth_bytes_per_s": 1e30},
             cost_per_device_hour=2.0, power_watts=500.0)
    d.update(kw)
    return Hardware(**d)


def test_single_device_compute_bound():
    doc = plan(M, "single", ideal(), micro_batch=4, precision="bf16-mixed")
    flops = doc["flops"]["model_per_step"]
    assert doc["time"]["step_s"] == pytest.approx(flops / (4e14 * 0.5))
    assert doc["mfu"] == pytest.approx(0.5)
    assert doc["scaling_efficiency"] == pytest.approx(1.0)
    assert doc["throughput"]["tokens_per_s"] == pytest.approx(4 * 1024 / doc["time"]["step_s"])


def test_a_host_bound_strategy_takes_its_host_floor():
    """strategy_host_layer_s: the host needs 5 ms per layer x micro-batch to issue an fsdp step:
    8 layers x 4 micro-batches = 160 ms, longer than the device's compute here, so the step is
    160 ms; a strategy without a floor (ddp) keeps its device time, and a tiny floor changes nothing."""
    hw = ideal(strategy_host_layer_s={"fsdp": 5e-3, "ddp": 1e-9})
    base = plan(M, "single", ideal(), micro_batch=1, global_batch=4, precision="bf16-mixed")["time"]["step_s"]
    assert base < 0.160
    fsdp = plan(M, "fsdp", hw, micro_batch=1, global_batch=4, precision="bf16-mixed")["time"]
    assert fsdp["step_s"] == pytest.approx(0.160) and fsdp["host_floor_s"] == pytest.approx(0.160)
    ddp = plan(M, "ddp", hw, micro_batch=1, global_batch=4, precision="bf16-mixed")["time"]
    assert ddp["step_s"] == pytest.approx(base)


def test_pipeline_bubble_is_p_minus_1_over_m():
    doc = plan(M, "pipeline", ideal(), devices=4, micro_batch=1, global_batch=8)  # m = 8
    t = doc["time"]
    assert doc["inputs"]["parallel"]["micro_batches_per_step"] == 8
    assert t["bubble_s"] == pytest.approx(3 / 8 * t["compute_s"])
    assert doc["scaling_efficiency"] < 1


def test_exposed_comm_with_and_without_overlap():
    slow = dict(intra_node=Link(1e9, 0.0))
    no = plan(M, "ddp", ideal(**slow), devices=8, micro_batch=8)
    assert no["time"]["comm_exposed_s"] == pytest.approx(no["time"]["comm_total_s"])
    full = plan(M, "ddp", ideal(comm_overlap=1.0, **slow), devices=8, micro_batch=8)
    t = full["time"]
    # DDP hides bucketed all-reduces behind backward only (2/3 of compute).
    assert t["comm_exposed_s"] == pytest.approx(max(0.0, t["comm_total_s"] - 2 / 3 * t["compute_s"]))
    assert full["scaling_efficiency"] > no["scaling_efficiency"]


def test_comm_time_is_bytes_over_busbw_plus_latency():
    hw = ideal(intra_node=Link(100e9, 2e-6))
    doc = plan(M, "ddp", hw, devices=8, micro_batch=1)
    (c,) = doc["comm"]["collectives"]
    assert doc["comm"]["bytes_per_step_per_device"] == pytest.approx(2 * 7 / 8 * 4 * M.n_params)
    assert doc["time"]["comm_total_s"] == pytest.approx(
        c["bytes_per_step_per_device"] / 100e9 + 14 * c["calls"] * 2e-6)


def test_tokens_time_cost_energy():
    doc = plan(M, "ddp", ideal(), devices=8, micro_batch=2, tokens=1e9)
    tr = doc["train"]
    steps = 1e9 / (16 * 1024)
    assert tr["time_s"] == pytest.approx(steps * doc["time"]["step_s"])
    assert tr["device_hours"] == pytest.approx(tr["time_s"] / 3600 * 8)
    assert tr["cost"] == pytest.approx(tr["device_hours"] * 2.0)
    assert tr["energy_kwh"] == pytest.approx(tr["device_hours"] * 0.5)


def test_fit_verdict_and_activation_checkpointing():
    big = ModelSpec.from_shape(80, 8192, 64, 32000, 4096)     # ~65B
    hw = load_hardware("a100_80g_nvlink")
    assert not plan(big, "ddp", hw, devices=8)["memory"]["fits"]
    z3 = plan(big, "zero3", hw, devices=8, nodes=8, activation_checkpointing="full")
    assert z3["memory"]["fits"]
    none = plan(big, "zero3", hw, devices=8, nodes=8)
    assert z3["memory"]["activations_bytes_per_device"] < none["memory"]["activations_bytes_per_device"]
    assert z3["time"]["compute_s"] > none["time"]["compute_s"]       # recompute costs FLOPs
    assert (z3["flops"]["hardware_per_step_per_device"]
            > none["flops"]["hardware_per_step_per_device"])
    assert z3["flops"]["model_per_step"] == none["flops"]["model_per_step"]


def test_linear_features_reproduce_step_time():
    hw = load_hardware("this_cpu")
    for s, kw in [("ddp", {}), ("zero3", {}), ("tp", {}), ("pipeline", {"global_batch": 8})]:
        t = build_terms(ModelSpec.from_shape(2, 64, 4, 256, 64), s, devices=2, micro_batch=2,
                        precision="32", threads=1, **kw)
        th = theta_of(hw)
        x = linear_features(t, hw)
        assert sum(th.get(k, 0.0) * v for k, v in x.items()) == pytest.approx(step_time(t, hw)["step_s"])


@pytest.mark.parametrize("name", ["a100_80g_nvlink", "h100_sxm", "h200", "this_cpu"])
def test_profiles_load(name):
    assert name in list_hardware()
    hw = load_hardware(name)
    assert hw.name == name and hw.peak("bf16") > 0 and hw.memory_bytes > 0
    assert hw.intra_node.bandwidth_bytes_per_s > 0 and hw.note
    assert 0 <= hw.comm_overlap <= 1 and hw.power_watts > 0 and hw.cost_per_device_hour > 0


def test_deepspeed_reduce_buckets_count_whole_on_a_gpu_and_written_on_a_cpu():
    """ZeRO-2 allocates its gradient reduce bucket twice (overlap_comm), 2e8 elements each, 16-bit
    under bf16: 8e8 bytes a device allocator counts in full. A CPU rank's RSS sees only what the
    gradients write into one bucket: min(Psi, 2e8) x 2 bytes."""
    small = ModelSpec.from_shape(2, 256, 4, 1000, 128)              # Psi far below 2e8
    gpu = plan(small, "zero2", ideal(), devices=2, micro_batch=1, precision="bf16-mixed")
    cpu = plan(small, "zero2", ideal(kind="cpu"), devices=2, micro_batch=1, precision="bf16-mixed")
    psi = gpu["inputs"]["model"]["n_params"]
    assert gpu["memory"]["buffers_bytes_per_device"] == pytest.approx(2 * 2e8 * 2)
    assert cpu["memory"]["buffers_bytes_per_device"] == pytest.approx(psi * 2)
    assert gpu["memory"]["total_bytes_per_device"] - cpu["memory"]["total_bytes_per_device"] == \
        pytest.approx(8e8 - 2 * psi)
