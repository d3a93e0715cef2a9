"""recommend warns, as plan does, when asked for more devices per node than a node of the profile
has: `recommend --model gpt_small --devices 8 --hardware this_cpu` on a 2-core host predicted 21,195
tok/s and printed trainer.devices=8 without a word, while `plan ... trainer.devices=8` warned."""
import json

import pytest

from scalelab.plan.hardware import parse_hardware
from ..conftest import run_cli as _run

WARNING = ("warning: 8 devices per node, but a two_core_cpu node has 2 cores (a CPU device is a rank of its own "
           "core): the figures are for devices it does not have\n")


@pytest.fixture
def two_cores(tmp_path):
    """A CPU profile whose node has 2 devices (cores), as this host's this_cpu, without probing."""
    import yaml
    prof = {"name": "two_core_cpu", "kind": "cpu", "peak_flops": {"fp32": 1e11, "bf16": 2e11, "fp16": 3e9},
            "memory_bytes": 12 * 2 ** 30, "memory_bandwidth_bytes_per_s": 3.5e10,
            "intra_node": {"bandwidth_bytes_per_s": 1.3e9, "latency_s": 1e-4},
            "devices_per_node": 2, "runtime_memory_bytes": 3.5e8, "step_overhead_s": 0.003}
    assert parse_hardware(prof).devices_per_node == 2 and parse_hardware(prof).kind == "cpu"
    path = tmp_path / "two_core_cpu.yaml"
    path.write_text(yaml.safe_dump(prof))
    return path


def test_recommend_warns_as_plan_does(capsys, tmp_path, two_cores):
    rec = ["recommend", "--model", "gpt_small", "--hardware", str(two_cores), "--strategies", "ddp",
           "--activation-checkpointing", "none", "--out"]
    code, out = _run([*rec, str(tmp_path / "r8"), "--devices", "8", "--json"], capsys)
    assert code == 0 and out.err == WARNING and json.loads(out.out)["warning"] == WARNING[9:-1]
    assert "**Warning**: 8 devices per node" in (tmp_path / "r8" / "recommendation.md").read_text()
    code, plan = _run(["plan", "--model", "gpt_small", "--strategy", "ddp", "--devices", "8", "--hardware",
                       str(two_cores)], capsys)
    assert plan.err == WARNING                     # the same words as plan's
    code, out = _run([*rec, str(tmp_path / "r2"), "--devices", "2", "--json"], capsys)
    assert code == 0 and out.err == "" and "warning" not in json.loads(out.out)
