"""What a SLURM job asks for, checked before it is submitted (scalelab.slurm_request; the scheduler's
own answer, sbatch --test-only, is tested against the real cluster in tests/slurm)."""
import pytest

from scalelab.slurm_jobs import _say_pending
from scalelab.slurm_request import check_times, time_seconds


@pytest.mark.parametrize("text,secs", [("30", 1800), ("10:30", 630), ("01:00:00", 3600), ("2-03", 183600),
                                       ("1-00:30", 88200), ("1-01:02:03", 90123), ("UNLIMITED", None),
                                       ("infinite", None), ("0", None), ("00:00:00", None)])
def test_sbatch_time_formats(text, secs):
    assert time_seconds(text) == secs     # sbatch(1) --time: days-hours[:min[:sec]], h:m:s, m:s, minutes


@pytest.mark.parametrize("text", ["-5", "abc", "-1", "1:2:3:4", "1.5", ""])
def test_bad_times_are_one_line_naming_the_value(text):
    with pytest.raises(ValueError) as e:
        time_seconds(text)
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


def test_the_limit_must_leave_two_minutes_before_the_warning_signal():
    # worst case: the limit rounded up to whole minutes, minus the delay, minus 60 s (the signal
    # may come that much early): 00:04:30 -> 300 - 90 - 60 = 150 s >= 120
    check_times("00:04:30", 90)
    check_times("00:04:01", 90)             # rounded up to 300 s as well
    with pytest.raises(ValueError, match=r"leaves 90 s before the warning signal at worst"):
        check_times("00:04:00", 90)         # 240 - 90 - 60
    with pytest.raises(ValueError, match=r"leaves 0 s .* at least 270 s"):
        check_times("00:01:00", 90)         # the walkthrough's job: requeued every ~30 s
    check_times("3", 0)                     # 180 - 0 - 60 = 120 s, no warning delay
    check_times("UNLIMITED", 90)
    check_times("0", 90)
    for bad in (-1, 65536):   # sbatch(1) --signal: sig_time "between 0 and 65535" (submitted, then sbatch refused it)
        with pytest.raises(ValueError, match=f"^--signal-delay {bad} must be between 0 and 65535"):
            check_times("3-00:00:00", bad)
    check_times("3-00:00:00", 65535)


def test_launcher_settings_are_checked(monkeypatch):
    from hydra_plugins.scalelab_slurm_launcher.launcher import check_settings

    good = {"_target_": "x", "partition": "debug", "time": "00:10:00", "cpus_per_task": None,
            "gpus_per_node": "auto", "signal_delay_s": 90}
    check_settings(good)
    for bad, words in (({"partiton": "debug"}, "did you mean hydra.launcher.partition?"),
                       ({"cpus_per_task": 0}, "cpus_per_task=0 must be an integer >= 1"),
                       ({"cpus_per_task": True}, "cpus_per_task=True must be"),
                       ({"gpus_per_node": "two"}, "gpus_per_node='two' must be auto"),
                       ({"gpus_per_node": -1}, "gpus_per_node=-1 must be"),
                       ({"time": "abc"}, "hydra.launcher.time 'abc' is not a SLURM time"),
                       ({"time": "00:04:00"}, "hydra.launcher.signal_delay_s 90 s")):
        with pytest.raises(ValueError, match=words.replace("?", r"\?").replace("(", r"\(")):
            check_settings({**good, **bad})


def test_a_pending_job_says_why_once_per_reason(capsys):
    pending: dict = {}
    _say_pending(["85|PENDING|Resources"], pending, quiet_s=0)
    _say_pending(["85|PENDING|Resources"], pending, quiet_s=0)
    _say_pending(["85|PENDING|ReqNodeNotAvail, UnavailableNodes:vm"], pending, quiet_s=0)
    _say_pending(["85|RUNNING|None"], pending, quiet_s=0)
    _say_pending(["86|PENDING|Priority"], pending, quiet_s=60)      # not yet: pending for < 60 s
    assert capsys.readouterr().err.splitlines() == [
        "[scalelab] SLURM job 85: pending (Resources)",
        "[scalelab] SLURM job 85: pending (ReqNodeNotAvail, UnavailableNodes:vm)"]


def test_an_unknown_option_is_named_alone_with_the_nearest(capsys):
    from scalelab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["slurm", "submit", "--cpu", "model=gpt_nano", "trainer.max_steps=5", "--partiton", "debug"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "--partiton (did you mean --partition?)" in err and "model=gpt_nano" not in err


def test_another_config_folder_or_name_is_refused_for_a_slurm_sweep():
    # the job's script runs scalelab.train with its overrides only: -cd/-cn composed conf/train.yaml there
    from hydra_plugins.scalelab_slurm_launcher.launcher import check_config_source

    check_config_source(["scalelab-train", "-m", "hydra/launcher=slurm", "hydra.searchpath=[file:///x]"])
    for flag in (["-cd", "/x"], ["--config-dir=/x"], ["-cn", "mine"], ["--config-name", "mine"], ["-cp", "c"]):
        with pytest.raises(ValueError, match=f"^{flag[0].split('=')[0]}: a hydra/launcher=slurm sweep's jobs "
                                             r"compose conf/train.yaml .* hydra.searchpath=\[file:///abs/folder\]"):
            check_config_source(["scalelab-train", "-m", *flag, "hydra/launcher=slurm"])
