"""`scalelab recommend --params N` plans the shape it prints, at that shape's exact count, and says
the count; its LR line carries a caveat when the base LR is conf/optim's default and the model is
not the trainer's default one. Walkthrough: `--params 7B` planned 7.0G and printed a 34 x 4096
command that `scalelab plan` put at 7.27G; the LR line scaled gpt_nano's 0.003 to 0.01697 for 7B."""
from __future__ import annotations

import json
import shlex

from scalelab.cli import build_parser
from scalelab.plan.cli import _model_from_conf
from scalelab.recommend.cli import _request
from scalelab.recommend.lr import base_lr_caveat, base_model

README_7B = ["--params", "7B", "--devices", "8", "--nodes", "4", "--hardware", "h100_sxm", "--global-batch", "512",
             "--tokens", "1e11", "--budget-minutes", "2880", "--objective", "time-to-tokens"]
# 33 x (12 x 4096^2 + 4 x 4096) + (2 x 50,257 + 2,048 + 2) x 4096: the layers nearest 7e9 at width 4096
N_7B = 33 * (12 * 4096 ** 2 + 4 * 4096) + (2 * 50257 + 2048 + 2) * 4096


def args(*argv):
    return build_parser().parse_args(["recommend", *argv])


def test_params_are_planned_as_the_shape_that_runs():
    assert N_7B == 7_064_420_352
    req, opts = _request(args(*README_7B, "--out", "/nonexistent/unused"))
    m = req.model
    assert (m.n_layers, m.hidden, m.heads, m.n_params) == (33, 4096, 32, N_7B)
    assert req.params_asked == 7e9 and opts["lr_caveat"]


def test_the_readme_7b_command_says_count_budget_and_lr_caveat(tmp_path, capsys):
    a = args(*README_7B, "--out", str(tmp_path))
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert "7,064,420,352 parameters exactly" in out and "--params 7B" in out
    assert "model.arch.n_layers=33" in out.rstrip().splitlines()[-1]
    # 1e11 tokens in 2,880 min would need 578,704 tokens/s: more than any layout is predicted to do
    assert "no layout meets the budget of 2,880 min (2 d): the fastest" in out
    lr = next(ln for ln in out.splitlines() if ln.startswith("LR: "))
    assert "caveat: the base LR is conf/optim/adamw.yaml's default" in lr and "--base-lr" in lr
    md = (tmp_path / "recommendation.md").read_text()
    assert "**7,064,420,352 parameters**" in md and "**Budget**: no layout meets" in md and "caveat:" in md
    # the printed command plans to the same model (scalelab plan KEY=VALUE)
    cmd = shlex.split(out.rstrip().splitlines()[-1])[1:]
    p = build_parser().parse_args(["plan", *cmd, "--json"])
    assert p.func(p) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["model"]["n_params"] == N_7B


def test_lr_caveat_only_when_the_base_lr_is_not_this_models():
    assert base_model() == "gpt_nano"                                  # conf/train.yaml's defaults
    nano, small = _model_from_conf("gpt_nano"), _model_from_conf("gpt_small")
    assert base_lr_caveat(nano, "adam", False) is None                # the model the default goes with
    text = base_lr_caveat(small, "sgd", False)
    assert text and "conf/optim/sgd.yaml" in text and "gpt_nano" in text and "--base-lr" in text
    assert base_lr_caveat(small, "adam", True) is None                # --base-lr given: the user's own
    _, opts = _request(args("--model", "gpt_nano", "--devices", "2", "--hardware", "this_cpu"))
    assert opts["lr_caveat"] is None
    _, opts = _request(args("--model", "gpt_small", "--devices", "2", "--hardware", "this_cpu", "--base-lr", "1e-3"))
    assert opts["lr_caveat"] is None
