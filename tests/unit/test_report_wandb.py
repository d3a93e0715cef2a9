"""W&B without a browser or a server: the sweep-summary run logs the dashboard's charts (read back
from the offline run), the job runs' config carries flat keys and no secret, and online mode
without an API key falls back to offline with one line saying how to sync."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from scalelab.results.record import read_records
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.wandb_offline import _payloads, find_runs, read_run

from .test_report import make_sweep


def _nested_config(path: Path) -> dict:
    """Config items W&B writes with a nested key (read_run keeps top-level keys only)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = {}
    for payload in _payloads(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        items = rec.config.update if rec.WhichOneof("record_type") == "config" else []
        for i in items:
            if i.nested_key:
                out["/".join(i.nested_key)] = json.loads(i.value_json)
    return out


def test_sweep_summary_logs_the_dashboard_charts(tmp_path, wandb_env, monkeypatch):
    from scalelab.results.wandb_summary import log_sweep

    sweep = make_sweep(tmp_path / "fx")
    recs = read_records([sweep])
    summary = aggregate(sweep, write=False)
    attach_efficiency(recs, summary)
    monkeypatch.chdir(tmp_path)   # the sweep given relative, as `scalelab aggregate fx` gives it
    run_id = log_sweep(Path("fx"), summary, recs, "scalelab-test", "offline", cache_dir=tmp_path / "cache")
    (path,) = find_runs(sweep / "wandb")
    run = read_run(path)
    assert run["run"]["run_id"] == run_id and run["run"]["job_type"] == "sweep_summary"
    # which sweep it is, wherever the UI shows it: the absolute folder (was "fx"), the group's name
    assert run["config"]["sweep_dir"] == str(sweep.resolve()) and run["run"]["name"] == "fx/summary"
    rows = {k.split("/")[1][:-len("_table")]: v for k, v in run["summary"].items()
            if k.startswith("charts/") and k.endswith("_table/nrows")}
    # one row per point: strong 2+2+2 (ideal), weak 2+2, throughput 2+1+2+1, memory 4 ranks x 4 parts,
    # loss 8 runs x 2 steps, LR 2 rules x 2 batches, breakdown 4 ranks x 3, planner 1 run x 2
    assert rows == {"efficiency_strong": 6, "efficiency_weak": 4, "throughput": 6, "memory": 16, "loss": 16,
                    "lr_scaling": 4, "breakdown": 12, "planner_step": 2, "planner_memory": 2}
    table = json.loads((path.parent / "files" / run["summary"]["charts/efficiency_strong_table/path"]).read_text())
    assert table["data"] == [[1, 1.0, "ddp b16"], [2, 0.75, "ddp b16"], [1, 1.0, "fsdp b16"], [2, 0.8, "fsdp b16"],
                             [1, 1.0, "ideal"], [2, 1.0, "ideal"]]
    panels = {k[len("_wandb/visualize/"):]: v["panel_config"]["panelDefId"] for k, v in _nested_config(path).items()
              if k.startswith("_wandb/visualize/")}
    line, bar = "wandb/line/v0", "wandb/bar/v0"
    assert panels == {"charts/efficiency_strong": line, "charts/efficiency_weak": line, "charts/throughput": line,
                      "charts/loss": line, "charts/lr_scaling": line, "charts/memory": bar, "charts/breakdown": bar,
                      "charts/planner_step": bar, "charts/planner_memory": bar}
    assert run["summary"]["sweep/runs/nrows"] == 9     # the runs table as before


def _cfg(tmp_path, mode="offline", **logger):
    return OmegaConf.create({
        "seed": 1, "strategy": {"name": "ddp"}, "model": {"name": "gpt_nano"},
        "data": {"global_batch_size": 32}, "optim": {"name": "adamw", "lr": 0.003},
        "lr_scaling": {"rule": "linear", "base_batch_size": 16},
        "trainer": {"devices": 2, "num_nodes": 1, "precision": "32-true"},
        "logger": {"name": "wandb", "project": "scalelab-test", "entity": None, "mode": mode, "tags": ["mine"],
                   **logger},
        "custom": {"hub_token": "hf_abc", "db_password": "pw", "note": "key sk-live-123 inside"},
        "job": {"name": "sweep/3", "group": "sweep"}})


def test_logged_config_is_flat_enough_and_has_no_secret(tmp_path, monkeypatch):
    from scalelab.results.run_logger import logged_config

    monkeypatch.setenv("WANDB_API_KEY", "sk-live-123")
    c = logged_config(_cfg(tmp_path, api_key="sk-live-123"))
    assert {k: c[k] for k in ("world_size", "global_batch_size", "lr_rule", "base_lr", "sweep", "num_nodes")} == {
        "world_size": 2, "global_batch_size": 32, "lr_rule": "linear", "base_lr": 0.003, "sweep": "sweep",
        "num_nodes": 1}
    assert c["strategy"]["name"] == "ddp" and c["optim"]["lr"] == 0.003      # the resolved config, as W&B nests it
    assert "job" not in c
    assert c["logger"]["api_key"] == c["custom"]["hub_token"] == c["custom"]["db_password"] == "<redacted>"
    assert "sk-live-123" not in c["custom"]["note"] and "<redacted>" in c["custom"]["note"]   # under any name
    assert "sk-live-123" not in json.dumps(c) and "hf_abc" not in json.dumps(c) and '"pw"' not in json.dumps(c)


def test_online_without_a_key_falls_back_to_offline_once(tmp_path, wandb_env, monkeypatch, capsys):
    import wandb

    from scalelab.results.run_logger import build_logger

    monkeypatch.setenv("RANK", "0")
    logger = build_logger(_cfg(tmp_path, mode="online"), tmp_path / "job")
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "[scalelab] warning" in line]
    assert len(warnings) == 1 and "W&B online init failed" in warnings[0], out
    assert f"wandb sync {tmp_path / 'job'}/wandb/offline-run-*" in warnings[0]
    assert logger._wandb_init["mode"] == "offline" and logger._wandb_init["group"] == "sweep"
    assert logger._wandb_init["job_type"] == "ddp"
    assert logger._wandb_init["tags"] == ["mine", "ddp", "world_size=2", "global_batch_size=32", "lr_rule=linear"]
    assert wandb.run is None                       # nothing left half-started
    monkeypatch.setenv("RANK", "1")                # other ranks never create a run (not even try)
    other = build_logger(_cfg(tmp_path, mode="online"), tmp_path / "job")
    assert other._experiment is None and other._wandb_init["mode"] == "online"
    assert "[scalelab] warning" not in capsys.readouterr().out


def test_efficiency_keys_of_two_groups_at_one_strategy_and_batch_stay_apart():
    """Two models (two scaling groups) of ddp at batch 16: one summary key each, not the last one's."""
    from scalelab.results.wandb_summary import efficiency_keys

    def group(base, eff2, strategy="ddp"):
        return {"kind": "strong", "strategy": strategy, "baseline_job": base,
                "runs": [{"world_size": 1, "global_batch_size": 16, "scaling_efficiency": 1.0},
                         {"world_size": 2, "global_batch_size": 16, "scaling_efficiency": eff2}]}

    keys = efficiency_keys([group("s/0", 0.9), group("s/2", 0.6), group("s/4", 0.8, strategy="fsdp")])
    assert keys == {"efficiency/strong/ddp/x1/b16/base=s/0": 1.0, "efficiency/strong/ddp/x2/b16/base=s/0": 0.9,
                    "efficiency/strong/ddp/x1/b16/base=s/2": 1.0, "efficiency/strong/ddp/x2/b16/base=s/2": 0.6,
                    "efficiency/strong/fsdp/x1/b16": 1.0, "efficiency/strong/fsdp/x2/b16": 0.8}


def test_a_job_that_fails_after_its_record_ends_its_w_and_b_run_failed(tmp_path, wandb_env):
    """Review 2026-12-04: trainer.timeout_s fired after rank 0 had recorded the run and closed its W&B
    run as finished: run.json said failed (failed_after_record), W&B finished OK. The launcher resumes
    the run by its id and closes it failed, the error in its summary."""
    import wandb

    from scalelab.results.run_logger import WANDB_ID, mark_failed
    from scalelab.results.wandb_offline import find_runs, read_run

    job = tmp_path / "job"
    job.mkdir()
    (job / WANDB_ID).write_text("abcd1234ef56")
    run = wandb.init(id="abcd1234ef56", mode="offline", dir=str(job), project="p")   # rank 0's run
    run.log({"train/loss": 3.0})
    run.finish()
    mark_failed(job, {"name": "csv"}, "x")                                               # no W&B run: nothing
    assert len(find_runs(job)) == 1
    # an attempt whose rank 0 began no run of its own failed (its run folders were there before it): not its run
    from scalelab.results.run_logger import wandb_folders

    mark_failed(job, {"name": "wandb", "mode": "offline", "project": "p"}, "x", earlier=wandb_folders(job))
    assert len(find_runs(job)) == 1
    mark_failed(job, {"name": "wandb", "mode": "offline", "project": "p"}, "timed out after trainer.timeout_s=4 s")
    wandb.teardown()   # the service has written both runs' files out (a loaded CI host read one before it had)
    runs = [read_run(p) for p in find_runs(job)]
    assert [p.name for p in find_runs(job)] == ["run-abcd1234ef56.wandb"] * 2
    assert [r["run"].get("run_id") for r in runs] == ["abcd1234ef56"] * 2, runs
    assert sorted(r["exit_code"] for r in runs) == [0, 1]
    failed = next(r for r in runs if r["exit_code"] == 1)
    assert failed["summary"]["status"] == "failed" and failed["summary"]["error"].startswith("timed out after")


def test_every_w_and_b_summary_key_is_a_compare_key_of_the_same_value():
    """Review 2026-12-04: `compare --sort breakdown/rank0/compute_s` (the W&B name log_summary writes)
    was 'no run has this key'. Each summary key the job's W&B run gets reads the same value in compare."""
    from scalelab.results.run_logger import log_summary
    from scalelab.results.select import lookup

    from .test_report import _rec

    rec = _rec(0, "ddp", 2, 16, 100.0, breakdown={
        "comm_fraction": 0.25, "wait_fraction": 0.1, "compute_imbalance": 1.05,
        "per_rank": [{"compute_s": 1.5, "transfer_s": 0.5, "wait_s": 0.25}, {"compute_s": 1.25, "transfer_s": 0.75,
                                                                             "wait_s": 0.125}]})
    rec["memory"]["peak_device_bytes_per_rank"] = [7, 9]

    class Logged:
        def log_metrics(self, metrics, step):
            self.metrics = metrics

        def save(self):
            pass

    logger = Logged()
    log_summary(logger, rec)
    assert {"breakdown/rank1/wait_s", "memory/peak_device_bytes_max", "mfu"} <= set(logger.metrics)
    assert {k: lookup(rec, k) for k in logger.metrics} == logger.metrics
    assert lookup(rec, "breakdown/rank1/transfer_s") == 0.75 and logger.metrics["memory/peak_device_bytes_max"] == 9
