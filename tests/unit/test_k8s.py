"""launcher=torchrun's validation (one line, before anything starts) and `scalelab k8s render`."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from scalelab import k8s
from scalelab.errors import ConfigError
from scalelab.launch import rank_command, torchrun_layout
from scalelab.preflight import preflight

from ..conftest import env

TR = ["launcher=torchrun", "trainer.num_nodes=2", "trainer.devices=2"]


@pytest.mark.parametrize("args,expected", [
    ([], r"needs the rendezvous endpoint: set launcher.rdzv_endpoint=HOST:PORT"),
    (["launcher.rdzv_endpoint=node0"], r"launcher.rdzv_endpoint='node0' must be HOST:PORT with a port in 1-65535"),
    (["launcher.rdzv_endpoint=node0:0"], r"must be HOST:PORT with a port in 1-65535"),
    (["launcher.rdzv_endpoint=node0:65536"], r"must be HOST:PORT with a port in 1-65535"),
    (["launcher.rdzv_endpoint=':29500'"], r"must be HOST:PORT"),
    (["launcher.rdzv_endpoint=n0:29500"], r"needs this node's rank: set launcher.node_rank=K"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=2"], r"launcher.node_rank=2 must be an integer in \[0, 2\)"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=-1"], r"launcher.node_rank=-1 must be an integer >= 0"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "launcher.rdzv_backend=etcd"],
     r"launcher.rdzv_backend='etcd' is not valid: choose one of static \(c10d is not supported"),
    # c10d orders the nodes itself: global rank 0 (the record's writer) landed on node_rank 1, node 0
    # wrote an empty record and node 1 the sweep's summary (measured by a reviewer)
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "launcher.rdzv_backend=c10d"],
     r"launcher.rdzv_backend='c10d' is not valid: choose one of static \(c10d is not supported: it orders the "
     r"nodes itself, so global rank 0, the run record's writer, could be on any node\)"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "launcher.rdzv_timeout_s=0"],
     r"launcher.rdzv_timeout_s=0 must be a number > 0"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "trainer.num_nodes=0"],
     r"trainer.num_nodes=0 must be an integer >= 1"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "trainer.devices=3", "strategy=fsdp_tp",
      "data.global_batch_size=12"],
     r"tensor-parallel degree 2 does not divide trainer.devices=3 \(devices per node\).*divides 3$"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "trainer.devices=1", "strategy=tp"],
     r"with one device per node there is no TP group to make: a data-parallel strategy"),   # not 'divides 1'
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", "strategy=nd", "strategy.tp=4"],
     r"strategy.tp=4 cannot fit inside a node of 2 device\(s\)"),  # nd says it itself (its option name)
    # after torchrun's own arguments argparse kept the last: c10d put rank 0 (the record's writer) anywhere
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", 'launcher.extra_args=["--rdzv-backend=c10d"]'],
     r"^launcher.extra_args has '--rdzv-backend=c10d': launcher=torchrun sets it from the job's layout"),
    (["launcher.rdzv_endpoint=n0:29500", "launcher.node_rank=0", 'launcher.extra_args=["--max_restarts=3"]'],
     r"^launcher.extra_args has '--max_restarts=3'"),
])
def test_torchrun_preflight_rejects(args, expected, monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "RANK", "PET_NODE_RANK",
                "PET_MASTER_ADDR", "PET_MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match=expected) as e:
        preflight([*TR, *args], data=False)
    assert "\n" not in str(e.value)


def test_local_launchers_still_refuse_several_nodes():
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=2 needs launcher=srun .* or launcher=torchrun"):
        preflight(["trainer.num_nodes=2"], data=False)


def test_layout_from_the_environment():
    lay = torchrun_layout({"rdzv_endpoint": None, "node_rank": None}, 4,
                          {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "3", "WORLD_SIZE": "4"})
    assert (lay["endpoint"], lay["node_rank"]) == ("job-master-0:23456", 3)
    lay = torchrun_layout({}, 2, {"MASTER_ADDR": "h", "MASTER_PORT": "1", "NODE_RANK": "1", "RANK": "7"})
    assert lay["node_rank"] == 1  # NODE_RANK before RANK
    with pytest.raises(ConfigError, match=r"MASTER_ADDR:MASTER_PORT='h:99999' must be HOST:PORT"):
        torchrun_layout({}, 2, {"MASTER_ADDR": "h", "MASTER_PORT": "99999", "NODE_RANK": "0"})
    with pytest.raises(ConfigError, match=r"NODE_RANK='x' must be an integer in \[0, 2\)"):
        torchrun_layout({}, 2, {"MASTER_ADDR": "h", "MASTER_PORT": "1", "NODE_RANK": "x"})
    assert torchrun_layout({}, 1, {})["node_rank"] == 0  # one node: a local endpoint, node 0
    # keys win over the environment; IPv6 in brackets
    lay = torchrun_layout({"rdzv_endpoint": "[::1]:29500", "node_rank": 0}, 2, {"MASTER_ADDR": "x", "NODE_RANK": "1"})
    assert (lay["endpoint"], lay["node_rank"]) == ("[::1]:29500", 0)


def test_rank_command_is_torchrun_with_the_rendezvous(tmp_path):
    lay = {"endpoint": "n0:29500", "node_rank": 1, "backend": "static", "timeout_s": 20, "rdzv_id": "abc"}
    cmd = rank_command("torchrun", 2, 8, tmp_path, [], 0, lay)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in ("--nnodes=2", "--node-rank=1", "--nproc-per-node=8", "--rdzv-backend=static",
                "--rdzv-endpoint=n0:29500", "--rdzv-id=abc", "--rdzv-conf=timeout=20"):
        assert arg in cmd
    assert cmd[-3:] == ["-m", "scalelab.worker", str(tmp_path)]


NASTY = "logger.project='my \"proj\" $(rm -rf /) `id` a: b # c'"


def test_render_round_trips_and_the_command_is_a_list():
    text = k8s.render(3, 8, "reg.example.com/scalelab:1.0", ["strategy=fsdp", NASTY, "trainer.devices=4"],
                      name="run-1", rdzv_timeout_s=600)
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    for role in ("Master", "Worker"):
        c = specs[role]["template"]["spec"]["containers"][0]
        assert c["image"] == "reg.example.com/scalelab:1.0"
        cmd = c["command"]
        assert isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)
        # unchanged, one argument, once the kubelet has made each $$ one $ (its $(VAR) expansion)
        assert cmd[0] == "scalelab-train" and NASTY in [a.replace("$$", "$") for a in cmd]
        assert "trainer.devices=4" not in cmd  # the layout comes from --nodes/--devices
        assert cmd[-4:] == ["launcher=torchrun", "trainer.num_nodes=3", "trainer.devices=8",
                            "launcher.rdzv_timeout_s=600"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # every string value is quoted in the text
    for line in text.splitlines():
        item = line.strip()
        item = item[2:] if item.startswith("- ") else item
        value = item if item.startswith('"') and item.endswith('"') and not item.endswith('":') else \
            (item.split('": ', 1)[1] if '": ' in item else "")
        assert value == "" or value.startswith('"') or value.isdigit(), line


def test_render_mounts_shared_memory_and_the_results_claim():
    """Every pod: /dev/shm in memory (a container's default 64 MiB is too small for NCCL); with
    --pvc each pod's job folder is on the claim (a finished pod's own disk is gone with it)."""
    for pvc in (None, "results"):
        doc = yaml.safe_load(k8s.render(2, 8, "img", ["strategy=ddp"], name="run-1", pvc=pvc))
        for role in ("Master", "Worker"):
            pod = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
            c = pod["containers"][0]
            vols = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert vols["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}} and mounts["dshm"] == "/dev/shm"
            if pvc is None:
                assert "outputs" not in vols and not any(a.startswith("hydra.run.dir=") for a in c["command"])
            else:
                assert vols["outputs"]["persistentVolumeClaim"] == {"claimName": "results"}
                assert mounts["outputs"] == "/scalelab-outputs"
                # each pod its own folder (node K = the pod's RANK): two nodes never write one run.json
                assert c["command"][-2:] == ["hydra.run.dir=/scalelab-outputs/run-1/node${oc.env:RANK,0}",
                                             "hydra.sweep.dir=/scalelab-outputs/run-1/node${oc.env:RANK,0}"]


@pytest.mark.parametrize("args,words", [
    (["--name", "Bad_Name"], ["--name 'Bad_Name' is not a Kubernetes name"]),
    (["--namespace", "x-"], ["--namespace 'x-' is not a Kubernetes name"]),
    (["--image", ""], ["--image '' must be an image reference"]),
    (["--image", "a b"], ["--image 'a b'"]),
    (["--pvc", "My_Claim"], ["--pvc 'My_Claim' is not a Kubernetes name"]),
    (["--rdzv-timeout", "-5"], ["launcher.rdzv_timeout_s=-5 must be a number > 0"]),
    # the training operator's webhook: DNS-1035 (a letter first); Services NAME-worker-0 within 63
    (["--name", "1abc"], ["--name '1abc' is not a PyTorchJob name: it must start with a letter"]),
    (["--name", "a" * 55], [f"here '{'a' * 55}-worker-0': 64 characters) at most 63"]),
])
def test_render_refuses_what_kubernetes_or_the_pods_would(args, words, capsys):
    from scalelab.cli import build_parser

    a = build_parser().parse_args(["k8s", "render", "strategy=ddp", "--nodes", "2", "--devices", "2", "--cpu",
                                   "--image", "img", *args])
    assert k8s.run(a) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_render_single_node_has_no_workers():
    doc = yaml.safe_load(k8s.render(1, 2, "img", [], gpus=False))
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert "resources" not in doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_cli_render_validates_and_prints(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "scalelab.cli", "k8s", "render", *a], cwd=tmp_path,
                                    env=env(), capture_output=True, text=True, timeout=120)
    ok = run("--nodes", "2", "--devices", "2", "--image", "img", "--cpu", "strategy=ddp", NASTY)
    assert ok.returncode == 0, ok.stderr
    cmd = yaml.safe_load(ok.stdout)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert NASTY in [a.replace("$$", "$") for a in cmd["command"]]
    bad = run("--nodes", "2", "--devices", "3", "--image", "img", "strategy=fsdp_tp", "data.global_batch_size=12")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "devices per node" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--cpu", "trainer.accelerator=gpu"], "trainer.accelerator=gpu with --cpu: --cpu asks no GPUs"),   # no GPU limit
    (["trainer.accelerator=cpu"], "trainer.accelerator=cpu on a job that sets a GPU limit: give --cpu instead"),
    (["+launcher=local"], "+launcher=local: the layout comes from --nodes / --devices"),
    (["hydra/launcher=slurm"], "hydra/launcher=slurm: the layout comes from"),
    # a key a flag sets too (both were in the command; Hydra kept the flag's silently)
    (["--pvc", "claim", "hydra.run.dir=/x"], "hydra.run.dir=/x: --pvc sets it (each pod's job folder on the claim)"),
    (["--rdzv-timeout", "30", "launcher.rdzv_timeout_s=60"], "launcher.rdzv_timeout_s=60: --rdzv-timeout sets it"),
])
def test_render_refuses_overrides_of_what_it_decides(args, needle, capsys):
    from scalelab.cli import build_parser

    flags = [x for i, x in enumerate(args) if x.startswith("--") or i and args[i - 1] in ("--pvc", "--rdzv-timeout")]
    a = build_parser().parse_args(["k8s", "render", *[x for x in args if x not in flags], "--nodes", "2",
                                   "--devices", "2", "--image", "img", *flags])
    assert k8s.run(a) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err


def test_a_cpu_render_runs_on_cpu_as_validated():
    cmd = yaml.safe_load(k8s.render(1, 2, "img", ["strategy=ddp"], gpus=False))["spec"]["pytorchReplicaSpecs"]
    assert "trainer.accelerator=cpu" in cmd["Master"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("overrides,grace", [([], 90), (["checkpoint.every_n_steps=10"], 90),
                                             (["checkpoint.stop_grace_s=300"], 330),
                                             (["+checkpoint.stop_grace_s=120.5"], 151),
                                             (["checkpoint.stop_grace_s=null"], 90)])
def test_pods_get_the_grace_the_save_needs(overrides, grace):
    """A pod's SIGTERM gives the ranks checkpoint.stop_grace_s (60 s by default) to save: Kubernetes
    must wait that + 30 s before it kills the pod (its own default is 30 s; a fixed 90 s cut a
    300 s save short)."""
    m = k8s.manifest(2, 1, "img", overrides, gpus=False)
    for spec in m["spec"]["pytorchReplicaSpecs"].values():
        assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == grace


def test_a_dollar_in_an_override_reaches_the_pod_as_written():
    """Kubernetes expands $(VAR) in a container command and makes $$ one $ (no shell needed):
    'logger.project=a$$b' rendered as given reached scalelab-train as 'a$b', and $(HOME) as a path."""
    cmd = yaml.safe_load(k8s.render(2, 1, "img", ["logger.project=a$$b", "+tag=$(HOME)", "x='${oc.env:FOO}'"]))
    cmd = cmd["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    ran = [a.replace("$$", "$") for a in cmd]   # what the kubelet runs: each $$ one $, no $(VAR) left
    assert ["logger.project=a$$b", "+tag=$(HOME)", "x='${oc.env:FOO}'"] == ran[1:4]
    assert cmd[1:4] == ["logger.project=a$$$$b", "+tag=$$(HOME)", "x='$${oc.env:FOO}'"]


def test_a_secret_by_its_value_under_a_plain_name_is_refused(capsys):
    from scalelab.cli import build_parser

    a = build_parser().parse_args(["k8s", "render", "strategy=ddp", "+logger.wandb_key=" + "0123456789abcdef" * 2
                                   + "01234567", "--nodes", "2", "--devices", "2", "--cpu", "--image", "img"])
    assert k8s.run(a) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: logger.wandb_key=... would be written into the PyTorchJob's container command")
    assert "01234567" not in err and err.count("\n") == 1


def test_pods_with_a_claim_restart_on_a_signal_and_without_one_the_render_warns(capsys):
    from scalelab.cli import build_parser

    def specs(*flags):
        a = build_parser().parse_args(["k8s", "render", "strategy=ddp", "--nodes", "2", "--devices", "2", "--cpu",
                                       "--image", "img", *flags])
        assert k8s.run(a) == 0
        out = capsys.readouterr()
        return yaml.safe_load(out.out)["spec"]["pytorchReplicaSpecs"], out.err

    # with a claim: an evicted pod (SIGTERM: it saves, exits 143) is restarted and resumes; errors end the job
    got, err = specs("--pvc", "claim")
    assert {r["restartPolicy"] for r in got.values()} == {"ExitCode"} and err == ""
    got, err = specs()
    assert {r["restartPolicy"] for r in got.values()} == {"Never"}
    assert err.startswith("warning: no --pvc: each pod's run.json, checkpoints and logs stay on its own disk")
