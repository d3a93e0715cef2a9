"""Sweep aggregation and comparison output on synthetic run records."""
import json
import subprocess
import sys

import pytest

from scalelab.results.record import write_json
from scalelab.results.sweep import aggregate


def _rec(job, strategy, world, batch, thr, status="completed", lr_rule="none"):
    cfg = {"strategy": {"name": strategy}, "model": {"name": "gpt_nano"}, "trainer": {"devices": world, "max_steps": 20},
           "data": {"global_batch_size": batch}, "lr_scaling": {"rule": lr_rule, "base_batch_size": batch}}
    return {"status": status, "strategy": strategy, "world_size": world, "global_batch_size": batch,
            "per_device_batch_size": batch // world, "accumulate_grad_batches": 1, "parallel": {"dp": world},
            "throughput": {"samples_per_s": thr, "tokens_per_s": None}, "step_time_s": {"median": 0.1, "p90": 0.1},
            "memory": {"peak_rss_bytes_per_rank": [1] * world, "model_state_bytes_per_rank": [1] * world},
            "loss": {"first": 5.0, "final": 3.0, "curve": [[1, 5.0], [2, 3.0]]}, "lr": 0.001,
            "job": {"name": job}, "config": cfg, **({"error": "boom"} if status != "completed" else {})}


@pytest.fixture()
def sweep(tmp_path):
    runs = [_rec("s/0", "ddp", 1, 16, 100.0), _rec("s/1", "ddp", 2, 16, 150.0), _rec("s/2", "ddp", 2, 32, 180.0),
            _rec("s/3", "ddp", 4, 16, 200.0), _rec("s/4", "fsdp", 2, 16, 0.0, status="failed")]
    for i, r in enumerate(runs):
        (tmp_path / str(i)).mkdir()
        r["job"]["sweep_dir"] = str(tmp_path.resolve())   # a multirun's job, as train.py records it
        write_json(tmp_path / str(i) / "run.json", r)
    return tmp_path


def test_strong_and_weak_groups(sweep):
    s = aggregate(sweep)
    strong = next(g for g in s["groups"] if g["kind"] == "strong" and g["baseline_samples_per_s"] == 100.0)
    eff = {m["world_size"]: m["scaling_efficiency"] for m in strong["runs"]}
    assert eff == pytest.approx({1: 1.0, 2: 150 / 200, 4: 200 / 400})
    weak = next(g for g in s["groups"] if g["kind"] == "weak")  # per-rank batch 16: (1, 16) and (2, 32)
    assert {m["world_size"]: m["scaling_efficiency"] for m in weak["runs"]} == pytest.approx({1: 1.0, 2: 0.9})
    assert s["num_failed"] == 1 and s["failed"][0]["error"] == "boom"
    assert json.loads((sweep / "sweep.json").read_text())["num_runs"] == 5


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "html"])
def test_compare_cli_formats(sweep, fmt, tmp_path):
    out = tmp_path / f"out.{fmt}"
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), "--format", fmt,
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "fsdp" in text and "ddp" in text
    if fmt == "table":
        assert "0.75" in text  # ddp x2 strong efficiency
    if fmt == "json":
        assert len(json.loads(text)) == 5


def test_compare_missing_path_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", "/no/such/sweep"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "/no/such/sweep" in proc.stderr


def test_summarize_records_the_host_speed_probe():
    from scalelab.scaling.metrics import host_speed
    from scalelab.scaling.run_summary import summarize
    rank = {"step_times": [0.1] * 6, "losses": [1.0] * 6, "global_steps": list(range(1, 7)),
            "peak_rss_bytes": 1, "params": 1, "grads": 1, "optimizer": 1}
    rec = summarize([dict(rank, host_flops=[4e10, 6e10]), dict(rank, host_flops=[5e10, 5e10])], 8, 64, 2)
    assert rec["host_speed"]["matmul_flops_per_rank"] == [5e10, 5e10]
    assert rec["host_speed"]["flops"] == 5e10 and "torch.mm" in rec["host_speed"]["method"]
    assert "host_speed" not in summarize([dict(rank, host_flops=[])], 8, 64, 2)   # GPU: no probe
    assert 1e8 < host_speed(0.02) < 1e13          # a real measurement, in FLOP/s


def test_reaggregating_keeps_the_wandb_summary_run_id(sweep):
    """`scalelab aggregate` rewrites sweep.json; the W&B summary run it logged before stays named."""
    path = sweep / "sweep.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**doc, "wandb_run_id": "abc123"}))
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "aggregate", str(sweep)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(path.read_text())
    assert again["wandb_run_id"] == "abc123" and again["num_runs"] == 5


@pytest.mark.parametrize("args,code,needle", [
    (["hardware=h200", "trainer.max_steps=10"], 2, "hardware=h200 (hardware_profile) is a GPU profile but this run is on CPU"),
    (["hardware=nope"], 2, "hardware=nope is not known: choose one of a100_80g_nvlink, h100_sxm, h200, this_cpu"),
])
def test_hardware_group_is_a_real_choice(tmp_path, args, code, needle):
    """`scalelab-train --help` lists the hardware group: selecting it works (or says why not in one line)."""
    proc = subprocess.run([sys.executable, "-m", "scalelab.train", *args, f"hydra.run.dir={tmp_path / 'j'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code and needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_hardware_group_selects_the_profile(tmp_path):
    help_ = subprocess.run([sys.executable, "-m", "scalelab.train", "hardware=this_cpu", "--cfg", "job",
                            "--resolve"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "hardware_profile: this_cpu" in help_.stdout


class _Tty:
    """A terminal's stdout (what `scalelab compare` checks before writing HTML there)."""

    def __init__(self):
        self.written = []

    def isatty(self):
        return True

    def write(self, text):
        self.written.append(text)
        return len(text)

    def flush(self):
        pass


def test_compare_html_to_a_terminal_is_refused(sweep, monkeypatch, capsys):
    """`compare SWEEP --format html` without --out wrote ~5 MB of HTML onto the terminal."""
    from scalelab.cli import build_parser

    tty = _Tty()
    args = build_parser().parse_args(["compare", str(sweep), "--format", "html"])
    monkeypatch.setattr(sys, "stdout", tty)
    code = args.func(args)
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and "".join(tty.written) == ""
    assert err == "error: --format html writes a file: add --out report.html\n"
    # piped: the page goes to the pipe
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), "--format", "html"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.lstrip().lower().startswith("<!doctype html"), proc.stderr
