"""recommend's LR check with a run whose loss went NaN: run.json writes NaN/inf as null since
results/record.finite, and the check scored such a run on its last finite losses (often its lowest),
so it picked the diverged LR; the LR table raised TypeError formatting the null losses."""
from __future__ import annotations

import json
import math

from scalelab.recommend import recommend as rec_mod
from scalelab.recommend import verify as V
from scalelab.recommend.report import lr_table, markdown_table, text_table, verify_rows
from scalelab.results.record import write_json

NAN = float("nan")
HEALTHY = [4.0, 3.6, 3.2, 2.9, 2.7, 2.6, 2.5, 2.4]      # last quarter (2 of 8): 2.5, 2.4 -> 2.45
DIVERGING = [4.0, 3.0, 2.5, 2.1] + [NAN] * 6               # its finite losses end at 2.1, below 2.45


def _record(num: int, base_lr: float, losses: list[float], sweep) -> dict:
    return {"status": "completed", "strategy": "ddp", "world_size": 2, "global_batch_size": 16,
            "throughput": {"tokens_per_s": 1000.0, "samples_per_s": 10.0}, "step_time_s": {"median": 0.1},
            "base_lr": base_lr, "lr": base_lr, "lr_rule": "none",
            "loss": {"first": losses[0], "final": losses[-1], "curve": [[s + 1, v] for s, v in enumerate(losses)]},
            "job": {"num": num, "dir": str(sweep / str(num))}}


def _write_sweep(sweep) -> None:
    """The reviewer's two runs, written by results.record.write_json (NaN -> null)."""
    for num, (lr, losses) in enumerate([(0.003, HEALTHY), (0.03, DIVERGING)]):
        (sweep / str(num)).mkdir(parents=True)
        write_json(sweep / str(num) / "run.json", _record(num, lr, losses, sweep))


def test_run_json_holds_the_nan_losses_as_null(tmp_path):
    _write_sweep(tmp_path / "lr_check")
    rec = json.loads((tmp_path / "lr_check" / "1" / "run.json").read_text())
    assert rec["loss"]["final"] is None and [v for _, v in rec["loss"]["curve"]][-6:] == [None] * 6


def test_lr_rows_mark_the_nan_run_diverged_and_the_healthy_one_is_best(tmp_path):
    _write_sweep(tmp_path / "lr_check")
    rows = V.lr_rows(tmp_path / "lr_check", "optim.lr")
    by_lr = {r["value"]: r for r in rows}
    assert sorted(by_lr) == [0.003, 0.03]
    assert by_lr[0.003]["diverged"] is False and abs(by_lr[0.003]["loss_tail"] - 2.45) < 1e-9
    assert by_lr[0.03]["diverged"] is True and by_lr[0.03]["loss_tail"] is None
    assert by_lr[0.03]["loss_final"] is None and by_lr[0.03]["loss_first"] == 4.0
    assert V.best_lr_run(rows)["value"] == 0.003


def _lr_check(tmp_path, monkeypatch, write=_write_sweep) -> dict:
    """recommend's LR check (_lr_check) with the multirun replaced by the reviewer's two run.json."""
    monkeypatch.setattr(V, "preflight_or_raise", lambda argv: None)
    monkeypatch.setattr(V, "run_multirun", lambda argv, log: write(tmp_path / "lr_check") or 0)
    adv = {"rule": "none", "base_lr": 0.003, "base_batch": 16, "global_batch": 16, "warmup_steps": 2}
    check, records, _ = rec_mod._lr_check({"overrides": ["strategy=ddp"]}, adv, tmp_path, 10, [], False, None,
                                          "cpu", lambda *a: None)
    assert len(records) == len(check["runs"])
    return check


def test_the_lr_check_picks_the_healthy_lr_not_the_diverged_one(tmp_path, monkeypatch):
    check = _lr_check(tmp_path, monkeypatch)
    assert check["varied"] == "optim.lr" and len(check["runs"]) == 2
    assert check["best"] == 0.003 and check["agrees_with_advice"] is True
    assert check["diverged"] == [0.03]
    json.dumps(check, allow_nan=False)     # recommendation.json stays strict JSON


def test_the_lr_table_renders_the_diverged_run(tmp_path, monkeypatch):
    doc = {"lr": {"check": _lr_check(tmp_path, monkeypatch)}}
    head, rows = lr_table(doc)             # TypeError on the null losses before
    by_value = {r[0]: dict(zip(head, r)) for r in rows}
    bad, good = by_value["0.03"], by_value["0.003"]
    assert bad["status"] == "diverged (NaN/inf loss)" and good["status"] == "completed"
    assert bad["loss first"] == "4.0000" and bad["loss final"] == "nan"
    assert bad["loss, last 25 % of steps"] == "nan"
    # curve picks at steps 1, 3, 5, 7, 10 (index 0, 2, 4, 6, 9): 4.0, 2.5, then NaN (null)
    assert bad["loss curve (step: loss)"] == "1: 4.000, 3: 2.500, 5: nan, 7: nan, 10: nan"
    assert good["loss, last 25 % of steps"] == "2.4500" and good["loss final"] == "2.4000"
    assert "diverged (NaN/inf loss)" in text_table(head, rows) and "diverged" in markdown_table(head, rows)


def test_every_lr_diverged_says_so(tmp_path, monkeypatch):
    def all_diverge(sweep):
        (sweep / "0").mkdir(parents=True)
        write_json(sweep / "0" / "run.json", _record(0, 0.03, DIVERGING, sweep))

    check = _lr_check(tmp_path, monkeypatch, all_diverge)
    assert check["best"] is None and check["diverged"] == [0.03]
    why = rec_mod._why_not_advice(check, {"base_lr": 0.003})
    assert "diverg" in why and "0.03" in why


def test_an_older_record_with_nan_in_it_is_diverged_too(tmp_path):
    """Records written before run.json wrote NaN as null hold NaN itself (json.dumps' default)."""
    sweep = tmp_path / "lr_check"
    for num, (lr, losses) in enumerate([(0.003, HEALTHY), (0.03, DIVERGING)]):
        (sweep / str(num)).mkdir(parents=True)
        (sweep / str(num) / "run.json").write_text(json.dumps(_record(num, lr, losses, sweep)))
    assert "NaN" in (sweep / "1" / "run.json").read_text()
    rows = V.lr_rows(sweep, "optim.lr")
    assert [r["diverged"] for r in rows] == [False, True]
    assert V.best_lr_run(rows)["value"] == 0.003
    json.dumps(rows, allow_nan=False)      # NaN read back is null in recommendation.json


def test_diverged_rule():
    assert V.diverged({"final": 2.0, "curve": [[1, 3.0], [2, 2.0]]}) is False
    assert V.diverged({"final": None, "curve": [[1, 3.0], [2, 2.0]]}) is True    # NaN final, curve finite
    assert V.diverged({"final": 2.0, "curve": [[1, None], [2, 2.0]]}) is True     # a null step
    assert V.diverged({"final": math.inf, "curve": []}) is True                   # older record, inf
    assert V.diverged({"final": None, "curve": []}) is False                      # no loss recorded at all
    assert V.diverged(None) is False
    assert V.tail_mean([[1, 3.0], [2, None]]) is None and V.tail_mean([[1, 3.0], [2, 1.0]]) == 1.0


def test_a_diverged_verification_run_shows_nan_not_a_median_of_nan():
    ok = {"planner_rank": 1, "strategy": "ddp", "split": "8 x 1", "predicted_step_s": 0.3, "measured_step_s": 0.3,
          "step_ratio": 1.0, "step_ratio_at_host_speed": 1.0, "measured_score": 1000.0, "runs": 1,
          "loss_final": None, "loss_diverged": 1, "status": "completed"}
    head, rows = verify_rows({"objective": "throughput", "verification": {"ranking": [ok]}})
    assert dict(zip(head, rows[0]))["loss final"] == "nan (diverged)"


def test_a_verified_candidate_s_final_loss_is_the_median_of_its_finite_ones():
    """measured_row took float(final or "nan"): a null final (diverged) made the median NaN, written
    as NaN into recommendation.json; now the median of the finite finals, the diverged ones counted."""
    from scalelab.plan.cli import _model_from_conf
    from scalelab.recommend.space import Request, enumerate_candidates

    from .test_recommend import cpu

    req = Request(_model_from_conf("mlp"), "mlp", cpu(), "this_cpu", 2, global_batches=(16,), strategies=("ddp",),
                  checkpointing=("none",))
    c = enumerate_candidates(req)[0][0]

    def rec(final, curve):
        return {"status": "completed", "throughput": {"samples_per_s": 640.0}, "step_time_s": {"median": 0.025},
                "loss": {"final": final, "curve": curve}, "job": {"num": 0}}

    good = [rec(2.0, [[1, 3.0], [2, 2.0]]), rec(2.2, [[1, 3.0], [2, 2.2]])]
    bad = rec(None, [[1, 3.0], [2, None]])
    row = V.measured_row(c, [*good, bad], "throughput", req.hardware, None)
    assert row["loss_final"] == 2.1 and row["loss_diverged"] == 1
    json.dumps(row, allow_nan=False)
    row = V.measured_row(c, [bad], "throughput", req.hardware, None)
    assert row["loss_final"] is None and row["loss_diverged"] == 1
