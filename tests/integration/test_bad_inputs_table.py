"""Mistaken or hostile inputs to scalelab-train, scalelab plan and scalelab compare: each exits 2
with one line (no traceback), starts no rank and writes nothing (issue 13).

Most rows run in-process (scalelab.preflight.preflight for the trainer, scalelab.cli.main for
plan and compare: the code the commands run, without a ~3 s interpreter start each); a handful
run the real commands as subprocesses. The schema behind the trainer rows: src/scalelab/schema.py.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight

from ..conftest import TRAIN, env, worker_pids

# (overrides, a piece of the one-line error). Classes: values only a rank used to check (optimizer,
# model shape, resume path, data, fractions), wrong types, values silently replaced, zero timeouts.
TRAIN_ROWS = [
    (["optim.lr=abc"], "optim.lr='abc' must be a number > 0"),
    (["-m", "strategy=ddp,fsdp", "--cfg", "job"], "-m and --cfg cannot be combined"),  # Hydra: a ValueError traceback
    (["strategy=ddp,fsdp"], "strategy=ddp,fsdp: several values make a sweep (scalelab-train -m ...)"),
    (["optim.lr=0"], "optim.lr=0 must be a number > 0"),
    (["optim.lr=-1"], "optim.lr=-1 must be a number > 0"),
    (["optim.optimizer.betas=[1.5,0.9]"], "optim.optimizer.betas=[1.5, 0.9] must be a list of 2 numbers in [0, 1)"),
    (["optim.optimizer.betas=abc"], "optim.optimizer.betas='abc' must be a list"),
    (["optim.optimizer.eps=-1"], "optim.optimizer.eps=-1 must be a number > 0"),
    (["optim.optimizer.weight_decay=-0.1"], "optim.optimizer.weight_decay=-0.1 must be a number >= 0"),
    (["optim=sgd", "optim.optimizer.momentum=1.5"], "optim.optimizer.momentum=1.5 must be a number in [0, 1)"),
    (["optim=sgd", "optim.optimizer.momentum=0", "+optim.optimizer.nesterov=true"],
     "torch.optim.SGD) refused its arguments: Nesterov momentum requires a momentum"),
    (["+optim.optimizer.foo=1"], "unexpected keyword argument 'foo'"),
    # Lightning's mixed precision raised at the first step (after the ranks started)
    (["strategy=ddp", "optim.optimizer.fused=true", "trainer.gradient_clip_val=1.0", "trainer.precision=bf16-mixed"],
     "optim.optimizer.fused=true with trainer.gradient_clip_val=1.0 under trainer.precision=bf16-mixed: Lightning's "
     "mixed precision cannot clip"),
    (["model.arch.n_heads=5"], "model.arch.n_heads=5 does not divide model.arch.d_model=64"),
    (["model.arch.n_heads=0"], "model.arch.n_heads=0 must be an integer >= 1"),
    (["model.arch.d_model=0"], "model.arch.d_model=0 must be an integer >= 1"),
    (["model.arch.n_layers=-1"], "model.arch.n_layers=-1 must be an integer >= 1"),
    (["model.arch.seq_len=0"], "model.arch.seq_len=0 must be an integer >= 1"),
    (["model.arch.vocab_size=100"], "model.arch.vocab_size=100 must be an integer >= 256"),
    (["model.arch.dropout=1"], "model.arch.dropout=1 must be a number in [0, 1)"),
    (["model.arch.n_layers=two"], "model.arch.n_layers='two' must be an integer >= 1"),
    (["model.arch.activation_checkpointing=sometimes"], "is not valid: choose one of none, selective, full"),
    (["model=mlp", "model.arch.hidden=[0]"], "model.arch.hidden=[0] must be a list of integers >= 1"),
    (["checkpoint.resume_from=/no/such/last.ckpt"], "checkpoint.resume_from='/no/such/last.ckpt' does not exist"),
    (["data.val_fraction=1.5"], "data.val_fraction=1.5 must be a number in [0, 1)"),
    (["data.val_fraction=-0.1"], "data.val_fraction=-0.1 must be a number in [0, 1)"),
    (["data=text_files", "data.files=notes.txt"], "data.files='notes.txt' must be a list of text files or folders"),
    (["data.global_batch_size=sixteen"], "data.global_batch_size='sixteen' must be an integer >= 1"),
    (["data.micro_batch_size=abc"], "data.micro_batch_size='abc' must be an integer >= 1"),
    (["data.num_workers=-1"], "data.num_workers=-1 must be an integer >= 0"),
    (["trainer.timeout_s=0"], "trainer.timeout_s=0 must be a number > 0"),
    (["trainer.timeout_s=soon"], "trainer.timeout_s='soon' must be a number > 0"),
    (["trainer.max_steps=0"], "trainer.max_steps=0 must be an integer >= 1"),
    (["trainer.max_steps=1e3"], "trainer.max_steps=1000.0 must be an integer >= 1"),
    (["trainer.devices=two"], "trainer.devices='two' must be an integer >= 1"),
    (["trainer.precision=true"], "trainer.precision=True is not valid: choose one of 32-true"),
    (["trainer.accelerator=tpu"], "trainer.accelerator='tpu' is not valid: choose one of auto, cpu, gpu, cuda"),
    (["trainer.threads_per_rank=0"], "trainer.threads_per_rank=0 must be null"),
    (["trainer.val_every_n_steps=often"], "trainer.val_every_n_steps='often' must be an integer >= 1"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1 must be a number >= 0"),
    (["trainer.profile_steps=-1"], "trainer.profile_steps=-1 must be an integer >= 0"),
    (["trainer.enable_progress_bar=maybe"], "trainer.enable_progress_bar='maybe' must be a boolean"),
    (["seed=abc"], "seed='abc' must be an integer in [0, 4294967295]"),
    (["seed=-1"], "seed=-1 must be an integer in [0, 4294967295]"),
    (["verbose=yes"], "verbose='yes' must be a boolean"),
    (["hardware_profile=my_cpu"], "hardware_profile='my_cpu' is not valid: choose one of auto"),
    (["logger=wandb", "logger.mode=sometimes"], "logger.mode='sometimes' is not valid: choose one of offline"),
    (["logger=wandb", "logger.tags=fast"], "logger.tags='fast' must be a list of non-empty strings"),
    (["launcher=srun", "launcher.extra_args=--exclusive"], "launcher.extra_args='--exclusive' must be a list"),
    (["lr_scaling=linear", "lr_scaling.warmup_steps=1.5"], "lr_scaling.warmup_steps=1.5 must be a number >= 0"),
    (["lr_scaling=linear", "lr_scaling.warmup_steps=abc"], "lr_scaling.warmup_steps='abc' must be a number >= 0"),
    (["lr_scaling=linear", "lr_scaling.min_lr_ratio=2"], "lr_scaling.min_lr_ratio=2 must be a number in [0, 1]"),
    (["lr_scaling=linear", "lr_scaling.base_batch_size=abc"], "lr_scaling.base_batch_size='abc' must be an integer"),
    (["strategy=fsdp", "trainer.devices=2", "strategy.reshard_after_forward=no"],
     "strategy.reshard_after_forward='no' must be a boolean"),
    # SHARD_GRAD_OP named fsdp in every table (found by review)
    (["strategy=fsdp", "trainer.devices=2", "strategy.reshard_after_forward=false"],
     "strategy=fsdp: strategy.reshard_after_forward=false is strategy=fsdp_grad_op's"),
    (["strategy=fsdp_grad_op", "trainer.devices=2", "strategy.reshard_after_forward=true"],
     "use strategy=fsdp"),
    (["strategy=ddp", "strategy.static_graph=1"], "strategy.static_graph=1 must be a boolean"),
    (["strategy=ddp", "strategy.bucket_cap_mb=big"], "strategy.bucket_cap_mb='big' must be a number > 0"),
    (["strategy=ddp", "strategy.comm_hook=true"], "strategy.comm_hook=True is not valid: choose one of none"),
    (["strategy=zero2", "strategy.stage=two"], "strategy.stage='two' is not a ZeRO stage: choose one of 1, 2, 3"),
    (["strategy=zero2", "strategy.overlap_comm=abc"], "strategy.overlap_comm='abc' must be a boolean"),
    (["strategy=zero3", "strategy.stage3_fetch_unit=layer"],
     "strategy.stage3_fetch_unit='layer' is not a fetch unit: choose one of block, module"),
    (["strategy=zero2", "+strategy.stage3_fetch_unit=block"], "strategy.stage3_fetch_unit applies to ZeRO stage 3 only"),
    (["strategy=pipeline", "trainer.devices=2", "strategy.microbatches=0"], "strategy.microbatches=0 must be an"),
    (["strategy=tp", "strategy.tensor_parallel_size=all"], "strategy.tensor_parallel_size='all' must be a positive"),
    (["checkpoint.save=maybe"], "checkpoint.save='maybe' must be a boolean"),
    (["-m", "strategy=single,ddp", "optim.lr=0.1,0"], "optim.lr=0 must be a number > 0"),
    # a misspelled key: Hydra's own advice (`+trainer.max_step=10`) added a key nothing read, and
    # the run went on with the default 30 steps
    (["trainer.max_step=10"], "trainer.max_step is not a key of trainer: did you mean trainer.max_steps?"),
    (["+trainer.max_step=10"], "trainer.max_step is not a key of trainer: did you mean trainer.max_steps?"),
    (["+data.globl_batch_size=8"], "data.globl_batch_size is not a key of data: did you mean data.global_batch_size?"),
    (["+checkpoint.every_n_step=5"], "did you mean checkpoint.every_n_steps?"),
    (["model.arch.d_modl=64"], "model.arch.d_modl is not set in model.arch: did you mean model.arch.d_model?"),
    # outside those groups a new key can mean something (SGD's nesterov): Hydra's way to add it stays
    (["optim=sgd", "optim.optimizer.nesterov=true"], "a new key is added with +optim.optimizer.nesterov=VALUE"),
    (["data=hub", "data.hub_name.x=1"], "data.hub_name is a value (???), not a group of keys"),
    (["trainer.max_steps.x=1"], "trainer.max_steps is a value (30), not a group of keys"),
]


@pytest.fixture()
def clean_dir(tmp_path, monkeypatch):
    """Run in an empty folder with an empty data cache: a rejected input writes nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize("args,needle", TRAIN_ROWS, ids=[" ".join(a) for a, _ in TRAIN_ROWS])
def test_train_bad_input_is_one_line_before_any_rank(args, needle, clean_dir):
    with pytest.raises(ConfigError) as e:
        preflight(args)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg
    assert list(clean_dir.iterdir()) == []  # no job dir, no data prepared, nothing written


def test_a_data_file_with_no_usable_text(clean_dir):
    (clean_dir / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match=r"^data.files: '.*empty.txt' is empty \(give text files or folders\)$") as e:
        preflight(["data=text_files", f"data.files=[{clean_dir / 'empty.txt'}]"])
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in clean_dir.iterdir()) == ["empty.txt"] or \
        not any((clean_dir / "cache").rglob("meta.json"))  # nothing prepared


def _cli(argv, capsys) -> tuple[int, str]:
    from scalelab.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


PLAN_ROWS = [
    (["optim.lr=abc"], "optim.lr='abc' must be a number > 0"),
    (["model.arch.n_heads=5"], "model.arch.n_heads=5 does not divide"),
    (["trainer.timeout_s=0"], "trainer.timeout_s=0 must be a number > 0"),
    (["strategy=fsdp", "trainer.devices=2", "strategy.reshard_after_forward=no"], "must be a boolean"),
    (["optim.optimizer.betas=[0.9,1.2]"], "optim.optimizer.betas=[0.9, 1.2]"),
    (["--params", "-5", "--strategy", "ddp", "--devices", "2"], "'-5' is not a count: valid: a finite number > 0"),
    (["--params", "7B", "--strategy", "bogus", "--devices", "2"], "unknown strategy 'bogus'"),
    (["--params", "7B", "--strategy", "ddp", "--devices", "0"], "--devices must be >= 1"),
    (["--layers", "2", "--hidden", "65", "--heads", "4", "--vocab", "256", "--seq-len", "64", "--strategy", "ddp",
      "--devices", "2"], "--heads 4 does not divide --hidden 65"),
    # a size given as 0 was the default silently; a huge one ran for minutes (found by a planner review)
    (["--layers", "2", "--hidden", "64", "--heads", "2", "--seq-len", "0", "--strategy", "ddp", "--devices", "2"],
     "--seq-len must be a positive integer, got 0"),
    (["--layers", "2", "--hidden", "64", "--heads", "2", "--ffn-hidden", "-5", "--strategy", "ddp", "--devices", "2"],
     "--ffn-hidden must be a positive integer, got -5"),
    (["--params", "1e24", "--strategy", "ddp", "--devices", "8"], "--params 1e+24 is beyond what the planner models"),
    # argparse's own errors: one line too (it printed its ~20-line usage first)
    (["--params", "7Q", "--strategy", "ddp"], "argument --params: not a number: '7Q'"),
    (["--params", "7B", "--strategy", "ddp", "--devices", "two"], "argument --devices: invalid int value: 'two'"),
]


@pytest.mark.parametrize("args,needle", PLAN_ROWS, ids=[" ".join(a) for a, _ in PLAN_ROWS])
def test_plan_bad_input_is_one_line(args, needle, clean_dir, capsys):
    code, err = _cli(["plan", *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert list(clean_dir.iterdir()) == []


GOOD = {"status": "completed", "strategy": "ddp", "world_size": 1, "global_batch_size": 16,
        "per_device_batch_size": 16, "accumulate_grad_batches": 1, "lr": 0.003, "parallel": {"dp": 1},
        "throughput": {"samples_per_s": 100.0, "tokens_per_s": 6400.0}, "step_time_s": {"median": 0.1, "p90": 0.12},
        "memory": {"peak_rss_bytes_per_rank": [2**28], "model_state_bytes_per_rank": [2**20]},
        "loss": {"first": 5.5, "final": 3.1, "curve": [[1, 5.5], [2, 3.1]]},
        "config": {"strategy": {"name": "ddp"}, "trainer": {"devices": 1}}}
# (name, run.json text, a piece of the reason)
BAD_RECORDS = [
    ("truncated", json.dumps(GOOD)[:57], "not valid JSON (truncated or corrupt)"),
    ("list", json.dumps([GOOD]), "a JSON list, not an object"),
    ("no_throughput", json.dumps({k: v for k, v in GOOD.items() if k != "throughput"}), "missing key 'throughput'"),
    ("empty", "", "not valid JSON"),
    ("string_world", json.dumps({**GOOD, "world_size": "two"}), "world_size=\"two\" is not an integer >= 1"),
    ("throughput_list", json.dumps({**GOOD, "throughput": [100.0]}), "throughput=[100.0] is not an object"),
    ("text_throughput", json.dumps({**GOOD, "throughput": {"samples_per_s": "fast"}}),
     "throughput.samples_per_s=\"fast\" is not a number or null"),
    ("job_string", json.dumps({**GOOD, "job": "s/0"}), "job=\"s/0\" is not an object"),
    ("null", "null", "a JSON NoneType, not an object"),
    ("binary", b"\xff\xfe\x00garbage", "not UTF-8 text"),
]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)


@pytest.mark.parametrize("name,text,reason", BAD_RECORDS, ids=[r[0] for r in BAD_RECORDS])
def test_compare_bad_record_alone_exits_2(name, text, reason, tmp_path, capsys):
    _write(tmp_path / "sweep" / "0" / "run.json", text)
    code, err = _cli(["compare", str(tmp_path / "sweep")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert lines[0] == f"skipped {tmp_path / 'sweep' / '0' / 'run.json'}: " + lines[0].split(": ", 1)[1]
    assert reason in lines[0], lines[0]
    assert lines[1:] == [f"error: no readable run.json under {tmp_path / 'sweep'} (1 skipped)"]


def test_compare_missing_path_is_one_line(tmp_path, capsys):
    code, err = _cli(["compare", str(tmp_path / "nope")], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "does not exist" in err


@pytest.fixture()
def mixed_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    _write(sweep / "0" / "run.json", json.dumps({**GOOD, "job": {"name": "s/0", "sweep_dir": str(sweep)}}))
    _write(sweep / "1" / "run.json", json.dumps({**GOOD, "world_size": 2, "parallel": {"dp": 2},
                                                 "throughput": {"samples_per_s": 150.0, "tokens_per_s": None},
                                                 "config": {"strategy": {"name": "ddp"}, "trainer": {"devices": 2}},
                                                 "job": {"name": "s/1", "sweep_dir": str(sweep)}}))
    for i, (name, text, _) in enumerate(BAD_RECORDS[:3], start=2):
        _write(sweep / str(i) / "run.json", text)
    return sweep


def test_compare_skips_bad_records_and_shows_the_good(mixed_sweep, capsys):
    code, err = _cli(["compare", str(mixed_sweep)], capsys)
    # _cli read the captured output: the table was printed before, in the same capture
    assert code == 0, err
    skipped = [ln for ln in err.splitlines() if ln.startswith("skipped ")]
    assert len(skipped) == 3 and err.strip().splitlines() == skipped, err
    for i, (_, _, reason) in enumerate(BAD_RECORDS[:3], start=2):
        assert any(str(mixed_sweep / str(i) / "run.json") in ln and reason in ln for ln in skipped), (i, skipped)


def test_compare_table_has_both_good_rows(mixed_sweep):
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(mixed_sweep), "--format", "json"],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    rows = json.loads(proc.stdout)
    assert sorted(r["job"]["name"] for r in rows) == ["s/0", "s/1"]
    assert next(r for r in rows if r["world_size"] == 2)["scaling_efficiency"] == pytest.approx(0.75)
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("skipped ")]) == 3


def test_aggregate_counts_skipped_records(mixed_sweep, capsys):
    from scalelab.results.sweep import aggregate

    s = aggregate(mixed_sweep, write=False)
    assert s["num_runs"] == 2 and s["num_skipped"] == 3 and len(s["skipped"]) == 3
    code, err = _cli(["aggregate", str(mixed_sweep)], capsys)
    assert code == 0 and "Traceback" not in err
    assert json.loads((mixed_sweep / "sweep.json").read_text())["num_skipped"] == 3


def test_aggregate_with_only_bad_records_exits_2(tmp_path, capsys):
    for i, (_, text, _) in enumerate(BAD_RECORDS[:3]):
        _write(tmp_path / str(i) / "run.json", text)
    code, err = _cli(["aggregate", str(tmp_path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 4 and lines[-1].startswith("error:") and "(3 skipped)" in lines[-1], err
    assert not (tmp_path / "sweep.json").exists()


# The real commands, as a user types them: exit 2, one line, no rank, nothing written.
SUBPROCESS_ROWS = [
    (TRAIN, ["optim.lr=abc"], "optim.lr='abc' must be a number > 0"),
    (TRAIN, ["trainer.timeout_s=0"], "trainer.timeout_s=0 must be a number > 0"),
    (TRAIN, ["-m", "strategy=single,ddp", "trainer.devices=1,2", "model.arch.n_heads=3"],
     "model.arch.n_heads=3 does not divide"),
    # Hydra's get_class logged 3 lines of its own first, and the message was cut at its first line
    # (the resume_from row that was here runs in-process above)
    (TRAIN, ["strategy._target_=nosuch.mod.DDP"], "strategy=ddp: Error loading 'nosuch.mod.DDP': "
                                                  "ModuleNotFoundError(\"No module named 'nosuch'\")"),
    ([sys.executable, "-m", "scalelab.cli", "plan"], ["optim.optimizer.eps=-1"], "optim.optimizer.eps=-1"),
    # Hydra launched 0 jobs, exit 0, and wrote the sweep folder's multirun.yaml
    (TRAIN, ["-m", "trainer.devices=range(2,1)"], "the sweep expands to 0 jobs (trainer.devices=range(2,1) is empty)"),
    (TRAIN, ["=5"], "'=5' has no key"),   # a ValueError traceback
    # every Optuna trial failed in its job with a ConfigError traceback (67 lines)
    (TRAIN, ["-m", "experiment=lr_search", "optim.lr=choice(-1,-2)"],
     "optim.lr=-1 must be a number > 0 (the base LR at lr_scaling.base_batch_size) [search space: optim.lr="),
]


# Rows whose value is also refused in-process above (or in tests/unit/test_bad_inputs_train.py) run
# with -m slow: the command's own path (main -> preflight -> one line, exit 2) is the kept rows'.
SLOW_ROWS = {"trainer.timeout_s=0", "-m strategy=single,ddp trainer.devices=1,2 model.arch.n_heads=3", "=5",
             "-m trainer.devices=range(2,1)"}


@pytest.mark.parametrize("cmd,args,needle", [
    pytest.param(*row, id=" ".join(row[1]), marks=pytest.mark.slow if " ".join(row[1]) in SLOW_ROWS else ())
    for row in SUBPROCESS_ROWS])
def test_real_commands_reject_in_one_line(cmd, args, needle, tmp_path):
    e = env()
    e["SCALELAB_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([*cmd, *args], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [] and not worker_pids(tmp_path)  # no job dir, no cache, no rank
