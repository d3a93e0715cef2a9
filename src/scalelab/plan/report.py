"""Text rendering of `scalelab plan` documents: one plan, a row per strategy, the layouts that fit."""
from __future__ import annotations

from pathlib import Path

from .peak_memory import HEADROOM, tight


def _calls(n: float) -> str:
    """Calls per step: a count, or a mean to 2 decimals (ZeRO-3's fetches of layers not kept
    gathered: 2.82653 printed as 6 digits of a guess)."""
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.2f}"


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    s = float(f"{s:.3g}")   # rounded first: 999.6 ms is "1 s", not "1e+03 ms"
    for unit, div in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= div:
            return f"{s / div:.3g} {unit}"
    return "0 s" if s == 0 else f"{s / 1e-9:.3g} ns"   # below a nanosecond: still in the line's units


def _si(x: float) -> str:
    x = float(f"{x:.3g}")   # rounded first: 999.6k is "1M", not "1e+03k" (review)
    for unit, div in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _opt_str(x) -> str:
    return "-" if x is None else str(x)


def _opt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def _print_table(header, rows) -> None:
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    print("  ".join(str(h).ljust(n) for h, n in zip(header, w)))
    print("  ".join("-" * n for n in w))
    for r in rows:
        print("  ".join(str(x).ljust(n) for x, n in zip(r, w)))


def render(doc: dict) -> str:
    i, p, mem, t = doc["inputs"], doc["inputs"]["parallel"], doc["memory"], doc["time"]
    md = i["model"]
    out = [f"plan: {i['strategy']} on {p['world_size']} x {i['hardware']} ({p['nodes']} node(s) x "
           f"{p['devices_per_node']}), dp={p['dp']} tp={p['tp']} pp={p['pp']}"
           + (" +sequence-parallel" if p["sequence_parallel"] else ""),
           f"model: {_si(md['n_params'])} params ({md['n_layers']} layers, hidden {md['hidden']}, "
           f"{md['heads']} heads, vocab {md['vocab']}, seq {md['seq_len']}"
           + (f", shape guessed from --params: {md['n_params']:,} exactly" if md["shape_inferred"] else "")
           + f", {md.get('attention', 'flash')} attention"
           + (f", dropout {md['dropout']:g}" if md.get("dropout") else "") + f"), "
           f"{i['precision']}, {i['optimizer']}, activation checkpointing {i['activation_checkpointing']}",
           f"batch: micro {p['micro_batch']} x dp {p['dp']} x {p['micro_batches_per_step']} micro-batches"
           f" = global {p['global_batch']} ({p['global_batch'] * md['seq_len']:,} tokens/step)", ""]
    out.append("memory per device")
    for label, key in (("parameters", "parameters_bytes_per_device"),
                       ("gradients", "gradients_bytes_per_device"),
                       ("optimizer states", "optimizer_bytes_per_device"),
                       ("= model states", "model_states_bytes_per_device"),
                       ("activations", "activations_bytes_per_device"),
                       ("buffers (gathered layers, buckets)", "buffers_bytes_per_device"),
                       ("runtime (context / process)", "runtime_bytes_per_device")):
        out.append(f"  {label:<36}{fmt_bytes(mem[key]):>12}")
    early = mem.get("activations_alive_at_gradients") or 0.0
    if mem.get("gradients_at_peak") is False and early:
        # the total is then near their sum: "the larger of" was printed beside a total that added them
        out.append(f"  (the gradient partition is allocated early in backward, when the first reduce bucket fills: "
                   f"the peak holds it beside {early:.0%} of the activations)")
    elif mem.get("gradients_at_peak") is False:
        out.append("  (gradients freed after each step: the peak holds the larger of gradients and activations)")
    if mem.get("zero3_kept_gathered_params"):
        out.append(f"  (ZeRO-3 keeps {_si(mem['zero3_kept_gathered_params'])} gathered parameters from forward to "
                   "backward: stage3_max_reuse_distance / prefetch_bucket_size; counted in buffers)")
    verdict = "fits" if mem["total_bytes_per_device"] <= mem["device_memory_bytes"] else "DOES NOT FIT"
    if verdict == "fits" and _tight(mem):   # (recommend prunes it: a 99 % fit is an OOM in practice)
        free = 1 - mem["total_bytes_per_device"] / mem["device_memory_bytes"]
        verdict = (f"fits, tight: {free:.1%} free, under the {HEADROOM:.0%} scalelab recommend keeps free "
                   "(allocator slack, fragmentation)")
    out.append(f"  {'total':<36}{fmt_bytes(mem['total_bytes_per_device']):>12}  of "
               f"{fmt_bytes(mem['device_memory_bytes'])} -> {verdict}")
    if mem["offloaded_bytes_per_device"]:
        out.append(f"  {'offloaded to host memory':<36}{fmt_bytes(mem['offloaded_bytes_per_device']):>12}")
    if mem.get("host_bytes_per_node") and mem.get("host_memory_bytes"):
        out.append(f"  {'host memory per node':<36}{fmt_bytes(mem['host_bytes_per_node']):>12}  of "
                   f"{fmt_bytes(mem['host_memory_bytes'])} -> {'fits' if mem['fits_host'] else 'DOES NOT FIT'}")
    out += ["", "communication per step per device"]
    for c in doc["comm"]["collectives"]:
        out.append(f"  {c['name']:<30} {c['op']:<15} group {c['group']}={c['group_size']:<4} "
                   f"{_calls(c['calls']):>7} calls {fmt_bytes(c['bytes_per_step_per_device']):>12}"
                   + ("  inter-node" if c["crosses_nodes"] else ""))
    if not doc["comm"]["collectives"]:
        out.append("  none")
    out.append(f"  {'total sent (device links)':<36}{fmt_bytes(doc['comm']['bytes_per_step_per_device']):>12}")
    out += ["", f"step time {fmt_time(t['step_s'])} = compute {fmt_time(t['compute_s'])} + bubble "
            f"{fmt_time(t['bubble_s'])} + exposed comm {fmt_time(t['comm_exposed_s'])} (of "
            f"{fmt_time(t['comm_total_s'])}) + optimizer {fmt_time(t['optimizer_s'])} + overhead "
            f"{fmt_time(t['overhead_s'])}",
            f"FLOPs per step {_si(doc['flops']['model_per_step'])} (model), "
            f"{_si(doc['flops']['hardware_per_step_per_device'])} executed per device",
            f"throughput {_si(doc['throughput']['tokens_per_s'])} tokens/s, "
            f"{_si(doc['throughput']['samples_per_s'])} samples/s; MFU {doc['mfu']:.1%}; "
            + _efficiency(doc)]
    if doc.get("train_command"):
        out.append(f"the same job: {doc['train_command']}")
    elif doc.get("train_command_note"):
        out.append(doc["train_command_note"])
    if doc["train"]:
        tr = doc["train"]
        out.append(f"train {_si(tr['tokens'])} tokens: {fmt_time(tr['time_s'])}, "
                   f"{tr['device_hours']:,.0f} device-hours, cost {tr['cost']:,.0f} (the profile's "
                   f"cost_per_device_hour x device-hours), "
                   f"energy {tr['energy_kwh']:,.0f} kWh")
    return "\n".join(out)


# The planner's efficiency (step_time.baseline): the same micro-batch per data-parallel replica on
# fewer devices. Weak scaling when the global batch grows with dp (TP ranks share a sample); strong
# (the same global batch) when the job's dp is 1, as tp and pipeline at dp 1 (a sweep's kinds).
WEAK = "weak-scaling efficiency (same micro-batch per data-parallel replica)"
STRONG = "strong-scaling efficiency (same global batch)"


def _kind(doc: dict) -> str:
    return STRONG if doc.get("scaling_kind") == "strong" else WEAK


def _efficiency(doc: dict) -> str:
    base = doc.get("baseline") or {}
    if doc.get("scaling_efficiency") is None:
        return f"{_kind(doc)}: none ({base.get('what', 'no baseline')})"
    at = f" at global batch {base['global_batch']}" if base.get("global_batch") else ""
    return f"{_kind(doc)} {doc['scaling_efficiency']:.1%} vs {base['what']}{at}"


def _tight(mem: dict) -> bool:
    """Fits with less than HEADROOM of device memory free."""
    return tight(mem["total_bytes_per_device"], mem.get("device_memory_bytes") or 0)


def tight_mark(total_bytes: float, mem: dict) -> str:
    """' (tight)' for a suggestion of `total_bytes` per device on the plan's devices (memory MEM)."""
    return " (tight)" if _tight({**mem, "total_bytes_per_device": total_bytes}) else ""


def render_rows(docs: list[dict]) -> str:
    """One row per plan (e.g. per strategy): the figures a choice is made by."""
    head = ["strategy", "devices", "dp", "tp", "pp", "micro x m", "memory/device", "fits", "step",
            "tokens/s", "MFU", "efficiency"]
    # --tokens: its time and cost per row (a single plan's report has them; the table dropped them)
    train = next((d["train"] for d in docs if d.get("train")), None)
    if train:
        head += [f"{_si(train['tokens'])} tokens", "cost"]
    rows = []
    for d in docs:
        if "refused" in d:        # a layout the trainer refuses: no figures, its reason under the table
            rows.append([d["inputs"]["strategy"], *["-"] * 6, "refused", *["-"] * (len(head) - 8)])
            continue
        p, m = d["inputs"]["parallel"], d["memory"]
        eff = d.get("scaling_efficiency")
        rows.append([d["inputs"]["strategy"], str(p["world_size"]), str(p["dp"]), str(p["tp"]), str(p["pp"]),
                     f"{p['micro_batch']} x {p['micro_batches_per_step']}", fmt_bytes(m["total_bytes_per_device"]),
                     ("tight" if _tight(m) else "yes") if m["fits"] else "NO", fmt_time(d["time"]["step_s"]),
                     _si(d["throughput"]["tokens_per_s"]), f"{d['mfu']:.1%}",
                     "-" if eff is None else f"{eff:.1%}" + (" (strong)" if d.get("scaling_kind") == "strong" else "")]
                    + ([fmt_time(d["train"]["time_s"]), _cost(d["train"]["cost"])] if train else []))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    d0 = next(d["inputs"] for d in docs if "refused" not in d)
    return "\n".join([f"{d0['hardware']}, {d0['precision']}, {d0['optimizer']}, global batch "
                      f"{d0['parallel']['global_batch']}; efficiency: {WEAK} (strong: dp 1, same global "
                      "batch), vs the smallest layout that fits",
                      line(head), line(["-" * w for w in widths]), *map(line, rows)])


def _cost(x: float) -> str:
    """A cost in the profile's currency: whole units from 100 (12,157), 3 figures below (a CPU's 0.0212)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _split(a: dict) -> str:
    """A suggestion's batch split: every one keeps the asked global batch (plan/alternatives.py)."""
    what = "pipeline micro-batches" if a.get("pp", 1) > 1 else "accumulation"
    return f"micro-batch {a['micro_batch']} x {a['micro_batches']} {what}"


def render_alternatives(doc: dict, alternatives: list[dict]) -> str:
    m = doc["memory"]
    if m["total_bytes_per_device"] > m["device_memory_bytes"]:
        out = [f"does not fit: {fmt_bytes(m['total_bytes_per_device'])} per device of "
               f"{fmt_bytes(m['device_memory_bytes'])}"]
    else:   # the device holds it; the node's host memory does not hold the offloaded states
        out = [f"does not fit: {fmt_bytes(m['host_bytes_per_node'])} of host memory per node of "
               f"{fmt_bytes(m['host_memory_bytes'])} (offloaded states)"]
    if not alternatives:
        return "; ".join(out + ["no nearby layout fits (more devices, or a smaller model or sequence)"])
    out[0] += "; the nearest layouts that fit:"
    for a in alternatives:
        dp = f" x dp {a['dp']} = global batch {a['global_batch']}"
        change = f"{a['change']}{dp}" if "micro-batch" in a["change"] else f"{a['change']} ({_split(a)}{dp})"
        out.append(f"  {change}: {fmt_bytes(a['total_bytes'])} per device{tight_mark(a['total_bytes'], m)}, "
                   f"step {fmt_time(a['step_s'])}")
    return "\n".join(out)
