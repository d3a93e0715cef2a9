"""`scalelab k8s render`: a Kubeflow PyTorchJob manifest for a multi-node run (launcher=torchrun).

One Master pod (node 0, hosts the rendezvous) and nodes - 1 Worker pods. Every pod runs the same
`scalelab-train ... launcher=torchrun trainer.num_nodes=N trainer.devices=D`; the training operator
gives each pod MASTER_ADDR / MASTER_PORT (the master's service) and RANK (the pod's index: Master 0,
Worker i -> i + 1, i.e. the node rank, as no nprocPerNode is set), which launcher=torchrun reads when
launcher.rdzv_endpoint / launcher.node_rank are null. The container command is a list (no shell):
an override's spaces, quotes or `$()` reach scalelab-train as written. Rendered with
yaml.safe_dump, so every string is quoted where YAML needs it. The command is kept by the cluster
(the manifest, `kubectl describe`): a secret-named override is refused, and `--secret NAME` gives
the pods a Secret's keys as their environment instead (W&B online: WANDB_API_KEY).
"""
from __future__ import annotations

import argparse
import re
import sys

import yaml

OUTPUTS_MOUNT = "/scalelab-outputs"
NODE_DIR = "node${oc.env:RANK,0}"   # Hydra resolves it in each pod: the operator's RANK is its node rank
# Kubernetes object names (RFC 1123 DNS labels: a PyTorchJob's pods are named after it)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LAYOUT_KEYS = ("trainer.devices=", "trainer.num_nodes=", "launcher=", "launcher.rdzv_endpoint=",
                "launcher.node_rank=", "hydra/launcher=")


# Kubernetes quantities (resource.Quantity): CPUs as cores or millicores, memory in bytes with a suffix
_CPU = re.compile(r"(\d+(\.\d+)?|\d+m)")
_MEMORY = re.compile(r"\d+(\.\d+)?([KMGTPE]i?|k)?")
# Secret names are DNS subdomains
_SECRET = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def manifest(nodes: int, devices: int, image: str, overrides: list[str], name: str = "scalelab",
             namespace: str | None = None, port: int = 29500, gpus: bool = True, rdzv_timeout_s: int | None = None,
             cpu: str | None = None, memory: str | None = None, pvc: str | None = None,
             mount: str = OUTPUTS_MOUNT, secrets: list[str] = ()) -> dict:
    """The PyTorchJob as a dict (render() dumps it). Every pod mounts a memory-backed /dev/shm (a
    container's default is 64 MiB: too small for NCCL's and the DataLoader's shared memory); with a
    PersistentVolumeClaim `pvc`, each pod's job folder is on it (MOUNT/NAME/nodeK, K = the pod's
    RANK, which the operator sets: node 0's run.json, every node's ranks.log, never one folder
    written by two nodes), since a finished pod's own disk cannot be read back.
    cpu / memory: each pod's, as requests = limits (with the GPUs: the Guaranteed QoS class; with
    neither the pods were BestEffort, the first evicted, their CPUs not reserved); on GPUs each
    rank's threads are the pod's CPUs / ranks (the cores a container sees are its node's).
    secrets: Kubernetes Secrets whose keys become every pod's environment (envFrom): a secret
    (WANDB_API_KEY) never in the command, which the manifest and the cluster's API keep."""
    cpu_only = [] if gpus or any(o.lstrip("+").startswith("trainer.accelerator=") for o in overrides) else \
        ["trainer.accelerator=cpu"]   # as validated: a pod without a GPU limit may still see a node's GPUs
    threads = [] if not (cpu and gpus) or any(o.lstrip("+").startswith("trainer.threads_per_rank=")
                                               for o in overrides) else \
        [f"trainer.threads_per_rank={max(1, int(_cores(cpu)) // devices)}"]
    # Kubernetes expands $(VAR) in a command and makes $$ one $, shell or not: a user's $ doubled
    # reaches scalelab-train as written ('a$$b' arrived as 'a$b'); NODE_DIR's $(RANK) is meant
    command = ["scalelab-train", *[o.replace("$", "$$") for o in overrides if not o.startswith(_LAYOUT_KEYS)],
               *cpu_only, *threads,
               "launcher=torchrun",
               f"trainer.num_nodes={nodes}", f"trainer.devices={devices}",
               *([f"launcher.rdzv_timeout_s={rdzv_timeout_s}"] if rdzv_timeout_s else []),
               *([f"hydra.run.dir={mount}/{name}/{NODE_DIR}", f"hydra.sweep.dir={mount}/{name}/{NODE_DIR}"]
                 if pvc else [])]
    limits = {**({"nvidia.com/gpu": str(devices)} if gpus else {}), **({"cpu": str(cpu)} if cpu else {}),
              **({"memory": str(memory)} if memory else {})}
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, *([{"name": "outputs", "mountPath": mount}] if pvc else [])]
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
               *([{"name": "outputs", "persistentVolumeClaim": {"claimName": pvc}}] if pvc else [])]
    requests = {k: v for k, v in limits.items() if k in ("cpu", "memory")}
    container = {"name": "pytorch", "image": image, "imagePullPolicy": "IfNotPresent", "command": command,
                 **({"envFrom": [{"secretRef": {"name": n}} for n in secrets]} if secrets else {}),
                 "ports": [{"name": "pytorchjob-port", "containerPort": port}],
                 **({"resources": {**({"requests": requests} if requests else {}), "limits": limits}}
                    if limits else {}), "volumeMounts": mounts}

    def replica(count: int) -> dict:
        # with a claim to resume from: ExitCode, so a pod ended by a signal (eviction, preemption: 128 + n,
        # the SIGTERM save's 143) is restarted and resumes, while exit codes 1-127 (errors) end the job
        # (the training operator's policy); without one a restart would start over: Never
        return {"replicas": count, "restartPolicy": "ExitCode" if pvc else "Never",
                "template": {"spec": {"terminationGracePeriodSeconds": pod_grace_s(overrides),
                                      "containers": [container], "volumes": volumes}}}

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
            "spec": {"pytorchReplicaSpecs": specs}}


def pod_grace_s(overrides: list[str]) -> int:
    """The pods' terminationGracePeriodSeconds: a pod's SIGTERM (eviction, preemption) gives a
    checkpointing job's ranks checkpoint.stop_grace_s (null: 60 s; rank_stop.stop_grace_s) to save
    at their next step, and the launcher 5 s more; Kubernetes kills the pod at its grace (default
    30 s), so: that + 30 s, at least 90."""
    import math

    from scalelab.rank_stop import STOP_GRACE_S

    grace = STOP_GRACE_S
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "checkpoint.stop_grace_s":
            try:
                grace = float(value)
            except ValueError:   # null, or a value the schema refuses when the job starts
                grace = STOP_GRACE_S
    return max(90, math.ceil(grace) + 30)


def _cores(cpu: str) -> float:
    """A CPU quantity (8, 7.5, 500m) in cores."""
    return int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)


class _Dumper(yaml.SafeDumper):
    """safe_dump's dumper, with every string value double-quoted (numbers stay numbers: Kubernetes
    wants `replicas: 1`, not "1") and no anchors / aliases between the replicas."""

    def ignore_aliases(self, data) -> bool:
        return True


_Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style='"'))


def render(*args, **kw) -> str:
    """The manifest as YAML: yaml.safe_dump's safe representer (_Dumper is a SafeDumper), strings
    quoted, keys in the order built."""
    return yaml.dump(manifest(*args, **kw), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10_000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["render"])
    p.add_argument("--nodes", type=int, required=True, help="pods (nodes): 1 Master + nodes - 1 Workers")
    p.add_argument("--devices", type=int, required=True, help="ranks (GPUs) per pod")
    p.add_argument("--image", required=True, help="container image with scalelab installed (scalelab-train on PATH)")
    p.add_argument("--name", default="scalelab", help="the PyTorchJob's name")
    p.add_argument("--namespace")
    p.add_argument("--port", type=int, default=29500, help="the master's rendezvous port (MASTER_PORT)")
    p.add_argument("--cpu", action="store_true", help="no GPUs (gloo ranks on CPU cores): no nvidia.com/gpu limit")
    p.add_argument("--pod-cpus", metavar="Q", help="CPUs per pod, requested and limited (8, 7.5 or 500m); on GPUs "
                   "each rank gets pod CPUs / ranks threads")
    p.add_argument("--pod-memory", metavar="Q", help="memory per pod, requested and limited (e.g. 64Gi, 512Mi); "
                   "/dev/shm counts against it")
    p.add_argument("--secret", action="append", default=[], metavar="NAME",
                   help="a Kubernetes Secret whose keys become every pod's environment (e.g. WANDB_API_KEY for "
                   "logger.mode=online); repeatable")
    p.add_argument("--rdzv-timeout", type=int, help="launcher.rdzv_timeout_s (pods start at different times)")
    p.add_argument("--pvc", help="a PersistentVolumeClaim (ReadWriteMany) for the results: each pod's job folder "
                   f"is {OUTPUTS_MOUNT}/NAME/nodeK on it")
    p.add_argument("--out", help="write the manifest here instead of stdout")
    p.add_argument("overrides", nargs="*", help="scalelab-train overrides, e.g. strategy=fsdp model=gpt_small")


def run(args: argparse.Namespace) -> int:
    from scalelab.errors import ConfigError
    from scalelab.preflight import preflight

    if args.nodes < 1 or args.devices < 1:
        print(f"error: --nodes {args.nodes} / --devices {args.devices}: both must be >= 1", file=sys.stderr)
        return 2
    if not 1 <= args.port <= 65535:
        print(f"error: --port {args.port} must be in 1-65535", file=sys.stderr)
        return 2
    # the training operator's webhook: a PyTorchJob name is a DNS-1035 label (a letter first:
    # `1abc` rendered and kubectl apply refused it); its Services NAME-worker-I are labels too
    longest = f"{args.name}-worker-{max(args.nodes - 2, 0)}" if args.name else ""
    if args.name is not None and _NAME.fullmatch(args.name) and (not args.name[0].isalpha() or len(longest) > 63):
        print(f"error: --name {args.name!r} is not a PyTorchJob name: it must start with a letter and leave its pods' "
              f"Service names (NAME-worker-I, here {longest!r}: {len(longest)} characters) at most 63 characters",
              file=sys.stderr)
        return 2
    for flag, value in (("--name", args.name), ("--namespace", args.namespace), ("--pvc", args.pvc)):
        if value is not None and not _NAME.fullmatch(value):
            print(f"error: {flag} {value!r} is not a Kubernetes name: lowercase letters, digits and '-', starting "
                  "and ending with a letter or digit, at most 63 characters", file=sys.stderr)
            return 2
    for value in args.secret:
        if not _SECRET.fullmatch(value):
            print(f"error: --secret {value!r} is not a Kubernetes Secret name: lowercase letters, digits, '-' and "
                  "'.', starting and ending with a letter or digit, at most 253 characters", file=sys.stderr)
            return 2
    for flag, value, pattern, valid in (
            ("--pod-cpus", args.pod_cpus, _CPU, "cores (8, 7.5) or millicores (500m)"),
            ("--pod-memory", args.pod_memory, _MEMORY, "bytes with a suffix (64Gi, 512Mi, 1G)")):
        if value is not None and (not pattern.fullmatch(value) or not float(re.match(r"[\d.]+", value)[0])):
            print(f"error: {flag} {value!r} is not a Kubernetes quantity above 0: give {valid}", file=sys.stderr)
            return 2
    if not args.image.strip() or any(c.isspace() for c in args.image):
        print(f"error: --image {args.image!r} must be an image reference (e.g. registry/scalelab:tag), without "
              "spaces", file=sys.stderr)
        return 2
    clash = [o for o in args.overrides if o.lstrip("+~").startswith(_LAYOUT_KEYS)]
    if clash:
        print(f"error: {clash[0]}: the layout comes from --nodes / --devices and the pods' environment (MASTER_ADDR, "
              "RANK); drop it", file=sys.stderr)
        return 2
    # a key a flag sets too: both went into the command and Hydra kept the last (the flag's, silently)
    for flag, given, keys, what in (("--pvc", args.pvc, ("hydra.run.dir=", "hydra.sweep.dir="),
                                     "each pod's job folder on the claim"),
                                    ("--rdzv-timeout", args.rdzv_timeout, ("launcher.rdzv_timeout_s=",),
                                     "the rendezvous timeout")):
        twice = [o for o in args.overrides if given is not None and o.lstrip("+~").startswith(keys)]
        if twice:
            print(f"error: {twice[0]}: {flag} sets it ({what}); give one of them", file=sys.stderr)
            return 2
    from scalelab.slurm import refuse_decided, refuse_secrets

    try:   # --cpu sets no GPU limit: `--cpu trainer.accelerator=gpu` ran on none
        refuse_decided(args.overrides, args.cpu, "sets a GPU limit")
        # the command is in the manifest, the cluster's API objects and `kubectl describe`
        refuse_secrets(args.overrides, ("the PyTorchJob's container command", "put it in a Kubernetes Secret and "
                                        "pass --secret NAME (its keys become the pods' environment, e.g. "
                                        "WANDB_API_KEY)"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # the same validation as any run, for this layout (node 0 and a placeholder endpoint stand in for
        # the pods' environment); no data preparation: the pods prepare it
        preflight([*args.overrides, "launcher=torchrun", f"trainer.num_nodes={args.nodes}",
                   f"trainer.devices={args.devices}", f"launcher.rdzv_endpoint=master:{args.port}",
                   "launcher.node_rank=0", *(["trainer.accelerator=cpu"] if args.cpu else []),
                   *([f"launcher.rdzv_timeout_s={args.rdzv_timeout}"] if args.rdzv_timeout is not None else [])],
                  data=False, elsewhere=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from scalelab.paths import out_problem, write_out

    problem = args.out and out_problem(args.out, "--out")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    text = render(args.nodes, args.devices, args.image, args.overrides, name=args.name, namespace=args.namespace,
                  port=args.port, gpus=not args.cpu, rdzv_timeout_s=args.rdzv_timeout, pvc=args.pvc,
                  cpu=args.pod_cpus, memory=args.pod_memory, secrets=args.secret)
    if not args.pvc:   # run.json, checkpoints and ranks.log on the pods' own disks: gone with the pods
        print("warning: no --pvc: each pod's run.json, checkpoints and logs stay on its own disk and go with it; "
              "give --pvc CLAIM (a ReadWriteMany claim) to keep them and resume", file=sys.stderr)
    if args.out:
        write_out(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
