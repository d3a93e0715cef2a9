"""Which hardware profile a GPU's MFU divides by, from torch.cuda.get_device_name: the SXM parts'
profiles, never for the Hopper PCIe / NVL parts whose peak is lower (NVIDIA datasheets, dense
bf16: H100 PCIe 756 TFLOP/s, H100 NVL and H200 NVL 835, H100/H200 SXM 989); such a run says why it
has no MFU."""
from __future__ import annotations

import pytest
import torch

from scalelab.scaling import mfu


@pytest.mark.parametrize("name,profile", [
    ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA H200", "h200"), ("NVIDIA GH200 480GB", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100_80g_nvlink"), ("NVIDIA A100-SXM4-40GB", "a100_80g_nvlink"),
    ("NVIDIA A100 80GB PCIe", "a100_80g_nvlink"),   # A100 PCIe: the SXM's 312 TFLOP/s
    ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None),
    ("NVIDIA L40S", None), ("Tesla V100-SXM2-32GB", None),
])
def test_profile_by_device_name(name, profile):
    assert mfu.gpu_profile(name) == profile


def test_a_gpu_without_a_profile_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 PCIe")
    assert mfu.profile_name("auto", "gpu") is None
    note = mfu.no_profile_note("auto", "gpu")
    assert note.startswith("[scalelab] no MFU: no hardware profile has the peak FLOP/s of 'NVIDIA H100 PCIe'")
    assert "hardware_profile=NAME" in note
    assert mfu.no_profile_note("h100_sxm", "gpu") is None    # named: the user's choice
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert mfu.no_profile_note("auto", "gpu") is None
    assert mfu.no_profile_note("auto", "cpu") is None


def test_a_cpu_profile_of_any_name_is_a_cpu_profile(tmp_path):
    """A calibrated CPU profile saved as workstation.yaml (kind: cpu) serves a CPU run; a GPU
    profile still does not (its peak would understate CPU MFU)."""
    import pytest
    import yaml

    from scalelab.errors import ConfigError
    from scalelab.plan.hardware import conf_dir

    h200 = yaml.safe_load((conf_dir() / "hardware" / "h200.yaml").read_text())
    cpu = tmp_path / "workstation.yaml"
    cpu.write_text(yaml.safe_dump({**h200, "name": "workstation", "kind": "cpu"}))
    assert mfu.profile_name(str(cpu), "cpu") == str(cpu)
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(yaml.safe_dump({**h200, "name": "mygpu"}))
    with pytest.raises(ConfigError, match="is a GPU profile but this run is on CPU"):
        mfu.profile_name(str(gpu), "cpu")
    with pytest.raises(ConfigError, match="is a GPU profile but this run is on CPU"):
        mfu.profile_name("h200", "cpu")


def test_plan_of_a_job_on_a_cpu_profile_of_any_name_is_a_cpu_job(tmp_path):
    """`scalelab plan hardware_profile=workstation.yaml ...` validated the job as a GPU job."""
    import yaml

    from scalelab.plan.hardware import conf_dir
    from scalelab.plan_job import _validated

    h200 = yaml.safe_load((conf_dir() / "hardware" / "h200.yaml").read_text())
    cpu = tmp_path / "workstation.yaml"
    cpu.write_text(yaml.safe_dump({**h200, "name": "workstation", "kind": "cpu"}))
    cfg, spec, target, hardware = _validated([f"hardware_profile={cpu}", "model=gpt_nano", "strategy=single"], None)
    assert target == "cpu" and hardware == str(cpu)
