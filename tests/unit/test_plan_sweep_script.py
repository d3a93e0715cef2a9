"""scripts/plan_sweep.sh: passes in seed order, each followed by the one-rank baseline; bad input
gets a one-line error before anything runs."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "plan_sweep.sh"


def sweep(*args, dry=True):
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1" if dry else "",
           "SCALELAB_TRAIN": "/bin/echo"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env)


def test_each_pass_is_the_sweep_then_its_one_rank_baseline():
    r = sweep("plan_validation", "out", "3,1", "data.global_batch_size=20",
              "hydra.sweeper.params.model=gpt_nano")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4
    for line, (seed, part) in zip(lines, [(3, "all"), (3, "alone"), (1, "all"), (1, "alone")]):
        words = line.split()
        assert words[:3] == ["/bin/echo", "-m", "experiment=plan_validation"]
        assert f"++hydra.sweeper.params.seed={seed}" in words   # plan_calibration sweeps no seed: ++ adds it
        assert f"hydra.sweep.dir=out/seed{seed}/{part}" in words
        assert "data.global_batch_size=20" in words
        if part == "alone":
            # the baseline's own overrides come last, so a user's strategy/devices cannot undo them
            assert words[-2:] == ["hydra.sweeper.params.strategy=single", "trainer.devices=1"]
        else:
            assert "trainer.devices=1" not in words


def test_bad_input_is_one_line_before_anything_runs():
    for args, words in [(("nope", "out", "1"), ["EXPERIMENT='nope'", "plan_validation"]),
                        (("plan_validation", "out", "1,x"), ["SEEDS='1,x'", "1,2,3"]),
                        (("plan_validation",), ["usage:"])]:
        r = sweep(*args, dry=False)
        assert r.returncode == 2 and r.stdout == ""
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_the_baseline_pass_stays_single_on_one_rank_whatever_narrows_the_main_pass():
    # strategy=ddp is a task override, which beats the sweeper's params: the "one-rank baseline" ran ddp
    r = sweep("plan_validation", "out", "1", "strategy=ddp", "trainer.devices=2", "model=gpt_mini")
    main, alone = (line.split() for line in r.stdout.splitlines())
    assert "strategy=ddp" in main and "trainer.devices=2" in main
    assert "strategy=ddp" not in alone and "trainer.devices=2" not in alone and "model=gpt_mini" in alone
    assert alone[-2:] == ["hydra.sweeper.params.strategy=single", "trainer.devices=1"]
