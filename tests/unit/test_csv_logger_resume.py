"""logger=csv keeps every attempt's metrics: a resumed attempt (elastic restart, SLURM requeue, a
rerun after a crash) writes csv/attempt-N/metrics.csv. In csv/ itself Lightning deleted the earlier
attempts' metrics.csv: a run cut at step 524 and resumed at 500 kept only steps 500-600."""
from omegaconf import OmegaConf

from scalelab.results.run_logger import build_logger

CFG = OmegaConf.create({"logger": {"name": "csv"}})


def _dir(logger) -> str:
    return logger.log_dir.rstrip("/")


def test_each_resumed_attempt_has_its_own_metrics_file(tmp_path):
    assert _dir(build_logger(CFG, tmp_path)) == str(tmp_path / "csv")
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step,train/loss\n0,5.5\n")
    assert _dir(build_logger(CFG, tmp_path, resumed=True)) == str(tmp_path / "csv" / "attempt-2")
    (tmp_path / "csv" / "attempt-2").mkdir()
    assert _dir(build_logger(CFG, tmp_path, resumed=True)) == str(tmp_path / "csv" / "attempt-3")
    assert _dir(build_logger(CFG, tmp_path)) == str(tmp_path / "csv")         # started over: replaces it
    assert (tmp_path / "csv" / "metrics.csv").read_text().startswith("step,train/loss\n0,5.5")
