"""The planner: memory, communication, step time, throughput, MFU, scaling efficiency and cost.

Step time on one device (every term is per optimizer step):

    t = slowdown x (overhead + compute + bubble + optimizer + exposed communication)

- compute = hardware FLOPs of the device's share / (peak[dtype] x compute_efficiency[dtype@threads])
  (flops.py; the share is 1/(dp tp) of the batch's FLOPs, the slowest pipeline stage for pp > 1)
  + activation bytes written / activation bandwidth: elementwise ops are memory-bound (roofline,
  Williams et al. 2009), which is what makes narrow models slower than their FLOPs say
- slowdown = busy_slowdown[devices of the node at work]: CPU ranks share caches and memory
  bandwidth (fitted 1.10 for 2 ranks on this 2-core VM once each run's host-speed probe is
  applied, the probe itself running with both ranks busy); 1 on GPUs
- bubble = (p - 1) / m x compute x bubble_scale for a pipeline of p stages and m micro-batches
  (GPipe, Huang et al. 2019; 1F1B has the same bubble, Narayanan et al. 2021 Sec. 2.2); bubble_scale
  is 1 in the textbook, fitted on CPU
- optimizer = bytes the update streams (read + write params, grads, states) / memory bandwidth; it is
  memory-bound. An offloaded optimizer streams host memory instead.
- communication = sum of the collectives' ring cost (comm.py); the overlappable part (bucketed DP
  sync, ZeRO-3/FSDP prefetch) hides behind compute up to `comm_overlap` (a hardware-profile
  fraction: about 0 on CPU gloo, which does not overlap, see notes/perf-baseline.md; high on NCCL)
- overhead = per-step framework cost (Python, Lightning loop, optimizer hooks) + a per-strategy
  extra + per micro-batch and per layer x micro-batch costs (op dispatch, plus a strategy's own:
  DTensor dispatch, FSDP hooks); all fitted from real runs by `--calibrate`; they dominate tiny
  models and vanish in big ones.
Given the slowdown, every term is linear in one hardware rate, which is what makes `calibrate.py`
a least-squares fit (see `linear_features`) inside a 1-D search over the slowdown.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import activations as act_mod
from . import flops as flops_mod
from .comm import Collective, _wrapped_by_fsdp2, by_op, collectives
from .hardware import Hardware, load_hardware
from .model_states import ModelStates, bytes_per_param, model_states, zero3_kept_gathered
from .peak_memory import device_total_bytes, fits, fits_host, host_node_bytes
from .strategies import as_applied, model_refuses
from .spec import (PlanError, Layout, ModelSpec, Strategy, compute_dtype, get_strategy, normalize_checkpointing,
                   normalize_optimizer, normalize_precision, resolve_layout, check_sequence_length, sdpa_kernel)


@dataclass
class Terms:
    """Hardware-independent quantities of one configuration."""
    model: ModelSpec
    strategy: Strategy
    layout: Layout
    precision: str
    optimizer: str
    checkpointing: str
    states: ModelStates
    activations_bytes: float        # the most any rank holds (the largest of activations_per_rank)
    colls: list
    model_flops_per_step: float     # whole job, no recomputation (MFU numerator)
    hw_flops_per_device: float      # executed by the slowest device per step
    bubble_fraction: float
    act_traffic_bytes: float        # activations written per step (memory-bound elementwise work)
    opt_device_bytes: float         # memory traffic of the optimizer step on the device
    opt_host_bytes: float           # ... on the host (offload)
    threads: int                    # CPU threads per rank (scales a CPU profile's peak)
    activations_per_rank: tuple = ()  # each pipeline rank's (one entry without a pipeline)
    receive_per_rank: tuple = ()      # of which each pipeline rank's resident receive buffers
    recompute_per_rank: tuple = ()    # full recompute's pipeline-stage bound, gradients aside (0: none)
    loss_transient_bytes: float = 0.0  # of the activations: the head's cross-entropy backward
    weights_16bit: bool = False       # the Blocks run in 16-bit throughout (sixteen_bit_blocks)
    device: str = "gpu"               # the kind of device planned for (build_terms' device)


def _host_optimizer_bytes(terms: Terms, hw: Hardware) -> float:
    """Host memory traffic of an offloaded optimizer step, as one node's ranks share it. A GPU
    node's host bandwidth is the node's (DeepSpeed's CPU Adam of each rank runs on the same
    sockets), so a rank's step moves its bytes at 1 / (ranks on the node) of it: per rank at the
    whole host bandwidth, 8 ranks of a 7B zero3_offload step were predicted at 284.5 % scaling
    efficiency against 1 device. A CPU profile's host rate is one rank's own core's (its probe)."""
    shared = min(terms.layout.world, terms.layout.devices_per_node) if hw.kind == "gpu" else 1
    return terms.opt_host_bytes * shared


def _stage_share(model: ModelSpec, layout: Layout) -> float:
    """Fraction of one replica's FLOPs done by the slowest pipeline stage (flops.slowest_stage)."""
    if layout.pp == 1 or model.kind != "gpt":
        return 1.0 / layout.pp
    tok = model.seq_len
    layer = flops_mod.layer_forward_flops(model, tok)
    head = 2 * tok * model.hidden * model.vocab
    total = model.n_layers * layer + head
    layers, has_head = flops_mod.slowest_stage(model, layout.pp, layout.split)
    return (layers * layer + (head if has_head else 0.0)) / total


def build_terms(model: ModelSpec, strategy: str | Strategy, *, devices: int = 1, nodes: int = 1,
                tp: int | None = None, pp: int | None = None, micro_batch: int = 1,
                global_batch: int | None = None, micro_batches: int | None = None,
                precision: str = "bf16-mixed", optimizer: str = "adam",
                activation_checkpointing="none", threads: int | None = None,
                sequence_parallel: bool = True, device: str = "gpu") -> Terms:
    """`device`: the hardware profile's kind ("gpu" or "cpu"); autocast's LayerNorm dtype differs
    (comm.tp_element_bytes)."""
    strat = strategy if isinstance(strategy, Strategy) else get_strategy(strategy)
    refusal = model_refuses(strat, model.kind)
    if refusal:
        raise PlanError(refusal)
    prec = normalize_precision(precision)
    opt = normalize_optimizer(optimizer)
    ckpt = normalize_checkpointing(activation_checkpointing)
    layout = resolve_layout(strat, model, devices, nodes, tp, pp, micro_batch, global_batch, micro_batches)
    layout = replace(layout, sequence_parallel=sequence_parallel)
    if strat.tensor_parallel and sequence_parallel:
        check_sequence_length(model, layout.tp, layout.world, strat.name)
    ran = as_applied(strat, layout.dp)      # nd at dp 1 applies no FSDP (Terms keeps the configured one)
    states = model_states(model, ran, layout, prec, opt)
    w16 = sixteen_bit_blocks(ran, layout, prec, device)
    per_rank = act_mod.activation_bytes_per_rank(model, layout, prec, ckpt, weights_16bit=w16, loss_transient=True)
    acts = max(per_rank)
    colls = collectives(model, ran, layout, prec, device)
    samples = layout.global_batch
    per_replica = flops_mod.hardware_flops(model, samples / layout.dp, ckpt)
    hw_flops = per_replica * _stage_share(model, layout) / layout.tp
    # Optimizer step traffic per updated parameter: read+write params and states, read grads.
    p_b, g_b, o_b = bytes_per_param(ran, prec, opt)
    traffic = states.updated_params_per_device * (2 * p_b + g_b + 2 * o_b)
    dev, host = (0.0, traffic) if strat.offload_optimizer else (traffic, 0.0)
    # interleaved 1F1B with v virtual stages per rank: (p - 1) / (v m) (Narayanan et al. 2021 Sec. 2.2.2)
    bubble = (layout.pp - 1) / (layout.micro_batches * layout.stages_per_rank) if layout.pp > 1 else 0.0
    traffic_acts = act_mod.activation_traffic_bytes(model, layout, prec, ckpt)
    return Terms(model, strat, layout, prec, opt, ckpt, states, acts, colls,
                 flops_mod.model_flops(model, samples), hw_flops, bubble, traffic_acts, dev, host,
                 threads or 0, tuple(per_rank),
                 tuple(act_mod.pipeline_receive_bytes(model, layout, prec, w16)),
                 tuple(act_mod.recompute_peak_per_rank(model, layout, prec, ckpt, w16)),
                 act_mod.loss_backward_bytes(model.seq_len, layout.micro_batch, model.vocab)
                 / (layout.tp if act_mod.uses_paper_formula(model) else 1), w16, device)


def for_device(terms: Terms, device: str) -> Terms:
    """The same job planned for another kind of device (`plan KEY=VALUE --hardware` of the other
    kind): what autocast saves and sends differs on CPU and GPU (sixteen_bit_blocks,
    comm.tp_element_bytes), and torch's CPU SDPA runs dropout > 0 with the math kernel. Patching
    the collectives alone planned an fsdp job's activations for the job's own device."""
    if terms.device == device:
        return terms
    L, m = terms.layout, terms.model
    if m.kind == "gpt":     # the override form's kernel is always SDPA's choice (run_records.model_from_run)
        m = replace(m, attention=sdpa_kernel(device, m.dropout))
    return build_terms(m, terms.strategy, devices=L.devices_per_node, nodes=L.nodes, tp=L.tp, pp=L.pp,
                       micro_batch=L.micro_batch, global_batch=L.global_batch, micro_batches=L.micro_batches,
                       precision=terms.precision, optimizer=terms.optimizer,
                       activation_checkpointing=terms.checkpointing, threads=terms.threads or None,
                       sequence_parallel=L.sequence_parallel, device=device)


def sixteen_bit_blocks(ran: Strategy, layout, precision: str, device: str) -> bool:
    """Whether the Blocks save their activations as a 16-bit model does (activations.py's
    weights_16bit: the residual stream and LayerNorms 16-bit, one LayerNorm output for q, k, v):
    DeepSpeed runs a mixed-precision job with the module itself in 16-bit; FSDP2's
    MixedPrecisionPolicy (bf16-mixed) casts the weights and each Block's input, and on CPU, where
    autocast runs layer_norm in its input's dtype, the Blocks are then 16-bit throughout. Measured
    with saved_tensors_hooks (tests/unit/test_plan_saved_tensors.py, fsdp): the 16-bit formula within
    0.5 % over four shapes, the autocast one 1.20-1.23x over. On CUDA autocast runs layer_norm in
    fp32 (its input saved as an fp32 copy, its output cast per matmul): the autocast formula
    (comm.tp_element_bytes says the same of the LayerNorm outputs; not yet measured on a GPU)."""
    if ran.family == "deepspeed" or precision == "bf16-true":   # bf16-true: the module itself is bf16
        return True
    return precision == "bf16-mixed" and device == "cpu" and _wrapped_by_fsdp2(ran, layout)


def rank_threads(terms: Terms, hw: Hardware) -> int:
    """Threads per device the compute rate is for. Only a CPU profile's device is a rank's threads;
    a GPU rank's host threads (threads_per_rank = cores / ranks on GPU jobs) do not scale the
    GPU's peak."""
    return (terms.threads if hw.kind == "cpu" else 0) or hw.threads_per_device


def _peak(hw: Hardware, terms: Terms) -> float:
    return hw.peak(compute_dtype(terms.precision)) * rank_threads(terms, hw) / hw.threads_per_device


def _link_params(hw: Hardware, c: Collective) -> tuple[float, float, float | None]:
    """(bandwidth, latency per hop, latency of a crossing collective's hops inside a node)."""
    if c.op == "host_copy":
        return float(hw.host["link_bandwidth_bytes_per_s"]), 0.0, None
    link = hw.link(c.crosses_nodes, c.kind)
    return link.bandwidth_bytes_per_s, link.latency_s, hw.link(False, c.kind).latency_s if c.crosses_nodes else None


def _local_layers(terms: Terms) -> int:
    return flops_mod.slowest_stage(terms.model, terms.layout.pp, terms.layout.split)[0]


def host_floor_units(terms: Terms) -> int:
    """What a strategy's host floor is per: layers (of the slowest stage) x micro-batches."""
    return _local_layers(terms) * terms.layout.micro_batches


def busy_per_node(terms: Terms) -> int:
    """Devices of a node working at once (all of them: every rank computes)."""
    return min(terms.layout.world, terms.layout.devices_per_node)


def compute_key(terms: Terms, hw: Hardware) -> str:
    """'fp32@2': the compute dtype at this many threads per device (CPU ranks)."""
    return f"{compute_dtype(terms.precision)}@{rank_threads(terms, hw)}"


def linear_features(terms: Terms, hw: Hardware, split: bool = False) -> dict[str, float]:
    """x such that step time = sum(theta[k] * x[k]) with theta from `theta_of(hw)`.

    The compute term is keyed "compute:<dtype>@<threads>" and an intra-node collective's terms
    "intra_bw:<op>" / "intra_lat:<op>" when the profile has figures for them (or `split`, for
    fitting them), else "compute" / "intra_bw" / "intra_lat". Overlap is taken as a constant
    fraction here (exact when comm_overlap = 0, as on CPU gloo)."""
    key = compute_key(terms, hw)
    ck = f"compute:{key}" if (split or key in hw.compute_efficiency_by) else "compute"
    m = terms.layout.micro_batches
    name = terms.strategy.name
    x = {"overhead": 1.0, f"strategy:{name}": 1.0, "micro_overhead": float(m),
         "layer_overhead": float(m * _local_layers(terms)),
         f"strategy_layer:{name}": float(m * _local_layers(terms)),
         ck: terms.hw_flops_per_device / _peak(hw, terms), "act_memory": terms.act_traffic_bytes,
         # linear in bubble_scale given the profile's compute rates (calibrate refits once with
         # the fitted rates so the two agree)
         "bubble": terms.bubble_fraction * _compute_s(terms, hw),
         "memory": terms.opt_device_bytes, "host_memory": _host_optimizer_bytes(terms, hw),
         "intra_bw": 0.0, "intra_lat": 0.0, "inter_bw": 0.0, "inter_lat": 0.0, "host_link": 0.0}
    for c in terms.colls:
        keep = 1 - hw.comm_overlap if c.overlappable else 1.0
        if c.op == "host_copy":
            x["host_link"] += keep * c.bytes_per_step
            continue
        intra_key = c.op if split else hw.collective_key(c.kind)
        intra_lat = f"intra_lat:{intra_key}" if (split or intra_key) else "intra_lat"
        if c.crosses_nodes:   # the ring's network hops at inter_lat, its hops inside nodes at the node's
            inter = c.inter_hops * c.calls
            x["inter_bw"] += keep * c.bytes_per_step
            x["inter_lat"] += keep * inter
            x[intra_lat] = x.get(intra_lat, 0.0) + keep * (c.latency_hops_per_step - inter)
            continue
        bw = f"intra_bw:{intra_key}" if (split or intra_key) else "intra_bw"
        x[bw] = x.get(bw, 0.0) + keep * c.bytes_per_step
        x[intra_lat] = x.get(intra_lat, 0.0) + keep * c.latency_hops_per_step
    f = hw.slowdown(busy_per_node(terms))
    return {k: v * f for k, v in x.items()}


def theta_of(hw: Hardware) -> dict[str, float]:
    th = {"overhead": hw.step_overhead_s, "micro_overhead": hw.micro_batch_overhead_s,
          "layer_overhead": hw.layer_overhead_s, "compute": 1 / hw.compute_efficiency,
          "memory": 1 / hw.memory_bandwidth_bytes_per_s, "act_memory": 1 / hw.activation_bandwidth,
          "bubble": hw.bubble_scale,
          "host_memory": 1 / float(hw.host["memory_bandwidth_bytes_per_s"]),
          "intra_bw": 1 / hw.intra_node.bandwidth_bytes_per_s, "intra_lat": hw.intra_node.latency_s,
          "inter_bw": 1 / hw.inter_node.bandwidth_bytes_per_s, "inter_lat": hw.inter_node.latency_s,
          "host_link": 1 / float(hw.host["link_bandwidth_bytes_per_s"])}
    for name, s in hw.strategy_overhead_s.items():
        th[f"strategy:{name}"] = s
    for name, s in hw.strategy_layer_overhead_s.items():
        th[f"strategy_layer:{name}"] = s
    for op in hw.collectives:
        link = hw.link(False, op)
        th[f"intra_bw:{op}"] = 1 / link.bandwidth_bytes_per_s
        th[f"intra_lat:{op}"] = link.latency_s
    for key, eff in hw.compute_efficiency_by.items():
        th[f"compute:{key}"] = 1 / eff
    return th


def _compute_s(terms: Terms, hw: Hardware) -> float:
    eff = hw.efficiency(compute_dtype(terms.precision), rank_threads(terms, hw))
    return (terms.hw_flops_per_device / (_peak(hw, terms) * eff)
            + terms.act_traffic_bytes / hw.activation_bandwidth)     # memory-bound elementwise ops


def step_time(terms: Terms, hw: Hardware) -> dict[str, float]:
    compute = _compute_s(terms, hw)
    bubble = terms.bubble_fraction * compute * hw.bubble_scale
    optim = (terms.opt_device_bytes / hw.memory_bandwidth_bytes_per_s
             + _host_optimizer_bytes(terms, hw) / float(hw.host["memory_bandwidth_bytes_per_s"]))
    total = overlappable = 0.0
    for c in terms.colls:
        t = c.time_s(*_link_params(hw, c))
        total += t
        overlappable += t if c.overlappable else 0.0
    # DDP buckets only hide behind backward (2/3 of compute); ZeRO-3/FSDP prefetch behind all of it.
    window = compute * (2 / 3 if terms.strategy.family == "torch" else 1.0)
    hidden = min(hw.comm_overlap * overlappable, window)
    m = terms.layout.micro_batches
    name = terms.strategy.name
    per_layer = hw.layer_overhead_s + hw.strategy_layer_overhead_s.get(name, 0.0)
    overhead = (hw.step_overhead_s + hw.strategy_overhead_s.get(name, 0.0)
                + m * (hw.micro_batch_overhead_s + _local_layers(terms) * per_layer))
    parts = {"compute_s": compute, "comm_exposed_s": total - hidden, "comm_total_s": total,
             "bubble_s": bubble, "optimizer_s": optim, "overhead_s": overhead}
    # Devices sharing a node's caches/memory bandwidth (CPU ranks) slow each other down.
    f = hw.slowdown(busy_per_node(terms))
    parts = {k: v * f for k, v in parts.items()}
    step = sum(v for k, v in parts.items() if k != "comm_total_s")
    # A GPU step cannot be shorter than the host's time to issue it: a strategy whose hooks and
    # per-parameter dispatch (FSDP2, DeepSpeed) take longer than the device's work leaves the
    # device idle (host-bound; the profile window's `device.idle_s` in run.json shows it).
    host = hw.strategy_host_layer_s.get(name, 0.0) * host_floor_units(terms)
    return {"step_s": max(step, host), **parts, "host_floor_s": host}


def plan(model: ModelSpec, strategy: str | Strategy, hardware: Hardware | str, *, devices: int = 1,
         nodes: int = 1, tp: int | None = None, pp: int | None = None, micro_batch: int = 1,
         global_batch: int | None = None, micro_batches: int | None = None,
         precision: str = "bf16-mixed", optimizer: str = "adam", activation_checkpointing="none",
         tokens: float | None = None, threads: int | None = None,
         sequence_parallel: bool = True) -> dict:
    """Plan one configuration. Returns the JSON document of `scalelab plan --json` (stable keys)."""
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    terms = build_terms(model, strategy, devices=devices, nodes=nodes, tp=tp, pp=pp,
                        micro_batch=micro_batch, global_batch=global_batch,
                        micro_batches=micro_batches, precision=precision, optimizer=optimizer,
                        activation_checkpointing=activation_checkpointing, threads=threads,
                        sequence_parallel=sequence_parallel, device=hw.kind)
    return plan_terms(terms, hw, tokens)


def baseline(terms: Terms, hw: Hardware) -> tuple[Terms, str] | tuple[None, str]:
    """The layout scaling efficiency is measured against (DESIGN.md): the same micro-batch,
    micro-batches per step, precision and optimizer on fewer devices (weak scaling; strong when the
    job's dp is 1, where the baseline runs the same global batch). `single` on
    1 device when it fits; else the same strategy (and tp x pp) on the smallest world size that
    fits. (None, why) when no smaller layout fits: an efficiency against a baseline that could
    not run would mean nothing."""
    L = terms.layout
    kw = dict(micro_batch=L.micro_batch, micro_batches=L.micro_batches, precision=terms.precision,
              optimizer=terms.optimizer, activation_checkpointing=terms.checkpointing,
              threads=terms.threads or None, device=hw.kind)
    one = build_terms(terms.model, "single", devices=1, **kw)
    if fits(one, hw):
        return one, "single on 1 device"
    world = L.tp * L.pp
    while world < L.world:
        if L.world % world == 0:
            devices = min(world, L.devices_per_node)
            try:
                cand = build_terms(terms.model, terms.strategy, devices=devices, nodes=world // devices,
                                   tp=L.tp, pp=L.pp, sequence_parallel=L.sequence_parallel, **kw)
            except PlanError:
                cand = None
            if cand is not None and fits(cand, hw):
                return cand, f"{terms.strategy.name} on {world} device{'s' if world > 1 else ''}, the smallest world size that fits"
        world *= 2
    return None, "no smaller layout fits device memory"


def plan_terms(terms: Terms, hw: Hardware, tokens: float | None = None) -> dict:
    """The `scalelab plan --json` document for built terms (from flags, or from a job's config)."""
    model, L, st = terms.model, terms.layout, terms.states
    times = step_time(terms, hw)
    samples_per_s = L.global_batch / times["step_s"]
    tokens_per_s = samples_per_s * model.seq_len
    peak_job = _peak(hw, terms) * L.world
    mfu = terms.model_flops_per_step / (times["step_s"] * peak_job)
    base, why = baseline(terms, hw)
    base_doc, efficiency = {"world_size": None, "what": why}, None
    if base is not None:
        base_t = step_time(base, hw)["step_s"]
        base_sps = base.layout.global_batch / base_t
        efficiency = samples_per_s / (L.world * base_sps / base.layout.world)
        base_doc = {"strategy": base.strategy.name, "world_size": base.layout.world, "what": why,
                    "step_s": base_t, "samples_per_s": base_sps, "global_batch": base.layout.global_batch,
                    "micro_batch": base.layout.micro_batch}
    # any baseline keeps micro-batch and micro-batches, at a smaller dp unless the job's is 1
    same_batch = base.layout.global_batch == L.global_batch if base is not None else L.dp == 1
    scaling_kind = "strong" if same_batch else "weak"
    device_total = device_total_bytes(terms, hw)
    train = None
    if tokens:
        steps = float(tokens) / (L.global_batch * model.seq_len)
        seconds = steps * times["step_s"]
        device_hours = seconds / 3600 * L.world
        train = {"tokens": float(tokens), "steps": steps, "time_s": seconds,
                 "device_hours": device_hours, "cost": device_hours * hw.cost_per_device_hour,
                 "energy_kwh": device_hours * hw.power_watts / 1000}
    colls = terms.colls
    return {
        "inputs": {
            "model": {"n_params": model.n_params, "n_layers": model.n_layers, "hidden": model.hidden,
                      "heads": model.heads, "vocab": model.vocab, "seq_len": model.seq_len,
                      "ffn_hidden": model.ffn, "kind": model.kind,
                      "shape_inferred": model.shape_inferred,
                      # what the activation memory assumed (activations.py)
                      "attention": model.attention, "dropout": model.dropout},
            "strategy": terms.strategy.name, "hardware": hw.name, "precision": terms.precision,
            "optimizer": terms.optimizer, "activation_checkpointing": terms.checkpointing,
            "parallel": {"world_size": L.world, "nodes": L.nodes, "devices_per_node": L.devices_per_node,
                         "dp": L.dp, "tp": L.tp, "pp": L.pp, "micro_batch": L.micro_batch,
                         "global_batch": L.global_batch, "micro_batches_per_step": L.micro_batches,
                         "sequence_parallel": L.sequence_parallel and L.tp > 1,
                         "split": L.split, "stages_per_rank": L.stages_per_rank},
        },
        "memory": {
            "parameters_bytes_per_device": float(st.params_bytes),
            "gradients_bytes_per_device": float(st.grads_bytes),
            "gradients_at_peak": st.grads_at_peak,
            # ZeRO-1/2: the fraction of the activations still alive when the gradient partition is
            # allocated (model_states.zero_grads_allocated_early); 0 where gradients come after them
            "activations_alive_at_gradients": float(st.acts_alive_at_grads),
            # DeepSpeed ZeRO-3 at 2+ ranks: gathered parameters kept from forward to backward
            "zero3_kept_gathered_params": zero3_kept_gathered(model, terms.strategy, L),
            "optimizer_bytes_per_device": float(st.optimizer_bytes),
            "model_states_bytes_per_device": float(st.total_bytes),
            "activations_bytes_per_device": float(terms.activations_bytes),
            "buffers_bytes_per_device": float(st.resident_buffer_bytes(hw.kind == "cpu")),
            "runtime_bytes_per_device": float(hw.runtime_memory_bytes),
            "total_bytes_per_device": float(device_total),
            "device_memory_bytes": float(hw.memory_bytes),
            "fits": bool(device_total <= hw.memory_bytes) and fits_host(terms, hw),
            "offloaded_bytes_per_device": float(st.offloaded_bytes),
            "host_bytes_per_node": host_node_bytes(terms, hw),
            "host_memory_bytes": float(hw.host["memory_bytes"]) if hw.host.get("memory_bytes") else None,
            "fits_host": fits_host(terms, hw),
        },
        "comm": {
            "bytes_per_step_per_device": float(sum(c.bytes_per_step for c in colls if c.op != "host_copy")),
            "by_collective": {k: v for k, v in by_op(colls).items() if k != "host_copy"},
            "host_transfer_bytes_per_step_per_device": float(sum(c.bytes_per_step for c in colls
                                                                 if c.op == "host_copy")),
            "collectives": [c.as_dict() for c in colls],
        },
        "flops": {"model_per_step": float(terms.model_flops_per_step),
                  "hardware_per_step_per_device": float(terms.hw_flops_per_device),
                  "model_per_token": terms.model_flops_per_step / (L.global_batch * model.seq_len)},
        "time": times,
        "throughput": {"tokens_per_s": tokens_per_s, "samples_per_s": samples_per_s},
        "mfu": mfu,
        # throughput per device vs the baseline's (baseline()): the same micro-batch per
        # data-parallel replica. Weak scaling when the global batch grows with dp; at dp 1 (tp,
        # pipeline) the baseline runs the job's own global batch: strong scaling (a sweep's kinds)
        "scaling_efficiency": efficiency,
        "scaling_kind": scaling_kind,
        "baseline": base_doc,
        "train": train,
    }
