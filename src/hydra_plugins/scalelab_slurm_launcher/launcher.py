"""The Hydra launcher behind `hydra/launcher=slurm` (settings: config.py).

Why not hydra-submitit-launcher's own: it submits one job array with one layout for the whole
sweep (a sweep over trainer.devices needs a layout per job), and runs the pickled Hydra job as a
child of the batch shell inside an srun step, where neither the batch-step signal
(`scancel --batch`, `--signal=B:`) reaches it nor can it start its ranks' own srun step without
oversubscribing the allocation. Here each job is the sbatch script of `scalelab slurm submit`
(scalelab.slurm.render: the same quoting, requeue and resume), its run dir is the sweep's
`<sweep dir>/<num>` fixed before submission, and the command waits, records every job's final
SLURM state (scalelab.slurm_jobs.finalize), and lets the SweepSummary callback aggregate the sweep.
Hydra plugins are imported whenever Hydra scans for them: imports stay inside the methods.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from hydra.plugins.launcher import Launcher

log = logging.getLogger("scalelab")


class ScalelabSlurmLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        import json
        import subprocess

        from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
        from omegaconf import OmegaConf, open_dict

        from scalelab import launch, slurm, slurm_jobs
        from scalelab.results.optuna_trials import objective
        from scalelab.results.record import scrub, scrub_file

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        p = self.params
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        scrub_file(sweep_dir / "multirun.yaml")
        jobs, scripts = [], []  # (num, overrides, cfg, job dir, SLURM id); the same with the script's path
        rendered = []           # the same with the script's text and its request in words, before any check
        try:
            check_settings(p)
            check_config_source(sys.argv)
            # the job's own hydra.* settings are not task overrides (Hydra passes the launcher those
            # only): a config group found on hydra.searchpath (recommend --verify's candidates, a
            # user's experiments) composed here and failed in the job after its queue wait
            searchpath = [str(x) for x in self.config.hydra.searchpath or []]
            carried = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
            for overrides in job_overrides:  # before anything is submitted (scalelab.train checks argv too)
                slurm.refuse_secrets(list(overrides))
                other = slurm.other_launcher(list(overrides))
                if other:   # it was dropped silently and the job ran launcher=srun (submit refused it)
                    raise ValueError(f"{other}: a hydra/launcher=slurm sweep runs every job with launcher=srun "
                                     "(its ranks are the SLURM job's tasks): drop it")
            for i, overrides in enumerate(job_overrides):
                num = initial_job_idx + i
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                with open_dict(cfg):
                    cfg.hydra.job.id = cfg.hydra.job.num = num
                job_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
                t = cfg.trainer
                cpu = str(t.accelerator) == "cpu"
                gpus = 0 if cpu else (int(t.devices) if p.get("gpus_per_node", "auto") == "auto"
                                      else int(p["gpus_per_node"] or 0))
                if not cpu and gpus < int(t.devices):   # failed in the worker (too few GPUs) after the queue wait
                    raise ValueError(f"hydra.launcher.gpus_per_node={gpus} is below job #{num}'s trainer.devices="
                                     f"{t.devices} (a rank per GPU): give gpus_per_node=auto (= trainer.devices) or "
                                     "more, or trainer.accelerator=cpu for a CPU job")
                args = [*carried, *(o for o in overrides if not o.lstrip("+~").startswith(("launcher=", "hydra.")))]
                cpus = slurm.cpus_per_task(p.get("cpus_per_task"), cpu)
                script = slurm.render(int(t.num_nodes), int(t.devices), args, gpus, p.get("time", "01:00:00"),
                                      p.get("partition"), cpus, p.get("job_name", "scalelab"), str(sweep_dir / "slurm"),
                                      account=p.get("account"), qos=p.get("qos"), setup=list(p.get("setup") or []),
                                      signal_delay_s=int(p.get("signal_delay_s", 90)), run_dir=str(job_dir),
                                      sweep=(str(sweep_dir), num), gres=bool(p.get("gres", False)))
                request = slurm.asked(int(t.num_nodes), int(t.devices), cpus, gpus, p.get("partition"),
                                      p.get("time", "01:00:00"))
                rendered.append((num, list(overrides), cfg, job_dir, script,
                                 f"job #{num} ({' '.join(filter_overrides(overrides))}): {request}"))
            # every job's request checked by the scheduler (after every job's own checks: a bad job
            # further down was found only after the scheduler was asked about the first) before the
            # first is submitted
            for num, overrides, cfg, job_dir, script, asked in rendered:
                path = slurm.prepare(script, sweep_dir / "slurm" / f"job{num}.sbatch", asked=asked)
                scripts.append((num, overrides, cfg, job_dir, path))
            for num, overrides, cfg, job_dir, path in scripts:
                job_id = slurm.sbatch(path)
                log.info(f"[scalelab] #{num} SLURM job {job_id}: {' '.join(filter_overrides(overrides))}")
                jobs.append((num, overrides, cfg, job_dir, job_id))
            ids = {j[4]: j for j in jobs}
            (sweep_dir / "slurm" / "jobs.json").write_text(json.dumps({str(j[0]): j[4] for j in jobs}) + "\n")
            states = slurm_jobs.wait(list(ids), float(p.get("poll_s", 1.0)))
        except (KeyboardInterrupt, RuntimeError, ValueError) as e:
            # Nothing of this sweep may keep running once its command gave up on it.
            if jobs:
                subprocess.run(["scancel", *[j[4] for j in jobs]], capture_output=True)
            for *_, path in scripts[len(jobs):]:   # checked, never submitted: not kept
                path.unlink(missing_ok=True)
            if not jobs:                           # a refused sweep leaves no multirun.yaml-only folder
                _remove_if_only_config(sweep_dir)
            ended = f"; cancelled SLURM job(s) {', '.join(j[4] for j in jobs)}" if jobs else ""
            if isinstance(e, KeyboardInterrupt):
                print(f"stopped (Ctrl-C){ended}", file=sys.stderr, flush=True)
                raise SystemExit(130) from None
            print(f"error: {e}{ended}", file=sys.stderr, flush=True)
            raise SystemExit(2 if isinstance(e, ValueError) and not jobs else 1) from None
        runs = []
        for num, overrides, cfg, job_dir, job_id in jobs:
            st = states.get(job_id, {"state": "UNKNOWN", "reason": "not in accounting"})
            meta = {"strategy": str(cfg.strategy.name), "world_size": int(cfg.trainer.devices) * int(cfg.trainer.num_nodes),
                    "global_batch_size": int(cfg.data.global_batch_size), "name": f"{sweep_dir.name}/{num}",
                    "sweep_dir": str(sweep_dir)}
            rec = slurm_jobs.finalize(job_dir, st, job_id, meta,
                                      sweep_dir / "slurm" / f"{self.params.get('job_name', 'scalelab')}-{job_id}.out")
            if rec.get("status") != "completed":
                launch.FAILED_JOBS.append(f"{meta['name']} (SLURM job {job_id}): {scrub(rec.get('error'))}")
                log.error(f"[scalelab] job {meta['name']} (SLURM job {job_id}) FAILED: {scrub(rec.get('error'))}")
            ret = JobReturn(overrides=overrides, cfg=cfg, hydra_cfg=cfg, working_dir=str(job_dir),
                            task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED)
            # None for a failed job, as scalelab.train's: the Optuna sweeper records a failed trial and goes on
            # (a NaN ended the search: scalelab.results.optuna_trials)
            ret.return_value = objective(rec)
            runs.append(ret)
        return runs


def _remove_if_only_config(sweep_dir: Path) -> None:
    """The sweep's folder when nothing but its multirun.yaml and an empty slurm/ is in it (Hydra's
    sweeper makes the folder and writes multirun.yaml before the launcher runs; an earlier sweep's
    folder has its jobs in it). Never raises: the refusal's own line is what the user must see."""
    slurm_dir = sweep_dir / "slurm"
    try:
        if {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml", "slurm"} and \
                not (slurm_dir.is_dir() and any(slurm_dir.iterdir())):
            (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
            for d in (slurm_dir, sweep_dir):
                if d.is_dir():
                    d.rmdir()
    except OSError:
        pass


def check_config_source(argv: list[str]) -> None:
    """-cd/-cp/-cn (another config folder or primary config): the job's script runs scalelab.train
    with its overrides only, so it composed from conf/train.yaml on the compute node, not what was
    checked here. ValueError naming what does travel."""
    flags = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")
    given = next((a for a in argv if a.split("=", 1)[0] in flags), None)
    if given:
        raise ValueError(f"{given.split('=', 1)[0]}: a hydra/launcher=slurm sweep's jobs compose conf/train.yaml "
                         "with their overrides; put your config groups in a folder and give "
                         "hydra.searchpath=[file:///abs/folder] (it goes with each job) instead")


def check_settings(p: dict) -> None:
    """hydra.launcher.* values, before anything is submitted: ValueError in one line. A key the
    settings do not have (`+hydra.launcher.partiton=debug`, as Hydra's own error advises for a
    misspelt one) would be ignored and the job sent to the default partition."""
    from dataclasses import fields

    from scalelab.schema import not_a_key
    from scalelab.slurm_request import check_times

    from .config import ScalelabSlurmConf

    known = [f.name for f in fields(ScalelabSlurmConf)]
    for key in p:
        if key not in known:
            raise ValueError(not_a_key("hydra.launcher", key, known))
    cpus = p.get("cpus_per_task")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
        raise ValueError(f"hydra.launcher.cpus_per_task={cpus!r} must be an integer >= 1 (or null: 1 on CPU, else 8)")
    gpus = p.get("gpus_per_node", "auto")
    if gpus != "auto" and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise ValueError(f"hydra.launcher.gpus_per_node={gpus!r} must be auto (trainer.devices) or an integer >= 0")
    check_times(str(p.get("time", "01:00:00")), p.get("signal_delay_s", 90),
                ("hydra.launcher.time", "hydra.launcher.signal_delay_s"))
    from scalelab.slurm import check_job_name, refuse_secret_lines

    check_job_name(p.get("job_name", "scalelab"), "hydra.launcher.job_name")

    # each line goes into every job's script as written, as `scalelab slurm --setup` lines do
    refuse_secret_lines(list(p.get("setup") or []), "hydra.launcher.setup")
