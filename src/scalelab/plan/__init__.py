"""The planner: will a job fit, how fast, how efficient, what will it cost; checked against runs.

    from scalelab.plan import ModelSpec, plan
    doc = plan(ModelSpec.from_shape(32, 4096, 32, 50257, 2048), "zero3", "h100_sxm",
               devices=8, nodes=4, micro_batch=1, global_batch=512, precision="bf16-mixed")

Modules (each cites its model): model_states (ZeRO), activations (Korthikanti et al. 2022),
flops (Narayanan et al. 2021), comm (ring collectives, nccl-tests bus bandwidth), step_time (the
assembly, pipeline bubble), peak_memory (the step's peak per device, host RAM per node), hardware
(profiles + CPU probe), calibrate (fit / validate against run.json records), cli (`scalelab plan`).
"""
from .spec import (PlanError, ModelSpec, Layout, Strategy, STRATEGIES, conf_dir, get_strategy, strategy_names,
                   resolve_layout)
from .hardware import Hardware, Link, load_hardware, list_hardware, probe_cpu, save_hardware
from .model_states import model_states, zero_paper_bytes, bytes_per_param
from .activations import activation_bytes_per_device, layer_activation_bytes
from .flops import model_flops, hardware_flops, megatron_flops
from .comm import Collective, collectives
from .step_time import plan, build_terms, step_time
from .calibrate import calibrate
from .run_records import find_runs, terms_from_run
from .validate import validate

__all__ = [
    "PlanError", "ModelSpec", "Layout", "Strategy", "STRATEGIES", "conf_dir", "get_strategy", "strategy_names",
    "resolve_layout", "Hardware", "Link", "load_hardware", "list_hardware", "probe_cpu",
    "save_hardware", "model_states", "zero_paper_bytes", "bytes_per_param",
    "activation_bytes_per_device", "layer_activation_bytes", "model_flops", "hardware_flops",
    "megatron_flops", "Collective", "collectives", "plan", "build_terms", "step_time",
    "calibrate", "validate", "find_runs", "terms_from_run",
]
