"""Model FLOPs utilization of a run: achieved model FLOP/s over the peak of the devices used.

Model FLOPs per token (training, fwd + bwd), for the GPT (Kaplan et al. 2020; PaLM appendix B):
    6 * N + 12 * L * T * d      N = non-embedding parameters, L layers, T context, d width
(6 per parameter per token for the matmuls, plus attention scores and values). For the MLP
classifier: 6 * N per sample. Recomputation (activation checkpointing) is not model FLOPs.
Peak FLOP/s per device comes from a hardware profile (conf/hardware/). On CPU it is this
machine's own measured profile (`this_cpu`, from `scalelab plan --probe`), scaled by the threads
each rank uses; a GPU profile is never applied to a CPU run.
"""
from __future__ import annotations

from typing import Any

from scalelab.errors import ConfigError

FORMULA_GPT = "6*N + 12*L*T*d per token (N non-embedding params; Kaplan et al. 2020, PaLM app. B)"
FORMULA_MLP = "6*N per sample (N params)"
_GPU_BY_NAME = (("H200", "h200"), ("H100", "h100_sxm"), ("A100", "a100_80g_nvlink"))


def profile_name(requested: str, accelerator: str) -> str | None:
    """The hardware profile for MFU (None: an unknown GPU; set hardware_profile=NAME)."""
    if requested not in (None, "auto"):
        if accelerator == "cpu" and "cpu" not in str(requested):
            raise ConfigError(f"hardware_profile={requested} is a GPU profile but this run is on CPU: "
                              "use auto or this_cpu (a GPU peak would understate CPU MFU)")
        return str(requested)
    if accelerator == "cpu":
        return "this_cpu"
    import torch

    name = torch.cuda.get_device_name(0)
    return next((p for key, p in _GPU_BY_NAME if key in name), None)


def _dtype(precision: str) -> str:
    return "bf16" if "bf16" in precision else "fp16" if precision.startswith("16") else "fp32"


def compute_mfu(record: dict, net: Any, requested: str) -> dict | None:
    from scalelab.plan.hardware import load_hardware

    thr = record["throughput"]
    if not thr.get("samples_per_s"):
        return None
    if hasattr(net, "flops_per_token"):
        per_sample, formula = net.flops_per_token() * net.cfg.seq_len, FORMULA_GPT
    else:
        per_sample, formula = 6 * sum(p.numel() for p in net.parameters()), FORMULA_MLP
    name = profile_name(requested, record["hardware"]["accelerator"])
    if name is None:
        return None
    hw = load_hardware(name)
    dtype = _dtype(record["precision"])
    peak = hw.peak(dtype)
    if record["hardware"]["accelerator"] == "cpu":  # a CPU "device" in the profile is a rank of N threads
        peak *= record["hardware"]["threads_per_rank"] / max(1, getattr(hw, "threads_per_device", 1) or 1)
    achieved = thr["samples_per_s"] * per_sample
    return {"value": achieved / (peak * record["world_size"]), "model_flops_per_sample": per_sample,
            "model_flops_per_s": achieved, "peak_flops_per_device": peak, "dtype": dtype,
            "hardware_profile": name, "formula": formula}
