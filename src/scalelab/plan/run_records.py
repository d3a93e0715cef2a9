"""Run records as the planner reads them: a sweep's run.json files (DESIGN.md, run record
contract) turned into the planner's Terms and measured figures, for --calibrate (calibrate.py),
--validate (validate.py), the sweep comparison and `recommend --verify`.

CPU step times are brought to the profile's reference host speed with each run's own matmul
probe (`speed_factor`, smoothed over neighbouring jobs by `smooth_host_speeds`): this VM's speed
drifts by up to 1.5x over an hour. A GPU run's probe says nothing of its device, so its factor is 1.
"""
from __future__ import annotations

import collections
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from scalelab.results.record import other_node_part
from scalelab.scaling.run_summary import MIN_MEASURED_STEPS

from .hardware import Hardware
from .spec import SGD_NO_MOMENTUM, ModelSpec, PlanError, get_strategy, sdpa_kernel
from .peak_memory import peak_states_and_activations
from .step_time import Terms, build_terms, rank_threads

SPEED_WINDOW = 5             # host speed = median probe of the jobs within 5 of a run (smooth_host_speeds)


def as_dirs(sweep_dirs) -> list[Path]:
    return [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]


def find_runs(sweep_dirs) -> list[tuple[Path, dict]]:
    """Every run.json under one sweep directory or several."""
    runs = []
    for root in as_dirs(sweep_dirs):
        if not root.exists():
            raise PlanError(f"sweep directory {str(root)!r} does not exist")
        for p in sorted(root.rglob("run.json")):
            if other_node_part(p):   # node K's part of a torchrun job beside node 0's record: no run
                continue
            try:
                runs.append((p, json.loads(p.read_text())))
            except (OSError, json.JSONDecodeError) as exc:
                runs.append((p, {"status": "unreadable", "error": str(exc)}))
    if not runs:
        raise PlanError(f"no run.json under {', '.join(repr(str(d)) for d in as_dirs(sweep_dirs))}")
    return runs


def _pipeline_microbatches(run: dict) -> int | None:
    par = run.get("parallel") or {}
    for key in ("microbatches", "n_microbatches", "num_microbatches", "chunks"):
        if par.get(key):
            return int(par[key])
    pipe = run.get("pipeline") or {}
    for key in ("n_microbatches", "microbatches", "chunks"):
        if pipe.get(key):
            return int(pipe[key])
    return None


def model_from_run(run: dict) -> ModelSpec:
    m = run.get("model") or {}
    kind = m.get("kind", "gpt")
    try:
        n = int(m["n_params"])
        layers = int(m.get("n_layers") or 1)
        hidden = int(m.get("d_model") or m.get("hidden") or (1 if kind == "mlp" else None))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"run.json model lacks n_params/n_layers/d_model: {m}") from exc
    if kind == "mlp":
        return ModelSpec(n, layers, hidden, 1, int(m.get("vocab_size") or 1), 1, kind="mlp")
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    arch = (cfg.get("model") or {}).get("arch") or {}            # the run's resolved model config
    dropout = float(arch.get("dropout") or m.get("dropout") or 0.0)
    cpu = (run.get("hardware") or {}).get("accelerator") == "cpu"
    attention = m.get("attention") or sdpa_kernel("cpu" if cpu else "gpu", dropout)
    return ModelSpec(n, layers, hidden, int(m.get("n_heads") or 1), int(m.get("vocab_size") or 1),
                     int(m.get("seq_len") or 1), int(m.get("ffn_hidden") or 0), kind="gpt",
                     attention=attention, dropout=dropout)


def optimizer_of_run(run: dict) -> str:
    """The run's optimizer for the planner: SGD with momentum 0 is stateless (torch allocates no
    momentum buffer; the plan counted 4 bytes per parameter, 1.5x a measured fp32 run's states)."""
    name = run.get("optimizer", "adam")
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    opt = ((cfg.get("optim") or {}).get("optimizer") or {}) if isinstance(cfg.get("optim"), dict) else {}
    # a config block without the key: torch's default, 0 (`~optim.optimizer.momentum`)
    if name == "sgd" and isinstance(opt, dict) and opt and not opt.get("momentum"):
        return SGD_NO_MOMENTUM
    return name


def terms_from_run(run: dict) -> Terms:
    """The planner's view of a measured run (same code path as `scalelab plan`)."""
    name = run.get("strategy")
    options = ((run.get("config") or {}).get("strategy") or {}) if isinstance(run.get("config"), dict) else {}
    strategy = get_strategy(str(name), options)   # the run's own resolved strategy config wins
    par = run.get("parallel") or {}
    tp, pp = int(par.get("tp") or 1), int(par.get("pp") or 1)
    micro = int(run["per_device_batch_size"])
    accum = int(run.get("accumulate_grad_batches") or 1)
    m = accum
    if strategy.pipeline:
        # The per-rank batch is cut into pipeline micro-batches (notes/cpu-strategies.md: 4).
        chunks = _pipeline_microbatches(run) or 4
        if micro % chunks == 0:
            micro, m = micro // chunks, accum * chunks
    hw = run.get("hardware") or {}
    # Model what one rank does: `micro` samples per forward/backward, m of them per optimizer step
    # (the global batch follows as dp x micro x m).
    terms = build_terms(
        model_from_run(run), strategy, devices=int(run.get("devices_per_node") or run["world_size"]),
        nodes=int(run.get("num_nodes") or 1), tp=tp, pp=pp, micro_batch=micro, micro_batches=m,
        precision=run.get("precision", "32"), optimizer=optimizer_of_run(run),
        activation_checkpointing=run.get("activation_checkpointing") or "none",  # older records: a bool
        # a CPU rank's threads are its device; a GPU rank's host threads are not (step_time.rank_threads)
        threads=int(hw.get("threads_per_rank") or 1) if hw.get("accelerator") == "cpu" else None,
        # scalelab's tp/fsdp_tp/nd shard the LayerNorm regions only with strategy.sequence_parallel
        sequence_parallel=bool(par.get("sequence_parallel", options.get("sequence_parallel", False))),
        device="cpu" if hw.get("accelerator") == "cpu" else "gpu")
    mem = run.get("memory")
    if isinstance(mem, dict) and not mem.get("grads_freed_after_step") and strategy.family != "deepspeed" \
            and not strategy.pipeline:
        # measured with the gradients alive through the forward: Lightning's own order (records
        # from before LitModule freed them after the step; DeepSpeed's engine always freed its
        # own in its step). A pipeline's are decided by its layout: at dp 1 zeroed before its
        # schedule, at dp > 1 kept as DDP's buckets (model_states.pipeline_acts_alive_at_grads)
        terms = replace(terms, states=replace(terms.states, grads_at_peak=True))
    return terms


def measured(run: dict) -> dict:
    mem = run.get("memory") or {}
    ms = mem.get("model_state_bytes_per_rank") or []
    rss = mem.get("peak_rss_bytes_per_rank") or []
    return {"step_s": float((run.get("step_time_s") or {}).get("median") or 0.0),
            "model_states_bytes": max(ms) if ms else None,
            "peak_rss_bytes": max(rss) if rss else None}


def model_bytes_in_ram(terms: Terms) -> float:
    """What the planner puts in a CPU rank's RAM besides the runtime: model states (offloaded ones
    too: on CPU, host and device are one RAM), activations and communication buffers."""
    st = terms.states
    return peak_states_and_activations(terms) + st.offloaded_bytes + st.resident_buffer_bytes(cpu=True)


def predicted_rss(terms: Terms, hw: Hardware) -> float:
    """A CPU rank's peak RSS as the planner predicts it: model_bytes_in_ram plus the runtime's."""
    return model_bytes_in_ram(terms) + hw.runtime_memory_bytes


def gpu_run(run: dict) -> bool:
    """Whether a run.json is a GPU run's (its host RSS is not what the planner's memory is for, its
    device peak is)."""
    return (run.get("hardware") or {}).get("accelerator") not in (None, "cpu")


def runtime_bytes_from_rss(runs) -> tuple[float, int] | None:
    """A CPU rank's runtime memory (interpreter, torch, Lightning, DeepSpeed): median over the CPU
    runs of peak RSS minus model_bytes_in_ram, and how many runs that is. None without CPU runs:
    a GPU run's RSS is host memory, not the device memory runtime_memory_bytes stands for."""
    extra = []
    for _, run, terms in runs:
        rss = measured(run)["peak_rss_bytes"]
        if rss and (run.get("hardware") or {}).get("accelerator") == "cpu":
            extra.append(rss - model_bytes_in_ram(terms))
    return (float(np.median(extra)), len(extra)) if extra else None


def speed_factor(run: dict, terms: Terms, hw: Hardware) -> float:
    """How fast the host ran during this run relative to the profile's reference: the matmul
    probe (run.json `host_speed`, measured by every rank at the start and end of training), as
    smoothed by `smooth_host_speeds`, over the profile's fp32 peak for its threads. Step times
    are predicted at the reference speed and divided by this. 1 for runs without a probe (GPU
    runs; records from before the probe)."""
    flops = run.get("_host_flops_smoothed") or (run.get("host_speed") or {}).get("flops")
    if not flops or hw.kind != "cpu":   # a host matmul probe says nothing of a GPU's speed
        return 1.0
    return float(flops) / (hw.peak("fp32") * rank_threads(terms, hw) / hw.threads_per_device)


def smooth_host_speeds(runs: list[tuple[Path, dict, Terms]], window: int = SPEED_WINDOW) -> None:
    """Give each run the median probe of the runs of its sweep within `window` jobs of it (job
    numbers are launch order), in run["_host_flops_smoothed"]; window 0 keeps each run's own.

    Why: one probe is 0.2 s of matmuls per rank, a run's step time a median over ~20 steps; on
    this VM the probe is the noisier of the two (measured in outputs/plan_validation: ddp gpt_mini
    took 0.115 / 0.130 / 0.121 s in three seeds while their probes read 0.75 / 0.99 / 0.72 of
    reference). The host's drift it is there to catch is slow (tens of % over an hour), so the
    median over neighbouring jobs keeps the drift and drops the probe's own noise."""
    if window <= 0:
        return
    by_sweep: dict[tuple, list[tuple[int, dict]]] = {}
    for path, run, terms in runs:
        job = run.get("job") or {}
        flops = (run.get("host_speed") or {}).get("flops")
        # Multirun jobs only (a plain run has no sweep_dir, and its num says nothing of time);
        # probes of different thread counts measure different things.
        if flops and job.get("sweep_dir") and job.get("num") is not None:
            key = (str(job["sweep_dir"]), terms.threads)
            by_sweep.setdefault(key, []).append((int(job["num"]), run))
    for members in by_sweep.values():
        for num, run in members:
            near = [r["host_speed"]["flops"] for n, r in members if abs(n - num) <= window]
            run["_host_flops_smoothed"] = float(np.median(near))


def _skip_reason(run: dict) -> str | None:
    """Why a run's step time cannot be fitted or judged, or None."""
    if run.get("status") != "completed":
        error = str(run.get("error") or "").strip().splitlines()
        return f"status {run.get('status')!r}" + (f": {error[0][:80]}" if error else "")
    if measured(run)["step_s"] <= 0:
        return "no step_time_s.median"
    steps = (run.get("step_time_s") or {}).get("measured_steps")
    if run.get("short_run") or (steps is not None and int(steps) < MIN_MEASURED_STEPS):
        # its median is over a few steps right after the warm-up ones (a 3x slower first step
        # made it 3x the steady step): not a steady-state figure to fit or judge the model by
        return (f"short run: {steps if steps is not None else 'too few'} measured step(s), fewer than "
                f"{MIN_MEASURED_STEPS}: its median is not a steady-state step time")
    return None


def usable_runs(sweep_dir, speed_window: int = SPEED_WINDOW
                ) -> tuple[list[tuple[Path, dict, Terms]], list[tuple[Path, str]]]:
    """The runs whose step time the planner can be fitted to or judged by, and the others with
    the reason; PlanError when none is usable (a report of 0 runs passed any --tolerance)."""
    ok, skipped = [], []
    for path, run in find_runs(sweep_dir):
        reason = _skip_reason(run)
        if reason:
            skipped.append((path, reason))
            continue
        try:
            ok.append((path, run, terms_from_run(run)))
        except (PlanError, KeyError, TypeError, ValueError) as exc:
            skipped.append((path, str(exc)))
    if not ok:
        counts = collections.Counter(reason for _, reason in skipped)
        why = "; ".join(f"{r} x{n}" if n > 1 else r for r, n in list(counts.items())[:3])
        more = f"; {len(counts) - 3} other reasons" if len(counts) > 3 else ""
        raise PlanError(f"no usable run under {', '.join(map(str, as_dirs(sweep_dir)))}: "
                        f"{len(skipped)} skipped ({why}{more})")
    smooth_host_speeds(ok, speed_window)
    return ok, skipped


def accelerator_kind(run: dict) -> str | None:
    """"cpu" or "gpu" as a profile's `kind` says it, from run.json hardware.accelerator (None: not recorded)."""
    acc = (run.get("hardware") or {}).get("accelerator")
    return None if not acc else ("cpu" if acc == "cpu" else "gpu")


def check_accelerators(runs, hw: Hardware, what: str) -> None:
    """One PlanError line when a run ran on another kind of device than the profile describes:
    GPU runs calibrated without --hardware fitted this_cpu's rates to them (rms error 3688) and
    wrote the result over this_cpu_calibrated.yaml."""
    other = [path for path, run, _ in runs if accelerator_kind(run) not in (None, hw.kind)]
    if other:
        kind = "GPU" if hw.kind == "cpu" else "CPU"
        raise PlanError(f"{what}: {len(other)} of {len(runs)} runs ran on {kind} (e.g. {other[0].parent}) but "
                        f"profile {hw.name!r} is a {hw.kind.upper()} profile; give --hardware a {kind} profile"
                        f" or only {hw.kind.upper()} sweeps")
