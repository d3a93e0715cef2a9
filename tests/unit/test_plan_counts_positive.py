"""A count flag (--tokens, --params) must be > 0: `plan --tokens -5` printed a negative time and cost
(exit 0) and `recommend --tokens=-1e11 --objective time-to-tokens` a negative prediction."""
import pytest

from ..conftest import run_cli as _run


@pytest.mark.parametrize("argv, value", [
    (["plan", "--params", "7B", "--strategy", "zero3", "--devices", "8", "--hardware", "h100_sxm", "--tokens", "-5"],
     "'-5'"),
    (["plan", "--params", "7B", "--strategy", "zero3", "--hardware", "h100_sxm", "--tokens", "0"], "'0'"),
    (["plan", "--params", "7B", "--strategy", "zero3", "--hardware", "h100_sxm", "--tokens", "nan"], "'nan'"),
    (["recommend", "--params", "7B", "--devices", "8", "--hardware", "h100_sxm", "--tokens=-1e11",
      "--objective", "time-to-tokens"], "'-1e11'"),
    (["plan", "--params=-7B", "--strategy", "zero3"], "'-7B'"),
])
def test_a_count_that_is_not_positive_is_one_line_exit_2(capsys, argv, value):
    code, out = _run(argv, capsys)
    assert code == 2 and out.out == ""
    assert out.err.startswith("error: ") and out.err.count("\n") == 1
    assert value in out.err and "valid: a finite number > 0" in out.err


def test_a_positive_count_still_plans(capsys):
    code, out = _run(["plan", "--params", "7B", "--strategy", "zero3_offload", "--devices", "8",
                      "--hardware", "h100_sxm", "--tokens", "1e9"], capsys)
    assert code == 0 and "train 1G tokens:" in out.out
