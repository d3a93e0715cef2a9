"""The flag form of `scalelab plan` (and `recommend`) plans the GPT that scalelab-train builds
(models/gpt.py: bias-free Linears, an untied lm_head), so that its figures are those of the
`scalelab-train` command it prints, and of `scalelab plan` on that command. Walkthrough: the flags
`--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 64` said 121k parameters and 1.84 MiB of
states where the printed job (gpt_nano's shape) has 135,808 and 2.07 MiB; the README's 32 x 4096
6.66G where the job has 6.86G; `--params 7B` planned 7.0G and printed a 34 x 4096 job of 7.27G."""
from __future__ import annotations

import argparse
import json
import shlex

import pytest
import torch

from scalelab.cli import build_parser
from scalelab.models.gpt import GPT, GPTConfig
from scalelab.plan import cli
from scalelab.plan.spec import ModelSpec

NANO_FLAGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "64"]


def plan_json(capsys, *argv):
    """`scalelab plan ARGV --json` through the real entry point (KEY=VALUE needs its job builder)."""
    args = build_parser().parse_args(["plan", *argv, "--json"])
    code = args.func(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def real_count(L, h, heads, V, s, ratio=4) -> int:
    with torch.device("meta"):          # no memory, no init: only the parameters' shapes
        model = GPT(GPTConfig(n_layers=L, n_heads=heads, d_model=h, seq_len=s, vocab_size=V, mlp_ratio=ratio))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape,by_hand", [
    # per block 4 h^2 (q, k, v, out) + 2 h (4h) (MLP) + 4 h (2 LayerNorms); + V h + s h (embeddings)
    # + 2 h (final LayerNorm) + V h (untied head)
    ((2, 64, 4, 256, 64), 2 * (4 * 64 * 64 + 2 * 64 * 256 + 4 * 64) + 2 * 256 * 64 + 64 * 64 + 2 * 64),   # 135,808
    ((4, 256, 4, 256, 128), 4 * (4 * 256 ** 2 + 2 * 256 * 1024 + 4 * 256) + 2 * 256 * 256 + 128 * 256 + 512),
    ((32, 4096, 32, 50257, 2048), 32 * (4 * 4096 ** 2 + 2 * 4096 * 16384 + 4 * 4096) + 2 * 50257 * 4096
     + 2048 * 4096 + 2 * 4096),
])
def test_trainer_count_is_the_real_models(shape, by_hand):
    L, h, heads, V, s = shape
    assert ModelSpec.trainer_gpt_params(L, h, V, s) == by_hand == real_count(L, h, heads, V, s)
    assert ModelSpec.trainer_gpt(L, h, heads, V, s).n_params == by_hand


def test_gpt_nano_flags_plan_the_printed_job(capsys):
    flags = plan_json(capsys, *NANO_FLAGS, "--strategy", "ddp", "--devices", "2", "--global-batch", "32",
                      "--hardware", "this_cpu", "--precision", "32")
    assert flags["inputs"]["model"]["n_params"] == 135_808            # was 121k (tied head, biases)
    # ddp, fp32 Adam: 4 + 4 + 8 bytes a parameter, replicated: 16 x 135,808 = 2,172,928 B = 2.07 MiB
    assert flags["memory"]["model_states_bytes_per_device"] == 16 * 135_808
    job = plan_json(capsys, *shlex.split(flags["train_command"])[1:])
    assert job["inputs"]["model"]["n_params"] == 135_808
    for key in ("memory", "time", "comm", "flops", "throughput", "mfu"):
        assert job[key] == flags[key], key


def test_the_readme_7b_shape_is_the_job_it_prints(capsys):
    flags = plan_json(capsys, "--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "50257",
                      "--seq-len", "2048", "--strategy", "zero3", "--devices", "8", "--nodes", "4",
                      "--micro-batch", "2", "--global-batch", "512", "--precision", "bf16-mixed",
                      "--hardware", "h100_sxm")
    n = 32 * (4 * 4096 ** 2 + 2 * 4096 * 16384 + 4 * 4096) + 2 * 50257 * 4096 + 2048 * 4096 + 2 * 4096
    assert flags["inputs"]["model"]["n_params"] == n == 6_863_077_376   # 6.86G, not 6.66G
    job = plan_json(capsys, *shlex.split(flags["train_command"])[1:])
    assert job["inputs"]["model"]["n_params"] == n
    assert job["time"] == flags["time"] and job["memory"] == flags["memory"]


def test_params_pick_a_shape_and_plan_its_exact_count(capsys):
    """--params 7B: width 4096 (from_params' rule); layers nearest to 7e9 for scalelab's GPT:
    (7e9 - (2 x 50257 + 2048 + 2) x 4096) / (12 x 4096^2 + 4 x 4096) = 32.68 -> 33 layers, planned
    at 33 x 201,342,976 + 420,102,144 = 7,064,420,352 (not 7e9: the shape is what runs)."""
    per_layer = 12 * 4096 ** 2 + 4 * 4096
    rest = (2 * 50257 + 2048 + 2) * 4096
    assert round((7e9 - rest) / per_layer) == 33
    n = 33 * per_layer + rest
    assert n == 7_064_420_352 == real_count(33, 4096, 32, 50257, 2048)
    doc = plan_json(capsys, "--params", "7B", "--strategy", "zero3", "--devices", "8", "--nodes", "4",
                    "--global-batch", "512", "--micro-batch", "2", "--hardware", "h100_sxm")
    m = doc["inputs"]["model"]
    assert (m["n_layers"], m["hidden"], m["heads"], m["n_params"], m["shape_inferred"]) == (33, 4096, 32, n, True)
    assert "model.arch.n_layers=33" in doc["train_command"]
    job = plan_json(capsys, *shlex.split(doc["train_command"])[1:])
    assert job["inputs"]["model"]["n_params"] == n and job["time"] == doc["time"]


def test_params_with_a_whole_shape_is_that_count_and_prints_no_job(capsys):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    code = cli.run(p.parse_args([*NANO_FLAGS, "--params", "200000", "--strategy", "ddp", "--devices", "2",
                                 "--hardware", "this_cpu"]))
    out = capsys.readouterr().out
    assert code == 0 and "the same job" not in out
    assert "no same job: --params 200,000 is not what scalelab-train builds for this shape (135,808)" in out
