"""What `scalelab k8s render`, `scalelab slurm render` and the SLURM sweep launcher must refuse or
render before anything runs (found by review, 2026-12-02):

- a secret-named override went into the PyTorchJob's container command (slurm refused it, k8s
  did not); a --setup / hydra.launcher.setup line `export WANDB_API_KEY=...` went into the sbatch
  script as written. k8s has --secret NAME (envFrom) instead, for W&B online.
- the pods were BestEffort (only nvidia.com/gpu set): --pod-cpus / --pod-memory, requests = limits.
- trainer.max_restarts > 0 with launcher=srun was silently ignored (srun restarts nothing).
Each refusal is one line, exit 2.
"""
from __future__ import annotations

import pytest
import yaml

from scalelab import k8s
from scalelab.errors import ConfigError
from scalelab.preflight import preflight

from ..conftest import run_cli

K8S = ["k8s", "render", "--nodes", "2", "--devices", "2", "--image", "img"]
SLURM = ["slurm", "render", "--cpu", "--nodes", "1", "--devices", "1"]


def _one_line_error(code: int, out, *needles: str) -> None:
    assert code == 2, (out.out[-2000:], out.err)
    assert out.err.startswith("error: ") and out.err.count("\n") == 1, out.err
    for n in needles:
        assert n in out.err, out.err
    assert not out.out, out.out  # nothing rendered


@pytest.mark.parametrize("override", ["+logger.api_key=XyZ-api-987", "+secret_token=abc123"])
def test_k8s_refuses_a_secret_in_the_command(override, capsys):
    code, out = run_cli([*K8S, "--cpu", "strategy=ddp", override], capsys)
    _one_line_error(code, out, "would be written into the PyTorchJob's container command", "--secret NAME")
    assert override.split("=")[1] not in out.err


@pytest.mark.parametrize("override", ["+hydra.job.env_set={WANDB_API_KEY:0123456789abcdef}",
                                      "+logger.settings={api_key:XyZ-api-987}", "+x={a:1,hf_token:XyZ-api-987}"])
def test_a_secret_as_a_key_of_a_dict_literal_is_refused_by_both_renders(override, capsys):
    # review 2026-12-04: the first key of a Hydra dict literal ({KEY:VALUE}) passed both refusals and
    # went into the manifest and the job script as written (a list's [KEY:VALUE] was refused)
    secret = override.rsplit(":", 1)[1].rstrip("}")
    code, out = run_cli([*K8S, "--cpu", "strategy=ddp", override], capsys)
    _one_line_error(code, out, "would be written into the PyTorchJob's container command")
    code, out = run_cli([*SLURM, "strategy=ddp", override], capsys)
    _one_line_error(code, out, "SLURM job script")
    assert secret not in out.err


def test_k8s_secret_becomes_the_pods_environment(capsys):
    code, out = run_cli([*K8S, "--cpu", "--secret", "wandb", "--secret", "hf.token", "strategy=ddp",
                         "logger=wandb", "logger.mode=online"], capsys)
    assert code == 0, out.err
    for role, spec in yaml.safe_load(out.out)["spec"]["pytorchReplicaSpecs"].items():
        c = spec["template"]["spec"]["containers"][0]
        assert c["envFrom"] == [{"secretRef": {"name": "wandb"}}, {"secretRef": {"name": "hf.token"}}], role
        assert not any("api_key" in a or "WANDB_API_KEY" in a for a in c["command"])


def test_k8s_refuses_a_bad_secret_name(capsys):
    code, out = run_cli([*K8S, "--cpu", "--secret", "My_Secret", "strategy=ddp"], capsys)
    _one_line_error(code, out, "--secret 'My_Secret' is not a Kubernetes Secret name")


def test_k8s_pod_cpus_and_memory_are_requests_and_limits(capsys):
    code, out = run_cli([*K8S, "--pod-cpus", "16", "--pod-memory", "64Gi", "strategy=ddp"], capsys)
    assert code == 0, out.err
    for spec in yaml.safe_load(out.out)["spec"]["pytorchReplicaSpecs"].values():
        c = spec["template"]["spec"]["containers"][0]
        assert c["resources"]["requests"] == {"cpu": "16", "memory": "64Gi"}
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi"}
        # a GPU rank's host threads: the pod's CPUs / its ranks (the container sees its node's cores)
        assert "trainer.threads_per_rank=8" in c["command"]


def test_k8s_pod_cpus_keep_a_given_thread_count_and_cpu_ranks():
    doc = yaml.safe_load(k8s.render(1, 2, "img", ["trainer.threads_per_rank=3"], cpu="500m", memory="1Gi"))
    cmd = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    assert [a for a in cmd if a.startswith("trainer.threads_per_rank=")] == ["trainer.threads_per_rank=3"]
    doc = yaml.safe_load(k8s.render(1, 2, "img", [], gpus=False, cpu="4"))
    c = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}
    assert not any(a.startswith("trainer.threads_per_rank=") for a in c["command"])  # CPU ranks: 1 thread each


@pytest.mark.parametrize("flag,value", [("--pod-cpus", "lots"), ("--pod-cpus", "0"), ("--pod-cpus", "2.5m"),
                                        ("--pod-memory", "64GB"), ("--pod-memory", "0Gi"), ("--pod-memory", "-1Gi")])
def test_k8s_refuses_a_bad_quantity(flag, value, capsys):
    code, out = run_cli([*K8S, "--cpu", f"{flag}={value}", "strategy=ddp"], capsys)
    _one_line_error(code, out, f"{flag} {value!r} is not a Kubernetes quantity above 0")


@pytest.mark.parametrize("line", ["export WANDB_API_KEY=sk-live-123456", "export HF_TOKEN='hf_abcdef'",
                                  "WANDB_API_KEY=abc123xyz scalelab-env"])
def test_slurm_refuses_a_setup_line_with_a_literal_secret(line, capsys):
    code, out = run_cli([*SLURM, "--setup", "module load cuda", "--setup", line, "strategy=single"], capsys)
    _one_line_error(code, out, "would write a secret into the SLURM job script")
    assert line.split("=", 1)[1].strip("'").split()[0] not in out.err   # the value is not printed either


def test_slurm_setup_may_refer_to_a_secret(capsys):
    lines = ["export WANDB_API_KEY=$MY_KEY", 'export HF_TOKEN="$(cat ~/.hf_token)"',
             "export TOKENIZERS_PARALLELISM=false"]
    code, out = run_cli([*SLURM, *sum((["--setup", ln] for ln in lines), []), "strategy=single"], capsys)
    assert code == 0, out.err
    for ln in lines:
        assert ln in out.out.splitlines()


def test_slurm_sweep_launcher_refuses_a_setup_secret():
    from hydra_plugins.scalelab_slurm_launcher.launcher import check_settings

    good = {"_target_": "x", "time": "00:10:00", "signal_delay_s": 90, "setup": ["export WANDB_API_KEY=$KEY"]}
    check_settings(good)
    with pytest.raises(ValueError, match=r"^hydra.launcher.setup 'export WANDB_API_KEY=\.\.\.' would write a secret"):
        check_settings({**good, "setup": ["module load cuda", "export WANDB_API_KEY=sk-live-123456"]})


def test_max_restarts_under_srun_is_refused():
    with pytest.raises(ConfigError) as e:
        preflight(["launcher=srun", "trainer.accelerator=cpu", "trainer.max_restarts=2"], data=False, elsewhere=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("trainer.max_restarts=2 with launcher=srun: srun does not restart ranks")
    assert "checkpoint.every_n_steps" in msg and "requeue" in msg
    # the launchers that restart keep it
    preflight(["launcher=local", "trainer.accelerator=cpu", "trainer.max_restarts=2"], data=False)
    preflight(["launcher=srun", "trainer.accelerator=cpu", "trainer.max_restarts=0"], data=False, elsewhere=True)


def test_max_restarts_under_multi_node_torchrun_is_refused():
    """Each node's torchrun restarted alone, its static rendezvous store keeping the failed attempt's
    gloo addresses: the restarted rank could not connect and node 0 hung, no record (review, 2 of 2)."""
    node = ["launcher=torchrun", "trainer.accelerator=cpu", "launcher.rdzv_endpoint=127.0.0.1:29623",
            "launcher.node_rank=0", "trainer.devices=1"]
    with pytest.raises(ConfigError) as e:
        preflight([*node, "trainer.num_nodes=2", "trainer.max_restarts=1"], data=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("trainer.max_restarts=1 with launcher=torchrun on 2 nodes: each node's "
                                              "torchrun restarts alone")
    assert "run the same command again on every node" in msg
    preflight([*node, "trainer.num_nodes=2", "trainer.max_restarts=0"], data=False)   # no restarts: fine
    preflight([*node, "trainer.num_nodes=1", "trainer.max_restarts=1"], data=False)   # one node restarts whole


def test_slurm_render_refuses_max_restarts(capsys):
    code, out = run_cli([*SLURM, "trainer.max_restarts=1", "strategy=single"], capsys)
    _one_line_error(code, out, "trainer.max_restarts=1 with launcher=srun")
