"""Host cost per step of ScaleLab's Lightning loop (`single`) against a hand-written loop, on CPU.

With a GPT so small that its compute takes well under a millisecond, a step's time is mostly the
host's own work: Python, the framework's loop and callbacks, data loading. On a GPU that host
time is what the device waits for when the host does not run ahead (issue 11: `single` 34.5 ms
vs 32.3 ms for the hand loop on an H200 at 86M). Both loops run in this process, 1 thread (as a
CPU rank: threads_per_rank 1), interleaved over --repeats rounds:

  (a) hand-written: the same model (scalelab.models.build.build_net of the job's config), the job's
      optimizer (conf/optim: AdamW), the same batch shape, pre-made random batches (as
      benchmarks/handwritten_gpt.py: forward, cross-entropy, backward, step, zero_grad);
  (b) ScaleLab: scalelab.worker.run on a job dir written as `scalelab-train strategy=single ...`
      would (tests/host_syncs.py: same config, callbacks, logger, data module; no launcher).
Each step is timed end to end (perf_counter at each step's end; ScaleLab's from its own
StepMetrics, the run record's step_time_s); the median of the steps after --warmup is kept per
round, and the figure is the median over rounds. Prints both, the ratio hand / ScaleLab (as
gpu_check's "/ hand loop": 1.0 = no platform cost) and, with --breakdown, the host time per step
spent in each callback's hooks and the logger.

    .venv/bin/python benchmarks/host_overhead.py [--repeats 5] [--steps 60] [--breakdown] [--audit]
--audit also lists the host<->device syncs per steady step with their stacks (tests/host_syncs.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.host_syncs import SyncDetector, run_job, step_tagger, write_job  # noqa: E402

# 1 layer x 32 wide x 2 heads, context 32, byte vocab, batch 4: ~25k parameters
TINY = ["model=gpt_nano", "model.arch.n_layers=1", "model.arch.d_model=32", "model.arch.n_heads=2",
        "model.arch.seq_len=32", "data.global_batch_size=4"]
# as benchmarks/gpu_check.py runs `single`: csv logger (LearningRateMonitor on), no progress bar
RUN = ["strategy=single", "trainer.accelerator=cpu", "logger=csv", "trainer.enable_progress_bar=false",
       "trainer.profile_steps=0"]
HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
         "on_before_optimizer_step", "on_before_zero_grad")


def hand_loop(job: Path, steps: int, warmup: int) -> float:
    """Median seconds per steady step of a plain loop on the job's model, optimizer and batch."""
    import hydra.utils
    from omegaconf import OmegaConf

    from scalelab.config import validate
    from scalelab.models.build import build_net

    cfg = OmegaConf.load(job / "config_resolved.yaml")
    spec = validate(cfg)
    torch.manual_seed(cfg.seed)
    net = build_net(spec.run.model_arch)
    opt = hydra.utils.instantiate(cfg.optim.optimizer)(net.parameters(), lr=spec.lr)
    vocab, seq = spec.run.model_arch.vocab_size, spec.seq_len
    g = torch.Generator().manual_seed(cfg.seed)
    batches = [torch.randint(0, vocab, (spec.batch.per_device_batch_size, seq + 1), generator=g) for _ in range(4)]
    times, t_last = [], time.perf_counter()
    for step in range(steps):
        x = batches[step % len(batches)]
        logits = net(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
    return statistics.median(times[warmup:])


def hook_timer(warmup: int, totals: dict):
    """A callback (first in the list) that, from on_train_start, times every other callback's
    step hooks and the loggers' log_metrics/save, for the steps after `warmup`."""
    import lightning as L

    state = {"on": False, "steps": 0}

    def wrap(owner, attr, label):
        fn = getattr(owner, attr)

        def timed(*a, **k):
            if not state["on"]:
                return fn(*a, **k)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)

    class HookTimer(L.Callback):
        def on_train_start(self, trainer, pl_module):
            for cb in trainer.callbacks:
                if cb is self:
                    continue
                for hook in HOOKS:
                    if getattr(type(cb), hook, None) is not getattr(L.Callback, hook, None):
                        wrap(cb, hook, f"{type(cb).__name__}.{hook}")
            for hook in ("on_train_batch_end", "on_before_optimizer_step"):
                wrap(pl_module, hook, f"LitModule.{hook}")
            for lg in trainer.loggers:
                wrap(lg, "log_metrics", f"{type(lg).__name__}.log_metrics")
                wrap(lg, "save", f"{type(lg).__name__}.save")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            state["on"] = trainer.global_step >= warmup
            state["steps"] += state["on"]

        def on_train_end(self, trainer, pl_module):
            state["on"] = False
            totals["_steps"] = state["steps"]

    return HookTimer()


def scalelab_loop(root: Path, overrides: list[str], tag: str, extra=()) -> dict:
    job = write_job(root / tag, overrides)
    return run_job(job, list(extra))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--breakdown", action="store_true", help="host ms per step in each callback hook and logger")
    ap.add_argument("--audit", action="store_true", help="list the host<->device syncs of the steady steps")
    ap.add_argument("--worker-diff", action="store_true",
                    help="run ScaleLab with scaling.metrics.HostLRMonitor in place of Lightning's LearningRateMonitor "
                         "(the change proposed for worker.py)")
    ap.add_argument("--job-root", help="folder for the job dirs (default: the system temp folder); /dev/shm takes "
                                       "the disk out of the per-step file writes (JOB_DIR/.progress, the CSV log)")
    ap.add_argument("overrides", nargs="*", help="extra scalelab-train overrides (KEY=VALUE)")
    a = ap.parse_args()
    if a.worker_diff:
        import lightning.pytorch.callbacks as cbs

        from scalelab.scaling import metrics

        cbs.LearningRateMonitor = metrics.HostLRMonitor
    overrides = [*TINY, *RUN, f"trainer.max_steps={a.steps}", f"trainer.warmup_steps={a.warmup}", *a.overrides]
    torch.set_num_threads(1)
    hand, lab, totals = [], [], {}
    with tempfile.TemporaryDirectory(prefix="host_overhead-", dir=a.job_root) as tmp:
        root = Path(tmp)
        for r in range(a.repeats):
            rec = scalelab_loop(root, overrides, f"lab{r}",
                                [hook_timer(a.warmup, totals)] if a.breakdown and r == a.repeats - 1 else [])
            lab.append(rec["step_time_s"]["median"])
            torch.set_num_threads(1)
            hand.append(hand_loop(root / f"lab{r}", a.steps, a.warmup))
            print(f"round {r + 1}/{a.repeats}: hand {hand[-1] * 1e3:.3f} ms/step, ScaleLab {lab[-1] * 1e3:.3f} ms/step",
                  flush=True)
        if a.audit:
            det = SyncDetector()
            scalelab_loop(root, overrides, "audit", [step_tagger(det)])
            print(det.report(a.warmup + 1, a.steps - 1))
    h, s = statistics.median(hand), statistics.median(lab)
    out = {"hand_ms": h * 1e3, "scalelab_ms": s * 1e3, "hand_over_scalelab": h / s,
           "hand_ms_min": min(hand) * 1e3, "scalelab_ms_min": min(lab) * 1e3,
           "platform_host_ms_per_step": (s - h) * 1e3, "rounds": a.repeats, "steps": a.steps, "warmup": a.warmup,
           "overrides": overrides, "worker_diff": a.worker_diff, "job_root": a.job_root or tempfile.gettempdir(),
           "torch": torch.__version__,
           "method": "both in one process, 1 thread, interleaved rounds; per round the median of steps after "
                     "warmup, each timed end to end with perf_counter (ScaleLab: run.json step_time_s.median); "
                     "figure = median over rounds (best round: *_min)"}
    print(f"hand-written loop: {h * 1e3:.3f} ms/step | ScaleLab single: {s * 1e3:.3f} ms/step | "
          f"hand / ScaleLab = {h / s:.3f} | platform host cost {(s - h) * 1e3:.3f} ms/step "
          f"(best rounds: {min(hand) * 1e3:.3f} vs {min(lab) * 1e3:.3f} ms/step)")
    if a.breakdown and totals.get("_steps"):
        n = totals.pop("_steps")
        print(f"host ms per steady step in hooks and loggers (last round, {n} steps):")
        for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"  {v / n * 1e3:8.3f}  {k}")
        out["breakdown_ms_per_step"] = {k: v / n * 1e3 for k, v in totals.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
