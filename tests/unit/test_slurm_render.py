"""The SLURM script and rank layout for a 2-node x 4-GPU job, without a cluster: the #SBATCH
layout, the srun line the batch step runs, and the rank environment (MASTER_ADDR = the first
node, MASTER_PORT a free port of the batch host, Lightning's requeue off). The same paths run for real
against the local cluster in tests/slurm/."""
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab import launch, requeue, slurm

from ..conftest import env, run_cli


def test_two_nodes_four_gpus_render_srun_line_and_environment(tmp_path):
    script = slurm.render(2, 4, ["strategy=fsdp", "model=gpt_small"], True, "02:00:00", "gpu", 16, "scalelab",
                          str(tmp_path), account="proj1", qos="high", setup=["module load cuda/12.4"],
                          signal_delay_s=120, stamp="S")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --partition=gpu", "#SBATCH --account=proj1",
                 "#SBATCH --qos=high", "#SBATCH --time=02:00:00", "#SBATCH --requeue",
                 "#SBATCH --signal=USR1@120", "#SBATCH --open-mode=append", "module load cuda/12.4"):
        assert line in script.splitlines(), line
    lines = script.splitlines()   # setup runs outside `set -u` (conda's activation reads unset variables)
    assert lines.index("set +u") < lines.index("module load cuda/12.4") < lines.index("set -u")
    assert f'export SCALELAB_RUN_DIR={tmp_path}/"$SLURM_JOB_ID"-S' in script   # stable across requeues
    assert "launcher=srun trainer.num_nodes=2 trainer.devices=4 strategy=fsdp model=gpt_small" in script
    assert script.splitlines()[-1].startswith("exec ")   # the batch step is the Hydra job (gets --batch signals)
    cmd = launch.rank_command("srun", 2, 4, Path("/jobs/j"))
    # block: node K holds ranks K*4.. whatever SLURM_DISTRIBUTION the batch job has (cyclic interleaved them)
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--distribution=block",
                       "--kill-on-bad-exit=1"]
    assert "--export=ALL" in cmd   # whatever the batch job's --export (NONE: the ranks had only SLURM_*)
    assert cmd[-3:] == ["-m", "scalelab.worker", "/jobs/j"]
    job = {"SLURM_JOB_ID": "4711234", "SLURM_JOB_NODELIST": "gpu-[07-08]", "SLURM_RESTART_COUNT": "2",
           "SLURM_ARRAY_JOB_ID": "4711200", "SLURM_ARRAY_TASK_ID": "3"}
    master = requeue.master_env(job)
    assert master["MASTER_ADDR"] == "gpu-07" and master["SCALELAB_SLURM_STEP"] == "1"
    # a port free on this (the batch) host now, below the ephemeral range, not Lightning's 15000 +
    # the id's last 4 digits: taken, the next one
    port = int(master["MASTER_PORT"])
    assert 15000 <= port < 32000
    with socket.socket() as s:
        s.bind(("", port))
        assert int(requeue.master_env(job)["MASTER_PORT"]) != port
    info = requeue.slurm_info(job)
    assert info["job_id"] == "4711200_3" and info["nodes"] == ["gpu-07", "gpu-08"] and info["requeues"] == 2
    assert requeue.expand_nodelist("n[1-2,010],login") == ["n1", "n2", "n010", "login"]


def test_hostile_values_are_quoted_or_refused(tmp_path):
    hostile = "+note='a b; touch X $(touch Y) `touch Z` \"q\"'"
    script = slurm.render(1, 2, [hostile], False, "00:10:00", None, 1, "scalelab", str(tmp_path))
    exec_line = script.splitlines()[-1]
    assert hostile in shlex.split(exec_line)             # one argument, byte for byte
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "slurm", "render", "--cpu", "--job-name",
                           "x\n#SBATCH --wrap=id", "trainer.devices=1"], cwd=tmp_path, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--job-name" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["trainer.accelerator=gpu"], ["hardware=h200"],
                                  ["strategy=zero2", "trainer.precision=16-mixed"]])
def test_a_gpu_job_is_validated_for_the_allocation_s_gpus_not_the_login_node(args, capsys, tmp_path):
    """The login node (this CPU machine) has no GPU; the job asks the allocation for 8 per node.
    Each of these was refused as if the job were to run here ("no CUDA device is visible", "a GPU
    profile but this run is on CPU", "DeepSpeed fp16 needs a GPU")."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the login-node case needs one without")
    out = tmp_path / "job.sbatch"
    code, cap = run_cli(["slurm", "render", "--nodes", "2", "--devices", "8", "--out", str(out), *args], capsys)
    assert code == 0, cap.err
    assert "#SBATCH --gpus-per-node=8" in out.read_text()


@pytest.mark.parametrize("args,needle", [
    (["--cpu", "hardware=h200"], "is a GPU profile but this run is on CPU"),       # --cpu: CPU ranks there
    (["--cpu", "strategy=zero2", "trainer.precision=16-mixed"], "needs a GPU"),
    (["trainer.accelerator=tpu"], "trainer.accelerator='tpu' is not valid"),
])
def test_what_the_allocation_could_not_run_is_still_refused(args, needle, capsys):
    code, cap = run_cli(["slurm", "render", "--nodes", "1", "--devices", "2", *args], capsys)
    assert code == 2 and needle in cap.err and cap.err.count("\n") == 1, cap.err


def test_per_task_gpu_binding_is_named_not_an_invalid_device_ordinal():
    """`--gpus-per-task=1` (or --gpu-bind) leaves each srun task one GPU, cuda:0: ranks 1-7 of a
    node asked for cuda:1..7 and failed with "invalid device ordinal" after the queue wait."""
    assert launch.too_few_gpus(8, 8, "srun") is None and launch.too_few_gpus(8, 4, "local") is None
    msg = launch.too_few_gpus(1, 8, "srun")
    assert msg.startswith("this rank sees 1 GPU(s) but trainer.devices=8 ranks run on its node")
    assert "--gpus-per-task" in msg and "--gpus-per-node" in msg and "\n" not in msg
    assert "srun" not in launch.too_few_gpus(1, 2, "torchrun")


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "2", "launcher=local"], "launcher=local: the script runs launcher=srun"),   # ran local, validated srun
    (["hydra/launcher=slurm"], "hydra/launcher=slurm: the script runs launcher=srun, one job"),
    (["--cpu", "trainer.accelerator=gpu"], "trainer.accelerator=gpu with --cpu: --cpu asks no GPUs"),
    (["trainer.accelerator=cpu"], "trainer.accelerator=cpu on a job that requests GPUs: give --cpu instead"),
])
def test_overrides_of_what_the_script_decides_are_refused(args, needle, capsys):
    code, cap = run_cli(["slurm", "render", *args], capsys)
    assert code == 2 and cap.err.startswith("error: ") and needle in cap.err and cap.err.count("\n") == 1, cap.err


def test_the_launcher_the_script_runs_may_be_given():
    """The multi-node commands plan and recommend print carry launcher=srun: pasted into render,
    they were refused."""
    slurm.refuse_decided(["launcher=srun", "strategy=ddp"], cpu=False)
    with pytest.raises(ValueError, match="launcher=torchrun: the script runs launcher=srun"):
        slurm.refuse_decided(["launcher=torchrun"], cpu=False)


def test_a_hung_sbatch_is_one_line_and_keeps_no_script(monkeypatch, tmp_path):
    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))

    monkeypatch.setattr(slurm.subprocess, "run", hang)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    with pytest.raises(RuntimeError, match=r"^sbatch gave no answer in 60 s .*the job may or may not be queued") as e:
        slurm.sbatch(script)
    assert "\n" not in str(e.value) and not script.exists()


def test_srun_ranks_threads_come_from_the_allocation_not_this_host(tmp_path):
    """launcher=srun from an salloc shell on a login node: each rank's threads were the login node's
    cores / ranks (scalelab-train's own host), not the allocation's CPUs per task. A stand-in srun
    reports the environment the ranks would get; SLURM_CPUS_PER_TASK is more than this host has."""
    per_task = launch.host_cores() + 3
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "srun"
    fake.write_text('#!/bin/sh\necho "$OMP_NUM_THREADS" > "$SRUN_PROBE"\nexit 3\n')
    fake.chmod(0o755)
    e = env()
    e.update(PATH=f"{tmp_path / 'bin'}:{e['PATH']}", SRUN_PROBE=str(tmp_path / "threads"),
             SLURM_CPUS_PER_TASK=str(per_task))
    for k in [k for k in e if k.startswith("SLURM_") and k != "SLURM_CPUS_PER_TASK"]:
        e.pop(k)
    job = tmp_path / "job"
    proc = subprocess.run([sys.executable, "-m", "scalelab.train", "model=gpt_nano", "launcher=srun",
                           "trainer.accelerator=cpu", "trainer.devices=1", "trainer.threads_per_rank=auto",
                           "trainer.max_steps=2", "trainer.warmup_steps=0", "logger=none", f"hydra.run.dir={job}"],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "threads").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "threads").read_text().strip() == str(per_task)
    import yaml

    saved = yaml.safe_load((job / "config_resolved.yaml").read_text())["job"]
    assert saved["threads_per_rank"] == per_task and saved["host_cores"] == per_task   # MFU's cores too


def test_srun_cpus_per_task_from_the_allocation():
    from scalelab.launch import threads_per_rank
    from scalelab.slurm_request import srun_cpus_per_task

    assert srun_cpus_per_task(4, {"SLURM_CPUS_PER_TASK": "6", "SLURM_JOB_CPUS_PER_NODE": "64(x2)"}) == 6
    assert srun_cpus_per_task(4, {"SLURM_JOB_CPUS_PER_NODE": "32(x2)"}) == 8
    assert srun_cpus_per_task(4, {"SLURM_JOB_CPUS_PER_NODE": "40,8"}) == 2    # the smallest node bounds all
    assert srun_cpus_per_task(4, {"SLURM_CPUS_ON_NODE": "12"}) == 3
    assert srun_cpus_per_task(8, {"SLURM_CPUS_ON_NODE": "4"}) == 1
    assert srun_cpus_per_task(4, {}) is None                                 # no allocation: this host's cores
    # the ranks' threads over the allocation's cores (6 CPUs per task x 4 ranks), not this host's
    assert threads_per_rank(None, 4, "gpu", 6 * 4) == 6 and threads_per_rank("auto", 4, "cpu", 6 * 4) == 6
    assert threads_per_rank(None, 4, "cpu", 6 * 4) == 1 and threads_per_rank(2, 4, "gpu", 6 * 4) == 2


def test_setup_lines_that_read_unset_variables_run_and_the_script_is_strict_after(tmp_path):
    # conda's activation scripts read unset variables: under `set -u` the job failed after its queue wait
    script = slurm.render(1, 1, ["strategy=single"], False, "00:30:00", None, 1, "scalelab", str(tmp_path),
                          setup=['echo "setup saw [${SCALELAB_NEVER_SET_X}]"'], stamp="S")
    head = script[:script.index("# The run dir")]   # up to the job's own lines
    proc = subprocess.run(["bash", "-c", head + 'echo "after: ${SCALELAB_NEVER_SET_Y}"'], capture_output=True,
                          text=True, cwd=tmp_path)
    assert "setup saw []" in proc.stdout, proc.stderr
    assert proc.returncode != 0 and "SCALELAB_NEVER_SET_Y: unbound variable" in proc.stderr   # strict again


def test_gres_asks_for_the_gpus_the_old_way(tmp_path, capsys):
    # a site without select/cons_tres refuses --gpus-per-node; SBATCH_GRES beside it did not replace it
    from scalelab.cli import main

    lines = slurm.render(2, 4, ["strategy=ddp"], True, "02:00:00", None, 8, "scalelab", str(tmp_path), stamp="S",
                         gres=True).splitlines()
    assert "#SBATCH --gres=gpu:4" in lines and not any("gpus-per-node" in x for x in lines)
    with pytest.raises(SystemExit) as done:
        main(["slurm", "render", "--gres", "--devices", "2", "--log-dir", str(tmp_path), "model=gpt_nano"])
    out = capsys.readouterr().out.splitlines()
    assert done.value.code == 0 and "#SBATCH --gres=gpu:2" in out and not any("gpus-per-node" in x for x in out)
