"""Planner review (2026-12-03, a third pass): `--calibrate --out` wrote over the committed H100
profile; the flag form planned tp/pipeline for the MLP (every stage the whole model) with a same
job the trainer refuses; `--attention math` printed a same job whose plan differs by the s x s
scores; a listing where nothing fits exited 0; a profile's `memory_bytes: 80GB` was a traceback;
--probe/--calibrate/--validate dropped plan flags; the memory note said "the larger of gradients
and activations" beside a total that adds them."""
import json
import shutil

import pytest

from ..conftest import run_cli

GPT4 = ["--layers", "4", "--hidden", "512", "--heads", "8", "--vocab", "50304", "--seq-len", "2048",
        "--strategy", "ddp", "--devices", "2", "--global-batch", "16", "--hardware", "h100_sxm"]


@pytest.mark.parametrize("mode", [["--probe"], ["--calibrate", "{tmp}/no_sweep_yet", "--hardware", "h100_sxm"]])
def test_an_out_that_is_a_hand_written_profile_is_refused(capsys, tmp_path, mode):
    from scalelab.plan.spec import conf_dir

    mine = tmp_path / "h100_sxm.yaml"
    shutil.copy(conf_dir() / "hardware" / "h100_sxm.yaml", mine)
    before = mine.read_bytes()
    code, cap = run_cli(["plan", *[m.format(tmp=tmp_path) for m in mode], "--out", str(mine)], capsys)
    assert code == 2 and cap.err == (f"error: --out {mine} is a hardware profile that `scalelab plan --probe/"
                                     "--calibrate` did not write: it would be replaced; give --out a new path "
                                     "(or delete it first)\n")
    assert mine.read_bytes() == before                     # refused before the probe or the fit


def test_an_out_that_calibrate_wrote_may_be_written_again(capsys, tmp_path):
    """Its own earlier output is no one's hand-written profile: refused only for the missing sweep."""
    out = tmp_path / "fit.yaml"
    out.write_text("# Fitted by `scalelab plan --calibrate old_sweep`; use with --hardware fit.yaml\nname: fit\n")
    code, cap = run_cli(["plan", "--calibrate", str(tmp_path / "none"), "--hardware", "h100_sxm", "--out", str(out)],
                        capsys)
    assert code == 2 and "does not exist" in cap.err and "did not write" not in cap.err


@pytest.mark.parametrize("strategy,how", [("pipeline", "splits a GPT by layers"),
                                          ("tp", "tensor-parallelizes the GPT models only")])
def test_tensor_and_pipeline_strategies_refuse_the_mlp(capsys, strategy, how):
    code, cap = run_cli(["plan", "--model", "mlp", "--strategy", strategy, "--devices", "2"], capsys)
    assert code == 2 and cap.out == ""
    assert cap.err == (f"error: strategy={strategy} {how}; the mlp model is not one: choose a gpt model "
                       "(--model gpt_nano, gpt_small, or the shape flags)\n")


def test_a_listing_for_the_mlp_has_the_split_strategies_refused(capsys):
    code, cap = run_cli(["plan", "--model", "mlp", "--strategy", "all", "--devices", "2", "--json"], capsys)
    assert code == 0
    rows = {d["inputs"]["strategy"]: d for d in json.loads(cap.out)}
    assert {n for n, d in rows.items() if "refused" in d} == {"tp", "fsdp_tp", "pipeline", "nd"}
    assert "model=mlp" in rows["ddp"]["train_command"]                 # the strategies that run it: a same job


def test_attention_other_than_the_trainers_is_a_what_if_without_a_same_job(capsys):
    docs = {}
    for attention in ("flash", "math"):
        code, cap = run_cli(["plan", *GPT4, "--attention", attention, "--json"], capsys)
        assert code == 0
        docs[attention] = json.loads(cap.out)
    flash, math = docs["flash"], docs["math"]
    assert flash["train_command"].startswith("scalelab-train strategy=ddp model=gpt_nano")
    assert "train_command" not in math
    assert math["train_command_note"] == ("no same job: --attention math is a what-if: scalelab-train's SDPA runs "
                                          "the flash kernel on a gpu profile at dropout 0")
    # by hand: math stores the softmax output, bf16 2 bytes x 8 heads x 2048^2 x micro-batch 8 x 4 layers,
    # where flash stores its fp32 log-sum-exp, 4 bytes x 8 heads x 2048 x 8 x 4
    extra = 2 * 8 * 2048 ** 2 * 8 * 4 - 4 * 8 * 2048 * 8 * 4
    assert math["memory"]["activations_bytes_per_device"] - flash["memory"]["activations_bytes_per_device"] == extra


def test_flash_with_dropout_on_a_cpu_profile_is_a_what_if_too(capsys):
    code, cap = run_cli(["plan", "--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "256", "--seq-len",
                         "128", "--strategy", "single", "--global-batch", "4", "--hardware", "this_cpu",
                         "--attention", "flash", "--dropout", "0.1", "--json"], capsys)
    doc = json.loads(cap.out)
    assert code == 0 and "train_command" not in doc
    assert doc["train_command_note"].endswith("runs the math kernel on a cpu profile at dropout 0.1")


def test_a_listing_where_nothing_fits_exits_1(capsys, tmp_path):
    code, cap = run_cli(["plan", "--params", "70B", "--strategy", "ddp,single", "--devices", "8", "--global-batch",
                         "64", "--hardware", "h100_sxm"], capsys)
    assert code == 1 and cap.err == "error: none of ddp, single fits device memory as asked (the rows above)\n"
    code, cap = run_cli(["plan", "--params", "70B", "--strategy", "ddp,zero3", "--devices", "8", "--nodes", "4",
                         "--global-batch", "64", "--micro-batch", "1", "--activation-checkpointing", "full",
                         "--hardware", "h100_sxm"], capsys)
    assert code == 0 and cap.err == ""                     # zero3 fits: the listing answered
    # a refused row is not named; an offload row that fits its device but not the host's RAM says host
    code, cap = run_cli(["plan", "--params", "7B", "--strategy", "tp,zero3_offload", "--devices", "2",
                         "--global-batch", "2", "--activation-checkpointing", "full", "--vocab", "50257",
                         "--hardware", str(_small_host(tmp_path)), "--json"], capsys)
    rows = {d["inputs"]["strategy"]: d for d in json.loads(cap.out)}
    assert "refused" in rows["tp"] and not rows["zero3_offload"]["memory"]["fits"]
    assert code == 1 and cap.err == "error: none of zero3_offload fits device or host memory as asked (the rows above)\n"


def _small_host(tmp_path):
    """The H100 profile with 64 GiB of host RAM per node: a 7B model's offloaded states do not fit."""
    import yaml

    from scalelab.plan.spec import conf_dir

    d = yaml.safe_load((conf_dir() / "hardware" / "h100_sxm.yaml").read_text())
    d["host"]["memory_bytes"] = 64 * 2 ** 30
    (tmp_path / "small_host.yaml").write_text(yaml.safe_dump(d))
    return tmp_path / "small_host.yaml"


@pytest.mark.parametrize("key,value,says", [
    ("peak_flops.bf16", "fast", "peak_flops.bf16 must be a number > 0, got 'fast'"),
    ("peak_flops.bf16", 0, "peak_flops.bf16 must be a number > 0, got 0"),
    ("memory_bytes", "80GB", "memory_bytes must be a number > 0, got '80GB'"),
    ("memory_bytes", -1, "memory_bytes must be a number > 0, got -1"),
    ("compute_efficiency", 0, "compute_efficiency must be a number > 0, got 0"),
    ("host.memory_bandwidth_bytes_per_s", None, "host.memory_bandwidth_bytes_per_s must be a number > 0, got None"),
    ("intra_node.latency_s", -1e-6, "intra_node.latency_s must be a number >= 0, got -1e-06"),
    ("devices_per_node", 0, "devices_per_node must be a whole number >= 1, got 0"),
    ("strategy_overhead_s", [1], "strategy_overhead_s must be a mapping (key: value lines), got [1]"),
    ("host", {"link_bandwidth_bytes_per_s": 25e9}, "host lacks memory_bandwidth_bytes_per_s (the PCIe link per "
     "device; the node's host RAM bandwidth, which its ranks' offloaded optimizer steps share)"),
])
def test_a_profile_with_a_bad_figure_is_one_line_naming_it(capsys, tmp_path, key, value, says):
    import yaml

    from scalelab.plan.spec import conf_dir

    d = yaml.safe_load((conf_dir() / "hardware" / "h100_sxm.yaml").read_text())
    *path, last = key.split(".")
    node = d
    for k in path:
        node = node[k]
    node[last] = value
    prof = tmp_path / "bad.yaml"
    prof.write_text(yaml.safe_dump(d))
    code, cap = run_cli(["plan", "--params", "1B", "--strategy", "ddp", "--devices", "2", "--hardware", str(prof)],
                        capsys)
    assert code == 2 and cap.err == f"error: hardware profile '{prof}': {says}\n" and cap.out == ""


def test_an_infinite_rate_a_calibration_wrote_loads(tmp_path):
    """--calibrate writes .inf for a rate whose time term it fitted to 0 (calibrate.rate): a figure."""
    import yaml

    from scalelab.plan.hardware import load_hardware
    from scalelab.plan.spec import conf_dir

    d = yaml.safe_load((conf_dir() / "hardware" / "h100_sxm.yaml").read_text())
    d["collectives"] = {"all_reduce": {"bandwidth_bytes_per_s": float("inf"), "latency_s": 0.0}}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(d))
    assert load_hardware(str(tmp_path / "fit.yaml")).link(False, "all_reduce").bandwidth_bytes_per_s == float("inf")


@pytest.mark.parametrize("argv,says", [
    (["--validate", "{tmp}", "--strategy", "zero3"], "--strategy with --validate: it plans each run's own job from "
     "its record (it takes --hardware, --json, --tolerance, --as-planned); to plan a job, leave --validate out"),
    (["--validate", "{tmp}", "--tokens", "1e9"], "--tokens with --validate"),
    (["--calibrate", "{tmp}", "--precision", "bf16-mixed"], "--precision with --calibrate: it plans each run's own "
     "job from its record (it takes --hardware, --json, --out); to plan a job, leave --calibrate out"),
    (["--calibrate", "{tmp}", "--params", "7B"], "--params with --calibrate"),
    (["--probe", "--strategy", "ddp"], "--strategy with --probe: the probe measures this CPU and takes only --out"),
    (["--probe", "--hardware", "h100_sxm"], "--hardware with --probe"),
    (["--validate", "{tmp}", "--devices", "0"], "--devices with --validate"),      # 0 is a value given
])
def test_the_measured_modes_refuse_plan_flags(capsys, tmp_path, argv, says):
    code, cap = run_cli(["plan", *[a.format(tmp=tmp_path) for a in argv]], capsys)
    assert code == 2 and cap.err.startswith(f"error: {says}") and cap.err.count("\n") == 1, cap.err


def test_the_memory_note_says_the_peak_adds_an_early_gradient_partition(capsys):
    """ZeRO-1 of a 32 x 4096 GPT on 8 H100: its 6.9e9 gradients fill DeepSpeed's 2e8-element reduce
    bucket early in backward; the total adds them to every activation, and the note must say so."""
    argv = ["plan", "--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "50257", "--seq-len", "2048",
            "--strategy", "zero1", "--devices", "8", "--global-batch", "64", "--hardware", "h100_sxm"]
    code, cap = run_cli([*argv, "--json"], capsys)
    mem = json.loads(cap.out)["memory"]
    assert code == 1 and mem["gradients_at_peak"] is False and mem["activations_alive_at_gradients"] == 1.0
    parts = ("parameters", "gradients", "optimizer", "activations", "buffers", "runtime")
    assert mem["total_bytes_per_device"] == pytest.approx(sum(mem[f"{p}_bytes_per_device"] for p in parts))
    code, cap = run_cli(argv, capsys)
    assert ("  (the gradient partition is allocated early in backward, when the first reduce bucket fills: the "
            "peak holds it beside 100% of the activations)") in cap.out
    assert "the larger of gradients and activations" not in cap.out
