"""A TP refusal lists the degrees the trainer takes: `--heads 12 --vocab 50257 --tp 8` said "valid tp:
1, 2, 4" (the heads' divisors) though check_tp_degree refuses 2 and 4 (vocab 50257 is odd); and plan
applies the trainer's sequence-length check (sequence parallel is on in the plan's same job):
`--seq-len 1000 --tp 3 --devices 6` planned a job the trainer refuses."""

from ..conftest import run_cli as _run

SHAPE = ["plan", "--layers", "12", "--hidden", "768", "--heads", "12", "--hardware", "h100_sxm"]


def test_heads_refusal_lists_only_degrees_every_dimension_takes(capsys):
    code, out = _run([*SHAPE, "--vocab", "50257", "--seq-len", "1024", "--strategy", "tp", "--tp", "8",
                      "--devices", "8"], capsys)
    assert code == 2 and out.err.count("\n") == 1
    # divisors of 8: 1, 2, 4, 8; heads 12 takes 1, 2, 4; vocab 50257 (odd) only 1; padded 50304 = 393 x 128
    assert out.err == ("error: --tp 8 does not divide --heads 12; valid tp: 1 (no tensor parallelism), or 2, 4 "
                       "with a vocabulary they divide (padded: --vocab / model.arch.vocab_size 50304)\n")


def test_fsdp_tp_refusal_says_what_would_work(capsys):
    code, out = _run(["plan", "--params", "125M", "--strategy", "fsdp_tp", "--devices", "8",
                      "--hardware", "h100_sxm"], capsys)
    assert code == 2
    # 125M is guessed 7 x 768 with 6 heads of 128 (test_plan_hardware_naming): of 8's divisors only 2 splits them
    assert "valid tp: 1 (no tensor parallelism), or 2 with a vocabulary it divides" in out.err
    assert "50304" in out.err


def test_sequence_length_tp_does_not_divide_is_refused(capsys):
    job = [*SHAPE, "--vocab", "50304", "--seq-len", "1000", "--strategy", "tp", "--tp", "3", "--devices", "6"]
    code, out = _run(job, capsys)
    # 1000 % 3 = 1; of 6's divisors (1, 2, 3, 6) heads/width/vocab take 1, 2, 3, 6; 1000 takes 1, 2
    assert code == 2 and out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("error: strategy=tp: sequence parallel shards each sequence of seq_len 1000 over "
                              "tp 3 ranks, which does not divide it")
    assert "valid tp: 1, 2;" in out.err
    code, out = _run([*job, "--no-sequence-parallel"], capsys)   # the trainer runs it without
    assert code == 0 and "strategy.sequence_parallel" not in out.out
