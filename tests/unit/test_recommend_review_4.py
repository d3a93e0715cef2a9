"""Review findings on `scalelab recommend` (planner only, no runs): a batch the data-parallel
degree does not divide is said as such, with the global batches that would split, not as a memory
problem ("fits nowhere"); the printed commands run as printed (the project's scalelab-train);
fp16 on a CPU profile is refused in one line; the ranking shows the global batch where several
are searched. Expected figures by hand."""
from __future__ import annotations

import json

from scalelab.cli import build_parser


def args(*argv):
    return build_parser().parse_args(["recommend", *argv])


def test_a_batch_the_data_parallel_ranks_do_not_divide_is_said_with_the_batches_that_would(tmp_path, capsys):
    # 6 devices, global batch 16: 16 % 6 = 4, so no ddp/fsdp/ZeRO layout (dp 6) was built; tp at tp 2
    # has dp 3 (16 % 3 = 1). Nearest multiples: 12 and 18 of 6; 15 and 18 of 3.
    a = args("--model", "gpt_small", "--devices", "6", "--hardware", "h100_sxm", "--strategies", "ddp,zero3,tp,pipeline",
             "--out", str(tmp_path / "o"))
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert ("no layout at this batch: ddp, zero3: global batch 16 does not split over its 6 data-parallel ranks; "
            "--global-batch 12 or 18 would") in out, out
    assert "global batch 16 does not split over its 3 data-parallel ranks; --global-batch 15 or 18 would" in out
    assert "fits nowhere: ddp" not in out and "fits nowhere: zero3" not in out   # before: "no layout fits ... memory"
    doc = json.loads((tmp_path / "o" / "recommendation.json").read_text())
    assert sorted(doc["search"]["batch_unsplit"]) == ["ddp", "tp", "zero3"]
    # at a batch that splits, ddp is searched and the note is gone
    a = args("--model", "gpt_small", "--devices", "6", "--hardware", "h100_sxm", "--strategies", "ddp,pipeline",
             "--global-batch", "24", "--out", str(tmp_path / "p"))
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert "no layout at this batch" not in out and "\n1  ddp " in out, out


def test_the_printed_command_runs_as_printed(tmp_path, capsys, monkeypatch):
    # the bare `scalelab-train` was "not found" without an activated venv; paths.command names this one
    import sys
    from pathlib import Path

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("MAKELEVEL", raising=False)
    monkeypatch.chdir(tmp_path)
    a = args("--model", "gpt_nano", "--devices", "2", "--hardware", "this_cpu", "--strategies", "ddp", "--out", "o")
    assert a.func(a) == 0
    exe = str(Path(sys.executable).parent / "scalelab-train")
    doc = json.loads((tmp_path / "o" / "recommendation.json").read_text())
    assert doc["winner"]["command"].startswith(f"{exe} strategy=ddp model=gpt_nano trainer.devices=2 ")
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == doc["winner"]["command"]


def test_fp16_on_a_cpu_profile_is_one_line(tmp_path, capsys):
    # every layout was "refused by the trainer" (20+ lines), then exit 1
    a = args("--model", "gpt_small", "--devices", "2", "--precision", "16", "--out", str(tmp_path / "o"))
    assert a.func(a) == 2
    assert capsys.readouterr().err == ("error: --precision 16: fp16 mixed precision needs a GPU (the trainer refuses "
                                       "it on CPU), and --hardware this_cpu is a CPU profile; valid there: 32, "
                                       "bf16-mixed, bf16-true\n")


def test_several_global_batches_show_each_row_s_batch_and_say_throughput_is_not_training_speed(tmp_path, capsys):
    a = args("--model", "gpt_small", "--devices", "2", "--hardware", "h100_sxm", "--strategies", "ddp,zero3",
             "--global-batch", "16,1024", "--out", str(tmp_path / "o"))
    assert a.func(a) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[1].split()
    assert head[:7] == ["#", "strategy", "devices", "dp", "tp", "pp", "batch"], out[1]
    doc = json.loads((tmp_path / "o" / "recommendation.json").read_text())
    assert [row.split()[6] for row in out[3:5]] == [str(r["global_batch"]) for r in doc["ranking"]]
    assert any(line.startswith("note: several global batches searched") for line in out)
    a = args("--model", "gpt_small", "--devices", "2", "--hardware", "h100_sxm", "--strategies", "ddp",
             "--out", str(tmp_path / "p"))
    assert a.func(a) == 0
    out = capsys.readouterr().out.splitlines()
    assert "batch" not in out[1].split() and not any("several global batches" in line for line in out)


def test_the_vocabulary_hint_names_the_flag_that_pads_it(tmp_path, capsys):
    # GPT-2's 50257 is odd: no tp > 1 divides it; padded to a multiple of 128: 393 x 128 = 50304
    a = args("--params", "7B", "--devices", "8", "--hardware", "h100_sxm", "--strategies", "fsdp,tp",
             "--out", str(tmp_path / "o"))
    assert a.func(a) == 0
    assert ("vocab_size 50257 is not divisible by tp 2, 4, 8 (a vocabulary padded to 50304 would split: --vocab "
            "50304, as Megatron and nanoGPT pad GPT-2's)") in capsys.readouterr().out
    a = args("--params", "7B", "--vocab", "50304", "--devices", "8", "--hardware", "h100_sxm", "--strategies",
             "fsdp,tp", "--out", str(tmp_path / "p"))
    assert a.func(a) == 0
    doc = json.loads((tmp_path / "p" / "recommendation.json").read_text())
    assert {r["strategy"] for r in doc["ranking"]} == {"fsdp", "tp"}       # tp searched at the padded vocab


def test_a_model_that_fits_nowhere_names_the_closest_layout(tmp_path, capsys):
    # a ~1,000-line prune tally was the whole error; the json keeps it, the line says what comes closest
    a = args("--params", "10T", "--devices", "8", "--nodes", "2", "--hardware", "h100_sxm", "--memory-headroom", "0",
             "--out", str(tmp_path / "o"))
    assert a.func(a) == 1
    err = capsys.readouterr().err.strip().splitlines()
    doc = json.loads((tmp_path / "o" / "recommendation.json").read_text())
    least = doc["search"]["fits_nowhere"]
    closest = min((n for n in least if least[n]), key=lambda n: least[n])
    from scalelab.plan.report import fmt_bytes

    assert err[-1] == (f"error: no layout fits device memory: the closest is {closest}, whose smallest layout needs "
                       f"{fmt_bytes(least[closest])} per device; h100_sxm has 79.65 GiB: more devices or nodes (sharded "
                       "states shrink with them), --activation-checkpointing full, or a smaller model "
                       "(recommendation.json: search.pruned)")
    assert doc["search"]["pruned"] and doc["winner"] is None
