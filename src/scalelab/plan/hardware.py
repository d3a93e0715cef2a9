"""Hardware profiles (conf/hardware/*.yaml) and the CPU probe behind `this_cpu` (this host, cached).

A profile describes one device and its links. Keys (all plain YAML, SI units):
  name, note, devices_per_node, threads_per_device (CPU: a "device" is a rank of N threads)
  peak_flops {fp32, bf16, fp16}       dense matmul FLOP/s of one device
  compute_efficiency                  fraction of peak reached on the model's FLOPs (fitted by --calibrate)
  compute_efficiency_by {"fp32@2": x}  per compute dtype @ threads per device, where measured (CPU:
                                      threads do not scale linearly; a dtype may lack fast kernels)
  busy_slowdown {"2": f}              while N devices of a node run at once, each one's step takes f
                                      times as long as alone (CPU ranks share caches, memory
                                      bandwidth and the host's cores; about 1 for GPUs; fitted)
  memory_bytes, runtime_memory_bytes  device memory; what the runtime takes before the model (CUDA
                                      context / the Python+torch process)
  memory_bandwidth_bytes_per_s        drives the optimizer step (memory-bound)
  activation_bandwidth_bytes_per_s    stored activation bytes per second that forward + backward's
                                      memory-bound elementwise ops get through (each byte is
                                      written, read, and its gradient written and read: about a
                                      quarter of memory bandwidth, the default when 0; fitted)
  intra_node / inter_node {bandwidth_bytes_per_s, latency_s}   collective bus bandwidth (nccl-tests
                                      "busbw") per device and per-hop latency
  collectives {kind: {bandwidth_bytes_per_s, latency_s}}   optional intra-node figures per collective
                                      kind (all_reduce, all_gather, reduce_scatter, p2p, and
                                      "<op>@deepspeed" for ZeRO's own code paths): each has its own
                                      algorithm (gloo has no native reduce-scatter), so nccl-tests
                                      reports a busbw per collective too
  host {link_bandwidth_bytes_per_s, memory_bandwidth_bytes_per_s}   a GPU's PCIe link, and the whole
                                      node's host RAM bandwidth, which its ranks' offloaded optimizer
                                      steps share (step_time._host_optimizer_bytes)
  host.memory_bytes, host.runtime_bytes_per_rank   GPU: a node's RAM, and what one rank's process
                                      holds there besides offloaded states (peak_memory.fits_host)
  bubble_scale                        pipeline idle time as a fraction of the textbook bubble
                                      (p-1)/m x compute (1 by default; fitted on CPU: 0 on this
                                      VM, where per-micro-batch costs explain the idle time)
  comm_overlap                        fraction of bucketed gradient/prefetch comm hidden behind compute
  step_overhead_s, strategy_overhead_s {name: s}   per-step framework cost (fitted by --calibrate)
  strategy_host_layer_s {name: s}     GPU: the host's time per layer x micro-batch to issue a
                                      strategy's step; the step is at least that (host-bound)
  strategy_layer_overhead_s {name: s} a strategy's extra cost per layer x micro-batch (DTensor
                                      dispatch for tp, FSDP's per-unit hooks; fitted)
  micro_batch_overhead_s, layer_overhead_s   per micro-batch and per layer x micro-batch (Python,
                                      op dispatch); matter for tiny models only (fitted)
  cost_per_device_hour, power_watts
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field, asdict
from pathlib import Path

import yaml

from .spec import PlanError, conf_dir


@dataclass
class Link:
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass
class Hardware:
    name: str
    peak_flops: dict
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    intra_node: Link
    inter_node: Link
    devices_per_node: int = 8
    threads_per_device: int = 1
    compute_efficiency: float = 0.5
    compute_efficiency_by: dict = field(default_factory=dict)   # "fp32@2" -> dtype at N threads/device
    activation_bandwidth_bytes_per_s: float = 0.0  # 0: memory_bandwidth_bytes_per_s / 4
    busy_slowdown: dict = field(default_factory=dict)  # "N busy devices per node" -> factor
    bubble_scale: float = 1.0       # pipeline idle time / the textbook (p-1)/m x compute (fitted)
    comm_overlap: float = 0.0
    step_overhead_s: float = 0.0
    micro_batch_overhead_s: float = 0.0      # per forward/backward of a micro-batch
    layer_overhead_s: float = 0.0            # per layer per micro-batch (op dispatch)
    strategy_overhead_s: dict = field(default_factory=dict)
    strategy_layer_overhead_s: dict = field(default_factory=dict)
    strategy_host_layer_s: dict = field(default_factory=dict)   # host floor: a step >= this x layers x micro-batches
    collectives: dict = field(default_factory=dict)    # op -> Link as a dict (intra-node, measured)
    runtime_memory_bytes: float = 0.0
    kind: str = "gpu"               # "cpu": a device is a rank in host RAM (RSS counts written pages only)
    host: dict = field(default_factory=lambda: {"link_bandwidth_bytes_per_s": 25e9,
                                                "memory_bandwidth_bytes_per_s": 50e9})
    cost_per_device_hour: float = 0.0
    power_watts: float = 0.0
    note: str = ""
    calibration: dict | None = None
    source: str = ""

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise PlanError(f"hardware {self.name!r} has no peak_flops.{dtype}; "
                            f"has: {', '.join(self.peak_flops)}")
        return float(self.peak_flops[dtype])

    def efficiency(self, dtype: str, threads: int | None = None) -> float:
        return float(self.compute_efficiency_by.get(f"{dtype}@{threads or self.threads_per_device}",
                                                    self.compute_efficiency))

    def slowdown(self, busy_devices: int) -> float:
        """How much longer everything a device does takes while `busy_devices` of its node work
        at once (1 for a device alone, and where the profile does not say)."""
        return float(self.busy_slowdown.get(str(busy_devices), 1.0)) if busy_devices > 1 else 1.0

    @property
    def activation_bandwidth(self) -> float:
        return self.activation_bandwidth_bytes_per_s or self.memory_bandwidth_bytes_per_s / 4

    def collective_key(self, kind: str | None) -> str | None:
        """The `collectives` entry for a collective kind ("reduce_scatter@deepspeed" falls back to
        "reduce_scatter"), or None: the generic intra_node link."""
        for key in (kind, (kind or "").split("@")[0]):
            if key and key in self.collectives:
                return key
        return None

    def link(self, crosses_nodes: bool, kind: str | None = None) -> Link:
        if crosses_nodes:
            return self.inter_node
        key = self.collective_key(kind)
        if key is None:
            return self.intra_node
        d = self.collectives[key]
        return Link(float(d["bandwidth_bytes_per_s"]), float(d.get("latency_s", 0.0)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        if d["calibration"] is None:
            d.pop("calibration")
        return d


def list_hardware() -> list[str]:
    d = conf_dir() / "hardware"
    return sorted({HOST_CPU, *(p.stem for p in d.glob("*.yaml"))}) if d.is_dir() else [HOST_CPU]


def trainer_name(hw: Hardware) -> str | None:
    """The name scalelab-train's hardware_profile= knows this profile by (conf/hardware/NAME.yaml:
    its file's stem; this host's probe: this_cpu), or None for a profile read from a path elsewhere:
    no trainer choice (a calibrated copy keeping `name: h100_sxm` would name the stock profile)."""
    p = Path(hw.source)
    if p.parent.resolve() == (conf_dir() / "hardware").resolve():
        return p.stem
    if hw.name == HOST_CPU and p.name.startswith(f"{HOST_CPU}-") and p.parent.name == "hardware":
        return HOST_CPU
    return None


def _number(value, key: str, source: str, positive: bool = False) -> float:
    """A profile's figure as a float, or one PlanError line naming the key and value: `memory_bytes:
    80GB` was a ValueError traceback, `compute_efficiency: 0` a ZeroDivisionError, `memory_bytes: -1`
    a plan that "does not fit ... of -1 B". Rates and sizes > 0; overheads, latencies >= 0; .inf
    is a number (--calibrate writes it for a rate whose time term it fitted to 0)."""
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if math.isnan(x) or (x <= 0 if positive else x < 0):
        raise PlanError(f"hardware profile {source!r}: {key} must be a number {'> 0' if positive else '>= 0'}, "
                        f"got {value!r}")
    return x


def _mapping(value, key: str, source: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanError(f"hardware profile {source!r}: {key} must be a mapping (key: value lines), got {value!r}")
    return value


def _link(d: dict | None, what: str, source: str) -> Link:
    if not isinstance(d, dict) or "bandwidth_bytes_per_s" not in d:
        raise PlanError(f"hardware profile {source!r} lacks {what}.bandwidth_bytes_per_s")
    return Link(_number(d["bandwidth_bytes_per_s"], f"{what}.bandwidth_bytes_per_s", source, positive=True),
                _number(d.get("latency_s", 0.0), f"{what}.latency_s", source))


# what a profile's figure must be: a rate, size or fraction the model divides by (> 0), else >= 0
_POSITIVE = ("memory_bytes", "memory_bandwidth_bytes_per_s", "compute_efficiency")
_NON_NEGATIVE = ("activation_bandwidth_bytes_per_s", "bubble_scale", "comm_overlap", "step_overhead_s",
                 "micro_batch_overhead_s", "layer_overhead_s", "runtime_memory_bytes", "cost_per_device_hour",
                 "power_watts")
_HOST_POSITIVE = ("link_bandwidth_bytes_per_s", "memory_bandwidth_bytes_per_s")


def parse_hardware(d: dict, source: str = "") -> Hardware:
    """Build a Hardware from a YAML mapping; unknown keys are ignored (room for notes)."""
    if not isinstance(d, dict):
        raise PlanError(f"hardware profile {source!r} is not a YAML mapping")
    missing = [k for k in ("name", "peak_flops", "memory_bytes", "memory_bandwidth_bytes_per_s",
                           "intra_node") if k not in d]
    if missing:
        raise PlanError(f"hardware profile {source!r} lacks {', '.join(missing)}")
    intra = _link(d["intra_node"], "intra_node", source)
    inter = _link(d.get("inter_node", d["intra_node"]), "inter_node", source)
    known = {f for f in Hardware.__dataclass_fields__} - {"intra_node", "inter_node", "source"}
    kw = {k: v for k, v in d.items() if k in known}
    kw["peak_flops"] = {k: _number(v, f"peak_flops.{k}", source, positive=True)
                        for k, v in _mapping(d["peak_flops"], "peak_flops", source).items()}
    for k in _POSITIVE + _NON_NEGATIVE:
        if k in kw:
            kw[k] = _number(kw[k], k, source, positive=k in _POSITIVE)
    for k in ("devices_per_node", "threads_per_device"):
        if k in kw and not (isinstance(kw[k], int) and not isinstance(kw[k], bool) and kw[k] >= 1):
            raise PlanError(f"hardware profile {source!r}: {k} must be a whole number >= 1, got {kw[k]!r}")
    if "host" in d:
        host = dict(_mapping(d["host"], "host", source))
        missing = [k for k in _HOST_POSITIVE if k not in host]
        if missing:   # it was filled with the default, 50e9 for a whole GPU node: offload planned ~7x slow
            raise PlanError(f"hardware profile {source!r}: host lacks {', '.join(missing)} (the PCIe link per "
                            "device; the node's host RAM bandwidth, which its ranks' offloaded optimizer steps share)")
        for k, v in host.items():
            if k in _HOST_POSITIVE or (v is not None and (k.endswith("_bytes") or k.endswith("_per_rank"))):
                host[k] = _number(v, f"host.{k}", source, positive=k in _HOST_POSITIVE)
        kw["host"] = host

    def numbers(key: str, positive: bool = False) -> dict:
        return {str(k): _number(v, f"{key}.{k}", source, positive)
                for k, v in _mapping(d.get(key), key, source).items()}
    kw["strategy_overhead_s"] = numbers("strategy_overhead_s")
    kw["strategy_layer_overhead_s"] = numbers("strategy_layer_overhead_s")
    # profiles written before `kind` existed: this host's probe (and its calibrations) is a CPU
    kw["kind"] = str(d.get("kind") or ("cpu" if str(d["name"]).startswith("this_cpu") else "gpu"))
    kw["strategy_host_layer_s"] = numbers("strategy_host_layer_s")
    kw["collectives"] = {}
    for op, v in _mapping(d.get("collectives"), "collectives", source).items():
        link = _link(v, f"collectives.{op}", source)
        kw["collectives"][str(op)] = {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                                      "latency_s": link.latency_s}
    kw["compute_efficiency_by"] = numbers("compute_efficiency_by", positive=True)
    kw["busy_slowdown"] = numbers("busy_slowdown", positive=True)
    return Hardware(intra_node=intra, inter_node=inter, source=source, **kw)


# `this_cpu` is this host, always: a probe run once per host (CPU model, cores, machine, torch
# version) and cached, never a profile committed from another machine.
HOST_CPU = "this_cpu"


def _usable_cores() -> int:
    """The cores this process may use (a container's or SLURM allocation's), as the trainer's
    oversubscription warning counts them (launch.host_cores)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _host_key() -> str:
    import hashlib
    from importlib.metadata import version

    cores = _usable_cores()
    ident = f"{_cpu_name()}|{cores}|{platform.machine()}|torch {version('torch')}"
    return hashlib.sha1(ident.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """SCALELAB_CACHE, else ~/.cache/scalelab (conf/train.yaml's cache_dir default)."""
    return Path(os.environ.get("SCALELAB_CACHE") or Path.home() / ".cache" / "scalelab")


def host_cpu_profile_path(cache: str | Path | None = None) -> Path:
    return Path(cache or cache_dir()) / "hardware" / f"{HOST_CPU}-{_host_key()}.yaml"


def host_cpu_profile(cache: str | Path | None = None) -> Path:
    """This host's probed CPU profile, probing first if this host has none yet (~4 s, once).
    Written whole (temp file + rename): concurrent jobs may both probe, never read half a file."""
    path = host_cpu_profile_path(cache)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        probe_cpu(tmp)
        os.replace(tmp, path)
    return path


def load_hardware(name_or_path: str, cache: str | Path | None = None) -> Hardware:
    """A profile by name (conf/hardware/NAME.yaml; `this_cpu`: this host's cached probe) or by
    path to a .yaml file."""
    if name_or_path == HOST_CPU:
        name_or_path = str(host_cpu_profile(cache))
    p = Path(name_or_path)
    if not (p.suffix in (".yaml", ".yml") and p.is_file()):
        p = conf_dir() / "hardware" / f"{name_or_path}.yaml"
    if not p.is_file():
        raise PlanError(f"unknown hardware {name_or_path!r}; valid: "
                        f"{', '.join(list_hardware()) or '(none in ' + str(conf_dir() / 'hardware') + ')'}"
                        " or a path to a .yaml profile")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise PlanError(f"hardware profile {str(p)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    hw = parse_hardware(data, str(p))
    _warn_other_host(hw)
    return hw


_WARNED_HOSTS: set[str] = set()


def _warn_other_host(hw: Hardware) -> None:
    """One stderr line (once per profile and process) when a CPU profile calibrated on another
    host is used: its rates are that host's, as this_cpu's probe is keyed by _host_key."""
    key = (hw.calibration or {}).get("host_key") if isinstance(hw.calibration, dict) else None
    if not key or key == _host_key() or hw.source in _WARNED_HOSTS:
        return
    _WARNED_HOSTS.add(hw.source)
    print(f"warning: hardware profile {hw.source} was calibrated on another host "
          f"({hw.calibration.get('host') or key}): its rates may not hold here; "
          "calibrate again on this host (scalelab plan --calibrate SWEEP_DIR)", file=sys.stderr)


# the first line of a profile --probe wrote, and how that of one --calibrate wrote starts: what
# they may write over again (cli_measured._out), a profile someone wrote never
PROBE_HEADER = "# This CPU, measured by a matmul/copy probe (scalelab plan --probe). See `note`."
CALIBRATED_HEADER = "# Fitted by `scalelab plan --calibrate"


def save_hardware(hw: Hardware, path: str | Path, header: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(hw.to_dict(), sort_keys=False, default_flow_style=False, width=100)
    path.write_text((header.rstrip() + "\n" if header else "") + text)
    return path


# --------------------------------------------------------------------------------------------
# CPU probe
# --------------------------------------------------------------------------------------------
def _best_rate(fn, work: float, budget_s: float) -> float:
    """work / fastest of repeated calls: the machine's capability even if other processes take
    the core for part of the time (each call is a few ms to tens of ms)."""
    fn()                                               # warm-up (packing, thread pool, pages)
    best, t_end = float("inf"), time.perf_counter() + budget_s
    reps = 0
    while reps < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return work / best


def _matmul_rate(torch, dtype, n: int, budget_s: float) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return _best_rate(lambda: torch.mm(a, b), 2 * n ** 3, budget_s)


def _copy_bandwidth(torch, budget_s: float) -> float:
    src = torch.ones(16 * 2 ** 20)                     # 64 MiB: well beyond the caches
    dst = torch.empty_like(src)
    return _best_rate(lambda: dst.copy_(src), 2 * src.numel() * 4, budget_s)   # read + write


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine so far (/proc/stat), or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_cpu(out_path: str | Path | None = None, threads: int = 1, budget_s: float = 0.6) -> Hardware:
    """Measure this CPU with torch (one device = one rank of `threads` threads) and write a profile.

    fp32/bf16/fp16 matmul FLOP/s (fastest call; fp32 the best of n = 256, 512, 1024; 16-bit n = 256), a copy bandwidth for the
    optimizer step; links are the
    gloo-over-loopback figures of notes/perf-baseline.md until --calibrate fits them.
    """
    import resource
    import torch                                       # only the probe needs torch
    busy0, own0, t0 = _cpu_busy_s(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # Sizes: big enough for full-speed kernels, small enough (a few ms) that the fastest call
        # fits in one scheduler slice when other processes share the core.
        # The fastest of three sizes: kernels peak at different sizes on different CPUs (an
        # efficiency > 1 after --calibrate would mean this peak was not one).
        peak = {"fp32": max(_matmul_rate(torch, torch.float32, n, budget_s) for n in (256, 512, 1024)),
                "bf16": _matmul_rate(torch, torch.bfloat16, 256, budget_s),
                "fp16": _matmul_rate(torch, torch.float16, 256, budget_s)}
        mem_bw = _copy_bandwidth(torch, budget_s)
    finally:
        torch.set_num_threads(prev)
    # CPU time other processes used meanwhile (in cores): 0 means the probe had the machine.
    own1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    own = (own1.ru_utime + own1.ru_stime) - (own0.ru_utime + own0.ru_stime)
    others = max(0.0, (_cpu_busy_s() - busy0 - own) / wall) if busy0 is not None else None
    cores = _usable_cores()   # as the host key counts them; a device is a rank of `threads` of them
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 8 * 2 ** 30
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load = ("other processes used unknown CPU meanwhile" if others is None else
            f"other processes used {others:.2f} cores meanwhile"
            + (" (rerun on an idle machine)" if others > 0.2 else ""))
    hw = Hardware(
        name="this_cpu", kind="cpu", peak_flops={k: round(v, -6) for k, v in peak.items()},
        memory_bytes=float(ram // cores), memory_bandwidth_bytes_per_s=round(mem_bw, -6),
        intra_node=Link(1.3e9, 1.0e-4), inter_node=Link(1.25e8, 1.0e-4),
        devices_per_node=max(1, cores // threads), threads_per_device=threads, compute_efficiency=0.6,
        comm_overlap=0.0, step_overhead_s=0.003, runtime_memory_bytes=350e6,
        host={"link_bandwidth_bytes_per_s": round(mem_bw, -6),
              "memory_bandwidth_bytes_per_s": round(mem_bw, -6)},
        cost_per_device_hour=0.02, power_watts=10.0,
        note=(f"Measured by `scalelab plan --probe` on {when}: {_cpu_name()}, {cores} cores, "
              f"torch {torch.__version__}, {threads} thread(s) per device, {load}; peak_flops = "
              f"fastest torch.mm of n=256/512/1024 (bf16/fp16 n=256), memory bandwidth = fastest 64 MiB copy. "
              f"A device is one rank of {threads} thread(s); memory_bytes = RAM / cores. "
              "Links: gloo all_reduce over "
              "loopback, 1.1-1.6 GB/s (notes/perf-baseline.md); gloo does not overlap comm with "
              "backward (comm_overlap 0). compute_efficiency, overheads, links: rerun "
              "`scalelab plan --calibrate SWEEP_DIR` to fit them. Cost and power are assumptions "
              "(a cloud vCPU-hour, a core's share of a server's power)."))
    if out_path is not None:
        save_hardware(hw, out_path, header=PROBE_HEADER)
    return hw


def devices_per_node_warning(devices_per_node: int, hw: Hardware) -> str | None:
    """A plan (or recommend's search) for more devices per node than a node of the profile has (this_cpu:
    cores) predicts devices it does not have: 8 CPU ranks on 2 cores were planned at 142k tokens/s,
    measured 14k. One wording for `plan` and `recommend`; None when the node has them."""
    if devices_per_node <= hw.devices_per_node:
        return None
    what = "cores (a CPU device is a rank of its own core)" if hw.kind == "cpu" else "devices"
    return (f"{devices_per_node} devices per node, but a {hw.name} node has {hw.devices_per_node} {what}: "
            "the figures are for devices it does not have")
