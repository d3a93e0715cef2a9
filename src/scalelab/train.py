"""`scalelab-train`: the Hydra app. Compose -> validate -> save resolved config -> launch ranks
-> collect the run record. Every job of a multirun is validated before the first one starts.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from scalelab import launch
from scalelab.config import validate
from scalelab.errors import ConfigError
from scalelab.paths import conf_dir
from scalelab.preflight import preflight
from scalelab.results.record import RUN_FILE, base_record, scrub, write_json
from scalelab.results.table import render
from scalelab.plan.hardware import HOST_CPU, host_cpu_profile
from scalelab.scaling.mfu import profile_name

log = logging.getLogger("scalelab")
_FAILED: list[str] = []  # jobs of this command that failed; the command exits 1 if any did


def run_job(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir).resolve()
    multirun = hc.mode == RunMode.MULTIRUN
    spec = validate(cfg)  # cheap; preflight already checked, this guards programmatic use
    from scalelab.data.prepare import prepare_for_run

    threads = launch.threads_per_rank(cfg.trainer.threads_per_rank, spec.run.devices_per_node, spec.run.accelerator)
    cache = Path(cfg.cache_dir)
    if profile_name(cfg.get("hardware_profile", "auto"), spec.run.accelerator) == HOST_CPU:
        host_cpu_profile(cache)  # MFU's peak: probe this host once (cached), while no rank runs
    group = Path(hc.sweep.dir).name if multirun else job_dir.name
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["job"] = {
        "name": f"{group}/{hc.job.num}" if multirun else group, "group": group, "dir": str(job_dir),
        "sweep_dir": str(Path(hc.sweep.dir).resolve()) if multirun else None,
        "num": hc.job.num if multirun else 0, "overrides": list(hc.overrides.task),
        "threads_per_rank": threads,
        "data_prepared": str(prepare_for_run(resolved, spec)),  # preflight prepared it: a cache hit
    }
    OmegaConf.save(OmegaConf.create(scrub(resolved)), job_dir / "config_resolved.yaml")
    (job_dir / RUN_FILE).unlink(missing_ok=True)
    log.info(f"[scalelab] {resolved['job']['name']}: strategy={cfg.strategy.name} world={spec.run.world_size} "
             f"batch={spec.batch.global_batch_size} (micro {spec.batch.per_device_batch_size} x acc "
             f"{spec.batch.accumulate_grad_batches}) -> {job_dir}")
    cmd = launch.rank_command(cfg.launcher.name, spec.run.num_nodes, spec.run.devices_per_node, job_dir,
                              list(cfg.launcher.get("extra_args") or []))
    t0 = time.time()
    rc = launch.run_ranks(cmd, launch.rank_env(cache, threads, job_dir, bool(cfg.get("verbose", False))), job_dir / "ranks.log",
                          float(cfg.trainer.timeout_s))
    record = _collect(job_dir, rc, resolved, spec, threads)
    record.setdefault("timing", {})["job_s"] = time.time() - t0
    write_json(job_dir / RUN_FILE, record)
    if record["status"] != "completed":
        _FAILED.append(f"{resolved['job']['name']}: {record.get('error')}")
        log.error(f"[scalelab] job {resolved['job']['name']} FAILED: {record.get('error')}")
    # To the console and the job's train.log (Hydra's job logging): a sweep prints its table at the end.
    log.info(_one_line(record) if multirun else render([record]))
    return record


def _one_line(record: dict) -> str:
    if record["status"] != "completed":
        return f"[scalelab] {record['job']['name']}: {record['status']}"
    thr, st, loss = record["throughput"], record["step_time_s"], record["loss"]["final"]
    return (f"[scalelab] {record['job']['name']}: completed, {thr.get('samples_per_s') or 0:.1f} samples/s, "
            f"step {(st.get('median') or 0) * 1e3:.1f} ms (median of {st.get('measured_steps')}), "
            f"loss {loss if loss is None else round(loss, 4)}")


def _collect(job_dir: Path, rc: int, resolved: dict, spec, threads: int) -> dict:
    """The rank-0 record when the job succeeded; otherwise a failed record with the error."""
    path = job_dir / RUN_FILE
    if rc == 0 and path.exists():
        import json

        return json.loads(path.read_text())
    record = base_record(resolved, spec.batch, spec.lr, spec.run.world_size,
                         spec.plan.parallel_degrees(spec.run.world_size), spec.run.model_arch, None,
                         spec.run.accelerator, threads)
    record.update(status="failed", returncode=rc, error=_error_message(job_dir, rc))
    return record


def _error_message(job_dir: Path, rc: int) -> str:
    for f in sorted(job_dir.glob("error-rank*.txt")):
        lines = [ln for ln in f.read_text().splitlines() if ln.strip()]
        if lines:
            return f"{f.stem}: {lines[-1]}"
    if rc == 124:
        return "timed out (trainer.timeout_s)"
    log = job_dir / "ranks.log"
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] if log.exists() else []
    signal_note = f" (killed by signal {-rc if rc < 0 else rc - 128})" if rc < 0 or rc > 128 else ""
    return f"ranks exited with code {rc}{signal_note}" + (f": {tail[0][:300]}" if tail else "")


@hydra.main(config_path=str(conf_dir()), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float:
    """Returns the objective for sweepers that optimize (Optuna): the final loss, NaN if failed."""
    record = run_job(cfg)
    final = record.get("loss", {}).get("final")
    return float(final) if record["status"] == "completed" and final is not None else float("nan")


def main() -> None:
    try:
        preflight(sys.argv[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()
    if _FAILED:  # the sweep went on past them; the command still says so
        print(f"error: {len(_FAILED)} job(s) failed:\n  " + "\n  ".join(_FAILED), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
