"""The SLURM script and rank layout for a 2-node x 4-GPU job, without a cluster: the #SBATCH
layout, the srun line the batch step runs, and the rank environment (MASTER_ADDR = the first
node, MASTER_PORT from the job id, Lightning's requeue off). The same paths run for real
against the local cluster in tests/slurm/."""
import shlex
import subprocess
import sys
from pathlib import Path

from scalelab import launch, requeue, slurm

from ..conftest import env


def test_two_nodes_four_gpus_render_srun_line_and_environment(tmp_path):
    script = slurm.render(2, 4, ["strategy=fsdp", "model=gpt_small"], True, "02:00:00", "gpu", 16, "scalelab",
                          str(tmp_path), account="proj1", qos="high", setup=["module load cuda/12.4"],
                          signal_delay_s=120, stamp="S")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --partition=gpu", "#SBATCH --account=proj1",
                 "#SBATCH --qos=high", "#SBATCH --time=02:00:00", "#SBATCH --requeue",
                 "#SBATCH --signal=USR1@120", "#SBATCH --open-mode=append", "module load cuda/12.4"):
        assert line in script.splitlines(), line
    assert f'export SCALELAB_RUN_DIR={tmp_path}/"$SLURM_JOB_ID"-S' in script   # stable across requeues
    assert "launcher=srun trainer.num_nodes=2 trainer.devices=4 strategy=fsdp model=gpt_small" in script
    assert script.splitlines()[-1].startswith("exec ")   # the batch step is the Hydra job (gets --batch signals)
    cmd = launch.rank_command("srun", 2, 4, Path("/jobs/j"))
    assert cmd[:5] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--kill-on-bad-exit=1"]
    assert cmd[-3:] == ["-m", "scalelab.worker", "/jobs/j"]
    job = {"SLURM_JOB_ID": "4711234", "SLURM_JOB_NODELIST": "gpu-[07-08]", "SLURM_RESTART_COUNT": "2",
           "SLURM_ARRAY_JOB_ID": "4711200", "SLURM_ARRAY_TASK_ID": "3"}
    assert requeue.master_env(job) == {"MASTER_ADDR": "gpu-07", "MASTER_PORT": str(15000 + 1234),
                                       "SCALELAB_SLURM_STEP": "1"}
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
