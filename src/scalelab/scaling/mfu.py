"""Model FLOPs utilization of a run: achieved model FLOP/s over the peak of the devices used.

Model FLOPs per token (training, fwd + bwd), for the GPT (Kaplan et al. 2020; PaLM appendix B):
    6 * N + 12 * L * T * d      N = non-embedding parameters, L layers, T context, d width
(6 per parameter per token for the matmuls, plus attention scores and values). For the MLP
classifier: 6 * N per sample. Both are counted from the model's config (models/gpt.py
`flops_per_token`, models/mlp.py `mlp_params`), never from live parameter tensors, which ZeRO-3
partitions, a pipeline stage holds only in part and TP shards: one model and batch give the
same FLOPs under every strategy. Recomputation (activation checkpointing) is not model FLOPs.

Peak FLOP/s per device comes from a hardware profile (conf/hardware/). On CPU it is this host's
own probe (`host_cpu_profile`: a matmul probe run once per host, CPU model, core count and torch
version, cached under the cache dir), never a committed figure from another machine, scaled by
the threads each rank uses. CPU runs in bf16/fp16 are measured against the larger of the
host's fp32 and 16-bit peaks (the record says which): CPU 16-bit matmuls may have no fast kernel
(one host probed bf16 50x below fp32, another 2x above it), and the slower peak would put MFU
above what the host allows. A GPU profile is never applied to a CPU run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.errors import ConfigError
from scalelab.plan.hardware import HOST_CPU  # this host's own probe (plan.hardware.host_cpu_profile)

FORMULA_GPT = "6*N + 12*L*T*d per token (N non-embedding params; Kaplan et al. 2020, PaLM app. B)"
FORMULA_MLP = "6*N per sample (N params)"
_GPU_BY_NAME = (("H200", "h200"), ("H100", "h100_sxm"), ("A100", "a100_80g_nvlink"))


def gpu_profile(device_name: str) -> str | None:
    """The profile whose peak FLOP/s is this GPU's (torch.cuda.get_device_name), else None. The
    Hopper PCIe and NVL parts run at lower clocks than the SXM ones the profiles describe (dense
    bf16: H100 PCIe 756 TFLOP/s, H100 NVL and H200 NVL 835, SXM 989; NVIDIA's datasheets), so the
    SXM peak would understate their MFU by 15-24 %: no profile for them. A100 PCIe has the SXM's
    peak (312); GH200's GPU the H200's (989)."""
    name = device_name.upper()
    if ("H100" in name or "H200" in name) and ("PCIE" in name or "NVL" in name):
        return None
    return next((p for key, p in _GPU_BY_NAME if key in name), None)


def no_profile_note(requested: str, accelerator: str) -> str | None:
    """The line a GPU run without MFU prints: which GPU has no profile and how to give one."""
    if accelerator == "cpu" or profile_name(requested, accelerator) is not None:
        return None
    import torch

    return (f"[scalelab] no MFU: no hardware profile has the peak FLOP/s of {torch.cuda.get_device_name(0)!r}; "
            "set hardware_profile=NAME (conf/hardware/) or a path to a .yaml profile with its peak_flops")


def profile_name(requested: str, accelerator: str) -> str | None:
    """The hardware profile for MFU (None: an unknown GPU; set hardware_profile=NAME)."""
    if requested not in (None, "auto"):
        if accelerator == "cpu" and not is_cpu_profile(str(requested)):
            raise ConfigError(f"hardware={requested} (hardware_profile) is a GPU profile but this run is on CPU: "
                              "use hardware=this_cpu or leave it unset (a GPU peak would understate CPU MFU)")
        return str(requested)
    if accelerator == "cpu":
        return HOST_CPU
    import torch

    return gpu_profile(torch.cuda.get_device_name(0))


def is_cpu_profile(requested: str) -> bool:
    """By the profile's own `kind` (a CPU profile may have any name, a calibrated `workstation`,
    and a GPU profile's path may hold "cpu"); by its name only for this host's probe (loading it
    may probe) and a profile that does not load (the config check names an unknown one)."""
    from scalelab.plan.hardware import load_hardware

    if requested == HOST_CPU:
        return True
    try:
        return load_hardware(requested).kind == "cpu"
    except Exception:  # noqa: BLE001 - unknown or unreadable: reported by the schema check
        return "cpu" in requested


def _dtype(precision: str) -> str:
    return "bf16" if "bf16" in precision else "fp16" if precision.startswith("16") else "fp32"


def model_flops_per_sample(arch: Any) -> tuple[int, str]:
    """Training model FLOPs per sample and the formula, from the model's config dataclass."""
    from scalelab.models.gpt import GPTConfig, flops_per_token
    from scalelab.models.mlp import MLPConfig, mlp_params

    if isinstance(arch, GPTConfig):
        return flops_per_token(arch) * arch.seq_len, FORMULA_GPT
    if isinstance(arch, MLPConfig):
        return 6 * mlp_params(arch), FORMULA_MLP
    raise TypeError(f"no FLOPs formula for model config {type(arch).__name__}")


def load_profile(requested: str, accelerator: str, cache_dir: str | Path | None):
    """The Hardware profile for a run's MFU (None for an unknown GPU)."""
    from scalelab.plan.hardware import load_hardware

    name = profile_name(requested, accelerator)
    return None if name is None else load_hardware(name, cache_dir)


def compute_mfu(record: dict, arch: Any, hw: Any) -> dict | None:
    """MFU of a finished run from its record (throughput, precision, world size, threads), the
    model config and the hardware profile `hw` (plan.hardware.Hardware; None: no MFU)."""
    thr = record["throughput"]
    if not thr.get("samples_per_s") or hw is None:
        return None
    per_sample, formula = model_flops_per_sample(arch)
    run_dtype = _dtype(record["precision"])
    cpu = record["hardware"]["accelerator"] == "cpu"
    dtype = run_dtype
    if cpu and run_dtype != "fp32" and hw.peak("fp32") >= hw.peak(run_dtype):
        dtype = "fp32"  # no faster 16-bit kernel here: the host's best for these matmuls is fp32
    peak = hw.peak(dtype)
    if cpu:  # a CPU "device" in the profile is a rank of threads_per_device threads
        threads = record["hardware"]["threads_per_rank"]
        peak *= threads / max(1, getattr(hw, "threads_per_device", 1) or 1)
        # ranks x threads above the node's cores share them: the peak is the cores', not the ranks'
        per_node, cores = record.get("devices_per_node") or record["world_size"], record["hardware"].get("host_cores")
        if cores and per_node * threads > cores:
            peak *= cores / (per_node * threads)
    achieved = thr["samples_per_s"] * per_sample
    out = {"value": achieved / (peak * record["world_size"]), "model_flops_per_sample": per_sample,
           "model_flops_per_s": achieved, "peak_flops_per_device": peak, "dtype": dtype,
           "hardware_profile": hw.name, "formula": formula}
    if cpu:
        out["peak_source"] = (hw.note or "")[:200]
        if run_dtype != "fp32":
            out["note"] = (f"{run_dtype} run on CPU: MFU against the larger of the host's fp32 and "
                           f"{run_dtype} peaks ({dtype}; CPU 16-bit matmuls may lack fast kernels)")
    return out
