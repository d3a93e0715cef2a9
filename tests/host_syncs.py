"""Find the host<->device syncs of a training step on a machine without a GPU.

On CUDA a host read of a device value (`.item()`, `bool(t)`, `int(t)`, `float(t)`, `.tolist()`,
`.cpu()`, `.numpy()`, printing a tensor, `torch.equal`, an op whose output size depends on the
data such as `nonzero`) waits for every kernel queued before it: the device queue drains and the
device idles while the host prepares the next kernels. A plain training loop never does that, so
each such call per step is device time a platform loses against a hand-written loop.

`SyncDetector` sees them on CPU, where the same Python code runs:
- a `TorchDispatchMode` counts the aten ops that read a value back on CUDA
  (`_local_scalar_dense`: what `.item()`, `bool()`, `int()`, `float()`, `is_nonzero` and
  `allclose` end in; `equal`; `nonzero`, `masked_select`, `unique*`, boolean-mask indexing,
  `repeat_interleave` without output_size: data-dependent sizes);
- Python-level wrappers on `Tensor.tolist`, `Tensor.cpu`, `Tensor.numpy` (on a CPU tensor these
  never reach the dispatcher) and on `torch.cuda.synchronize`, `torch.cuda.Event.synchronize`,
  `torch.cuda.Stream.synchronize` (CUDA-only branches: seen only if code takes them on CPU).
Every hit keeps its Python stack and the step it happened in (`StepTagger`, a Lightning callback).

What it cannot see on CPU: a `.to("cpu")` / `copy_` of a device tensor into host memory (on CPU
the tensor is already there: no op is dispatched), and code that only runs when the device is
CUDA (`if device.type == "cuda": torch.cuda.synchronize()` is seen only through the wrappers
above, and only if the branch is taken). Those need reading the code (and unit tests with a fake
CUDA device, e.g. tests/unit/test_host_syncs.py). A hit on a tensor that stays on the host in a
GPU run too (a sampler's index tensor) is no device sync: the stack says which it is.
"""
from __future__ import annotations

import collections
import os
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read a device value back to the host on CUDA (sync the stream)
SYNC_OPS = {
    "aten::_local_scalar_dense": "value read (.item() / bool() / int() / float())",
    "aten::item": "value read (.item())",
    "aten::is_nonzero": "bool(tensor)",
    "aten::equal": "torch.equal",
    "aten::nonzero": "data-dependent size (nonzero)",
    "aten::nonzero_static": None,                      # static size: no sync
    "aten::masked_select": "data-dependent size (masked_select)",
    "aten::_unique": "data-dependent size (unique)",
    "aten::_unique2": "data-dependent size (unique)",
    "aten::unique_dim": "data-dependent size (unique)",
    "aten::unique_consecutive": "data-dependent size (unique_consecutive)",
    "aten::repeat_interleave": "data-dependent size (repeat_interleave without output_size)",
    # torch.tensor(data, device=cuda): a blocking host->device copy (copy_ without non_blocking
    # ends in a stream sync); seen here for any torch.tensor(data), the stack says which device
    "aten::lift_fresh": "torch.tensor(data): a blocking host->device copy if created on CUDA",
}
SRC = str(Path(__file__).resolve().parents[1] / "src" / "scalelab")
_HERE = os.path.abspath(__file__)


@dataclass
class Hit:
    what: str           # op or Python call
    why: str
    step: int           # optimizer step (1-based) whose batch was running; 0: before the first
    stack: list = field(repr=False)   # traceback.FrameSummary, outermost first

    def origin(self) -> str:
        """Who asked: the innermost frame outside torch (our code, Lightning, a test...)."""
        for f in reversed(self.stack):
            if f"{os.sep}torch{os.sep}" not in f.filename:
                return f"{_short(f.filename)}:{f.lineno} ({f.name})"
        return "torch"

    def ours(self) -> str | None:
        """The innermost frame in scalelab's own source, if any."""
        for f in reversed(self.stack):
            if f.filename.startswith(SRC):
                return f"{_short(f.filename)}:{f.lineno} ({f.name})"
        return None

    def where(self, depth: int = 8) -> str:
        return "\n".join(f"    {_short(f.filename)}:{f.lineno} {f.name}: {f.line}" for f in self.stack[-depth:])


def _short(path: str) -> str:
    for marker in ("site-packages" + os.sep, "src" + os.sep, "tests" + os.sep, "benchmarks" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1] if marker.startswith("site") else marker + path.split(marker, 1)[1]
    return path


def _stack() -> list:
    return [f for f in traceback.extract_stack()[:-2] if os.path.abspath(f.filename) != _HERE
            and "_python_dispatch" not in f.filename]


class _Mode(TorchDispatchMode):
    def __init__(self, detector: "SyncDetector"):
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        why = SYNC_OPS.get(name)
        if name == "aten::repeat_interleave" and kwargs.get("output_size") is not None:
            why = None
        if name == "aten::index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                         for i in (args[1] if len(args) > 1 else []) or []):
            why = "data-dependent size (boolean-mask indexing)"
        if why:
            self.detector.add(name.replace("::", "."), why)
        return func(*args, **kwargs)


class SyncDetector:
    """with SyncDetector() as d: ...; d.hits. `d.step` tags the hits (StepTagger sets it)."""

    PY_CALLS = [(torch.Tensor, "tolist", "Tensor.tolist (D2H copy on CUDA)"),
                (torch.Tensor, "cpu", "Tensor.cpu (D2H copy on CUDA)"),
                (torch.Tensor, "numpy", "Tensor.numpy (D2H on CUDA)"),
                (torch.cuda, "synchronize", "torch.cuda.synchronize"),
                (torch.cuda.Event, "synchronize", "cuda.Event.synchronize"),
                (torch.cuda.Stream, "synchronize", "cuda.Stream.synchronize")]

    def __init__(self):
        self.hits: list[Hit] = []
        self.step = 0
        self.enabled = True
        self._mode = _Mode(self)
        self._saved = []

    def add(self, what: str, why: str) -> None:
        if self.enabled:
            self.hits.append(Hit(what, why, self.step, _stack()))

    def _wrap(self, owner, attr, why):
        orig = getattr(owner, attr)
        det = self

        def wrapper(*a, **k):
            det.add(f"{getattr(owner, '__name__', owner)}.{attr}", why)
            return orig(*a, **k)

        self._saved.append((owner, attr, orig))
        setattr(owner, attr, wrapper)

    def __enter__(self):
        for owner, attr, why in self.PY_CALLS:
            self._wrap(owner, attr, why)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for owner, attr, orig in reversed(self._saved):
            setattr(owner, attr, orig)
        self._saved = []

    def per_step(self, first: int, last: int) -> dict[int, list[Hit]]:
        """Hits of each step in [first, last]."""
        out = {s: [] for s in range(first, last + 1)}
        for h in self.hits:
            if first <= h.step <= last:
                out[h.step].append(h)
        return out

    def report(self, first: int, last: int, depth: int = 8) -> str:
        steps = self.per_step(first, last)
        n = len(steps)
        by_origin = collections.Counter((h.what, h.origin(), h.ours()) for hs in steps.values() for h in hs)
        lines = [f"{sum(map(len, steps.values()))} sync(s) in steps {first}..{last} ({n} steps): "
                 f"{sum(map(len, steps.values())) / max(n, 1):.2f} per step"]
        example = {}
        for hs in steps.values():
            for h in hs:
                example.setdefault((h.what, h.origin(), h.ours()), h)
        for key, count in by_origin.most_common():
            what, origin, ours = key
            lines.append(f"  {count / n:.2f}/step {what} [{example[key].why}] from {origin}"
                         + (f" (scalelab: {ours})" if ours and ours != origin else ""))
            lines.append(example[key].where(depth))
        return "\n".join(lines)


def step_tagger(detector: SyncDetector):
    """A Lightning callback, first in the list: tags hits with the optimizer step (1-based) that
    the running batch belongs to; the detector is on from on_train_start to on_train_end."""
    import lightning as L

    class StepTagger(L.Callback):
        def on_train_start(self, trainer, pl_module):
            detector.step = trainer.global_step
            detector.__enter__()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            detector.step = trainer.global_step + 1

        def on_train_end(self, trainer, pl_module):
            detector.__exit__(None, None, None)

    return StepTagger()


# ---- ScaleLab's real job, in this process ----------------------------------------------------
def write_job(job_dir: Path, overrides: list[str]) -> Path:
    """Compose the Hydra config as `scalelab-train OVERRIDES` would, and write job_dir as
    train.run_job does (config_resolved.yaml with its `job` block, data prepared)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalelab.config import validate
    from scalelab.data.prepare import prepare_for_run
    from scalelab.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    GlobalHydra.instance().clear()
    spec = validate(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    job_dir.mkdir(parents=True, exist_ok=True)
    resolved["job"] = {"name": job_dir.name, "group": job_dir.name, "dir": str(job_dir), "sweep_dir": None,
                       "num": 0, "overrides": overrides, "threads_per_rank": 1,
                       "data_prepared": str(prepare_for_run(resolved, spec, progress=False))}
    OmegaConf.save(OmegaConf.create(resolved), job_dir / "config_resolved.yaml")
    return job_dir


def run_job(job_dir: Path, extra_callbacks=(), env: dict | None = None) -> dict:
    """scalelab.worker.run(job_dir) in this process (one rank, no launcher), with extra Lightning
    callbacks put FIRST in the Trainer's list. Returns the run record."""
    import json

    import lightning as L

    from scalelab import worker

    real = L.Trainer

    class Trainer(real):
        def __init__(self, *a, callbacks=None, **k):
            super().__init__(*a, callbacks=[*extra_callbacks, *(callbacks or [])], **k)

    threads = torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}  # RequeueOnSignal's
    old_env = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    worker.L.Trainer = Trainer
    try:
        worker.run(job_dir)
    finally:
        worker.L.Trainer = real
        torch.set_num_threads(threads)
        for s, h in handlers.items():
            signal.signal(s, h)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return json.loads((job_dir / "run.json").read_text())
