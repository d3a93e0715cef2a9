"""`scalelab recommend`: review findings. Bad input is one line, exit 2, before the search (nothing
planned, run or written); the CPU/GPU question is the profile's kind; the command printed is the
model planned and carries --train-arg; the LR check asks SLURM for the winner's devices; an MLP
verification is measured; a verification none of whose jobs started is an error. Expected figures
are worked out by hand."""
from __future__ import annotations

import json
import shlex

import pytest
import yaml

from scalelab.cli import build_parser
from scalelab.paths import conf_dir
from scalelab.plan.cli import _model_from_conf
from scalelab.plan.spec import ModelSpec
from scalelab.recommend import recommend as rec_mod
from scalelab.recommend import verify as V
from scalelab.recommend.cli import _request
from scalelab.recommend.rank import rank
from scalelab.recommend.recommend import measured_ranking, recommend, shortlist, trainer_check
from scalelab.recommend.space import Request, enumerate_candidates

from .test_recommend import GiB, cpu, gpu, small_request

# GPT 4 x 256, 4 heads, vocab 50,257, seq 2,048, untied head: 4 x (12 x 256^2 + 4 x 256) per layers,
# (2 x 50,257 + 2,048 + 2) x 256 embeddings, position table, head and final norm
N_4x256 = 4 * (12 * 256 ** 2 + 4 * 256) + (2 * 50257 + 2048 + 2) * 256


def args(*argv):
    return build_parser().parse_args(["recommend", *argv])


def refused(capsys, *argv) -> str:
    a = args(*argv)
    assert a.func(a) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.fixture
def workstation(tmp_path):
    """A CPU profile whose name says nothing of a CPU (kind: cpu), given as a path."""
    prof = {"name": "workstation", "kind": "cpu", "peak_flops": {"fp32": 1e11, "bf16": 2e11, "fp16": 3e9},
            "memory_bytes": 12 * GiB, "memory_bandwidth_bytes_per_s": 3.5e10,
            "intra_node": {"bandwidth_bytes_per_s": 1.3e9, "latency_s": 1e-4},
            "devices_per_node": 2, "runtime_memory_bytes": 3.5e8, "step_overhead_s": 0.003}
    path = tmp_path / "workstation.yaml"
    path.write_text(yaml.safe_dump(prof))
    return path


# ---------------------------------------------------------------------------- the model planned
def test_params_that_are_not_the_shapes_count_are_refused(capsys, tmp_path):
    assert N_4x256 == 29_406_208
    shape = ["--layers", "4", "--hidden", "256", "--heads", "4", "--devices", "8", "--hardware", "h200"]
    err = refused(capsys, *shape, "--params", "7B", "--global-batch", "64", "--out", str(tmp_path / "o"))
    assert "--params 7,000,000,000" in err and "builds 29,406,208 parameters" in err
    # 29.4M is the count rounded (0.02 % off): planned as the shape that runs, at its exact count
    req, _ = _request(args(*shape, "--params", "29.4M", "--out", str(tmp_path / "o")))
    assert req.model.n_params == N_4x256 and req.params_asked == 29.4e6
    assert not (tmp_path / "o").exists()


def test_the_trainer_check_compares_the_model():
    """A request planned at 7e9 for the 4 x 256 shape: its command builds 29,406,208 parameters."""
    model = ModelSpec.from_shape(4, 256, 4, 50257, 2048, n_params=7_000_000_000)
    req = Request(model, None, gpu(1000 * GiB), "test_gpu", 8, 1, (64,), ("bf16-mixed",), strategies=("ddp",),
                  checkpointing=("none",))
    c = rank(enumerate_candidates(req)[0], "throughput", req.hardware)[0]
    _, why = trainer_check(c, req)
    assert why == "these overrides build a 29,406,208-parameter model, not the 7,000,000,000 planned"


@pytest.mark.parametrize("shape", [["--params", "7B"], ["--layers", "48", "--seq-len", "4096"]])
def test_model_with_shape_flags_is_refused(capsys, shape):
    # (plan/cli.py's _model_shape_from_args, which recommend builds its model with, refuses it)
    err = refused(capsys, "--model", "gpt_nano", *shape)
    assert "--model gpt_nano with " + shape[0] in err


# ---------------------------------------------------------------------------- CPU or GPU: the kind
def test_a_cpu_profile_is_a_cpu_by_its_kind_not_its_name(workstation, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)      # no nvidia-smi: --verify must not ask for it
    req, _ = _request(args("--model", "gpt_nano", "--devices", "2", "--hardware", str(workstation), "--verify", "1",
                           "--out", str(tmp_path / "o")))
    assert req.is_cpu and req.precisions == ("32",)             # not bf16-mixed, a GPU profile's default
    cands, pruned = enumerate_candidates(req)
    assert not any("offload" in c.strategy for c in cands)
    assert any(k.startswith("zero3_offload: offload moves states to host memory") for k in pruned)


def test_a_gpu_profile_given_as_a_path_is_checked_as_a_gpu_job(tmp_path):
    prof = yaml.safe_load((conf_dir() / "hardware" / "h200.yaml").read_text())
    path = tmp_path / "mygpu.yaml"
    path.write_text(yaml.safe_dump({**prof, "name": "mygpu"}))
    req, _ = _request(args("--model", "gpt_nano", "--devices", "2", "--hardware", str(path), "--precision",
                           "fp16-mixed", "--strategies", "zero2", "--activation-checkpointing", "none",
                           "--out", str(tmp_path / "o")))
    assert req.hardware.kind == "gpu"
    shown, rejected = shortlist(rank(enumerate_candidates(req)[0], "throughput", req.hardware), req, 1)
    # was: "DeepSpeed fp16 needs a GPU" for every ZeRO layout (checked as a CPU job)
    assert rejected == [] and [c.strategy for c, _ in shown] == ["zero2"]
    assert "trainer.precision=16-mixed" in shown[0][1]


# ---------------------------------------------------------------------------- numbers and flags
@pytest.mark.parametrize("argv,named", [
    (["--budget-minutes", "nan", "--tokens", "1e9"], "--budget-minutes nan"),
    (["--budget-minutes", "inf", "--tokens", "1e9"], "--budget-minutes inf"),
    (["--base-lr", "inf"], "--base-lr inf"),
    (["--base-lr", "nan"], "--base-lr nan"),
    (["--memory-headroom", "nan"], "--memory-headroom nan"),
    (["--memory-headroom=-inf"], "--memory-headroom -inf"),
])
def test_nonsense_numbers_are_refused(capsys, tmp_path, argv, named):
    err = refused(capsys, "--model", "gpt_nano", "--devices", "2", "--hardware", "h200", *argv,
                  "--out", str(tmp_path / "o"))
    assert named in err and "give a" in err
    assert not (tmp_path / "o").exists()


def test_strategies_that_cannot_run_on_the_devices_are_refused(capsys, tmp_path):
    err = refused(capsys, "--model", "gpt_nano", "--devices", "2", "--hardware", "h200", "--strategies", "single",
                  "--out", str(tmp_path / "o"))
    assert "single: runs on 1 device" in err and "2 device(s)" in err and "fit device memory" not in err


def test_an_out_folder_holding_files_is_refused(capsys, tmp_path):
    (tmp_path / "recommendation.json").write_text('{"earlier": true}\n')
    err = refused(capsys, "--model", "gpt_nano", "--devices", "2", "--hardware", "h200", "--out", str(tmp_path))
    assert f"--out {tmp_path} is not empty (recommendation.json)" in err
    assert (tmp_path / "recommendation.json").read_text() == '{"earlier": true}\n'


# ---------------------------------------------------------------------------- --train-arg
@pytest.mark.parametrize("arg,flag", [
    ("strategy=zero3", "--strategies"), ("+strategy.stage=3", "--strategies"), ("trainer.devices=4", "--devices"),
    ("trainer.num_nodes=2", "--nodes"), ("data.global_batch_size=32", "--global-batch"),
    ("data.micro_batch_size=4", "split"), ("trainer.precision=bf16-mixed", "--precision"),
    ("model=gpt_small", "--model"), ("optim=sgd", "--optimizer"), ("optim.lr=0.1", "--base-lr"),
    ("lr_scaling=linear", "LR advice"), ("lr_scaling.warmup_steps=5", "LR advice"),
    ("model.arch.activation_checkpointing=full", "--activation-checkpointing"),
])
def test_train_args_recommend_sets_are_refused_before_the_search(capsys, tmp_path, monkeypatch, arg, flag):
    monkeypatch.setattr(rec_mod, "enumerate_candidates", lambda req: pytest.fail("searched"))
    err = refused(capsys, "--model", "gpt_nano", "--devices", "2", "--hardware", "h200", "--train-arg", arg,
                  "--out", str(tmp_path / "o"))
    assert err.startswith(f"error: --train-arg {arg}: recommend chooses ") and flag in err


@pytest.mark.parametrize("arg,named", [("trainer.max_stepz=3", "did you mean trainer.max_steps"),
                                       ("trainer.log_every_n_steps=2,4", "a sweep value"),
                                       # review 2026-12-04: its sweep of trainer.devices=1,2 ran each
                                       # candidate at 1 and 2 ranks, their median its measured figure
                                       ("experiment=weak_scaling", "experiment=weak_scaling is a sweep "
                                        "(trainer.devices=1,2): recommend runs one job per candidate")])
def test_a_bad_train_arg_is_refused_before_the_search(capsys, tmp_path, monkeypatch, arg, named):
    monkeypatch.setattr(rec_mod, "enumerate_candidates", lambda req: pytest.fail("searched"))
    err = refused(capsys, "--model", "gpt_nano", "--devices", "2", "--hardware", "h200", "--train-arg", arg,
                  "--out", str(tmp_path / "o"))
    assert named in err and "--train-arg" in err
    assert not (tmp_path / "o").exists()


def test_an_accepted_train_arg_is_in_the_printed_command(capsys, tmp_path):
    a = args("--model", "gpt_nano", "--devices", "2", "--hardware", "h200", "--strategies", "ddp",
             "--activation-checkpointing", "none", "--train-arg", "trainer.log_every_n_steps=5", "--out", str(tmp_path))
    assert a.func(a) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert shlex.split(last)[-1] == "trainer.log_every_n_steps=5"
    assert json.loads((tmp_path / "recommendation.json").read_text())["winner"]["command"] == last


# ---------------------------------------------------------------------------- verification
def _verified(tps_of):
    """A stand-in for recommend._verify: each candidate measured at tps_of(candidate) tokens/s."""
    def fake(chosen, doc, req, objective, tokens, steps, repeats, out, extra, slurm, say):
        cands = [c for c, _ in chosen]
        recs = {i: [{"status": "completed", "throughput": {"tokens_per_s": tps_of(c)},
                     "step_time_s": {"median": 2048 / tps_of(c)}, "loss": {"final": 3.0},
                     "job": {"num": i, "overrides": [f"+recommend_candidate=c{i}"]}}] for i, c in enumerate(cands)}
        ranking, best, note = measured_ranking(cands, recs, objective, req, tokens)
        return ({"k": len(cands), "steps": steps, "repeats": repeats, "argv": ["-m"], "wall_s": 1.0, "returncode": 0,
                 "sweep_dir": str(out / "verify"),
                 "ranking": ranking, "measured_best_index": best, "measured_best": cands[best].label(),
                 "note": note}, [], [])
    return fake


def test_the_lr_check_asks_slurm_for_the_winners_devices(tmp_path, monkeypatch):
    """The cost objective also searches 1 device: single on 1 and ddp on 2. The one the planner put
    second is measured best; its LR-check jobs ask for its devices, not the planner's first's."""
    req = small_request(hardware=gpu(80 * GiB), hardware_name="test_gpu", strategies=("single", "ddp"),
                        smaller_worlds=True)
    first = rank(enumerate_candidates(req)[0], "cost", req.hardware)[0]
    other = 2 if first.devices == 1 else 1
    argvs = []
    monkeypatch.setattr(V, "preflight_or_raise", lambda argv: None)
    monkeypatch.setattr(V, "run_multirun", lambda argv, log: argvs.append(argv) or 0)
    monkeypatch.setattr(rec_mod, "_verify", _verified(lambda c: 9e4 if c.devices == other else 1e3))
    doc = recommend(req, objective="cost", verify=2, lr_check="grid", slurm=True, base_lr=3e-3, base_batch=16,
                    out=tmp_path)
    assert doc["winner"]["world_size"] == other and doc["ranking"][0]["world_size"] == first.devices
    # scalelab's SLURM launcher asks each job's own trainer.devices GPUs (hydra.launcher.gpus_per_node=auto)
    assert len(argvs) == 1 and "hydra/launcher=slurm" in argvs[0] and f"trainer.devices={other}" in argvs[0]
    assert not any("gpus_per_node" in x or "submitit" in x for x in argvs[0])


def test_an_mlp_run_is_measured_from_samples_per_s():
    """conf/model/mlp.yaml (classify): the planner's seq_len is 1, so 16 samples a 0.02 s step are
    800 tokens/s predicted; the run records tokens_per_s null and samples_per_s 640 -> 640 measured."""
    mlp = _model_from_conf("mlp")
    assert (mlp.kind, mlp.seq_len) == ("mlp", 1)
    req = Request(mlp, "mlp", cpu(), "this_cpu", 2, global_batches=(16,), strategies=("ddp",), checkpointing=("none",))
    c = enumerate_candidates(req)[0][0]
    c.times = {**c.times, "step_s": 0.02}
    rec = {"status": "completed", "throughput": {"samples_per_s": 640.0, "tokens_per_s": None},
           "step_time_s": {"median": 0.025}, "loss": {"final": 2.3}, "job": {"num": 0}}
    row = V.measured_row(c, [rec], "throughput", req.hardware, None)
    assert row["status"] == "completed" and row["predicted_tokens_per_s"] == pytest.approx(800)
    assert row["measured_tokens_per_s"] == 640 and row["measured_score"] == 640


def test_slurm_verification_of_a_cpu_profile_asks_no_gpus_and_none_started_is_an_error(
        capsys, tmp_path, monkeypatch, workstation):
    argvs = []

    def sbatch_refused(argv, log):
        argvs.append(argv)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("error: sbatch: Invalid generic resource (gres) specification\n")
        return 1

    monkeypatch.setattr(V, "preflight_or_raise", lambda argv: None)
    monkeypatch.setattr(V, "run_multirun", sbatch_refused)
    a = args("--model", "gpt_nano", "--devices", "2", "--hardware", str(workstation), "--strategies", "ddp",
             "--activation-checkpointing", "none", "--verify", "1", "--slurm", "--out", str(tmp_path / "o"))
    assert a.func(a) == 1
    assert len(argvs) == 1                                     # no LR check after it
    assert "hydra/launcher=slurm" in argvs[0] and "trainer.accelerator=cpu" in argvs[0]   # CPU jobs: no GPUs asked
    assert not any("gpus_per_node" in x for x in argvs[0])
    doc = json.loads((tmp_path / "o" / "recommendation.json").read_text())
    assert doc["winner"] is None and doc["ranking"][0]["strategy"] == "ddp"     # the planner's part kept
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: " + doc["error"]
    assert doc["error"].startswith("no verification job started (scalelab-train exited 1): error: sbatch: Invalid")


def test_optimizer_settings_recommend_does_not_choose_are_free():
    """`--optimizer` picks optim=NAME and the advice optim.lr; the optimizer's own settings are the
    user's (optim.optimizer.weight_decay was refused with 'set it with --optimizer')."""
    from scalelab.recommend.verify import set_by

    assert set_by("optim.optimizer.weight_decay") is None and set_by("optim.fused_on_gpu") is None
    assert set_by("optim") == "--optimizer" and set_by("optim.lr") == "--base-lr"
    assert set_by("lr_scaling.decay") is not None and set_by("strategy.bucket_cap_mb") == "--strategies"
