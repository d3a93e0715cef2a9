"""The typed config schema (src/scalelab/schema.py), the run-record shape check and secret
scrubbing (src/scalelab/results/record.py): fast, one process."""
import json

import pytest
from omegaconf import OmegaConf

from scalelab import schema
from scalelab.errors import ConfigError
from scalelab.paths import conf_dir
from scalelab.results.record import (BadRecord, load_record, read_records, record_problem, redact_text,
                                     register_secrets, scrub)


def test_every_shipped_config_passes_the_schema():
    """Each yaml of the data and launcher groups, merged into the default job, is valid as shipped
    (the other groups' yamls pass config.validate, which runs schema.check: test_compose.py)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for group in ("data", "launcher"):
            for f in sorted((conf_dir() / group).glob("*.yaml")):
                extra = ["data.files=[x]"] if f.stem == "text_files" else ["data.hub_name=x"] if f.stem == "hub" else []
                cfg = compose("train", overrides=[f"{group}={f.stem}", *extra])
                schema.check(OmegaConf.to_container(cfg, resolve=True))
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("field,good,bad", [
    (schema.Int(lo=1), [1, 7], [0, -1, 1.5, "1", True, None]),
    (schema.Float(lo=0, lo_open=True), [1e-3, 2], [0, -1, "abc", True, float("nan"), float("inf")]),
    (schema.Bool(), [True, False], ["no", "yes", 1, 0, None]),
    (schema.Choice(("a", "b")), ["a"], ["c", True, 1, None]),
    (schema.Choice((1, 2, 3)), [1, 3], [4, "1", True]),
    (schema.Int(lo=1, null=True, also=("auto",)), [None, "auto", 2], ["all", 0]),
    (schema.Field("list", length=2, item=schema.Float(lo=0, hi=1, hi_open=True)), [[0.9, 0.95]], [[1.0, 0.9], [0.9], "ab"]),
])
def test_field_types_are_never_coerced(field, good, bad):
    assert all(field.ok(v) for v in good)
    assert not any(field.ok(v) for v in bad)


def test_messages_name_key_value_and_what_is_valid():
    with pytest.raises(ConfigError, match=r"^trainer.timeout_s=0 must be a number > 0 or null \(seconds"):
        schema.check({"trainer": {"timeout_s": 0}})
    with pytest.raises(ConfigError, match=r"^strategy.reshard_after_forward='no' must be a boolean"):
        schema.check({"strategy": {"_target_": "scalelab.strategies.fsdp.FSDP", "reshard_after_forward": "no"}})
    with pytest.raises(ConfigError, match=r"^trainer=3 must be a mapping"):
        schema.check({"trainer": 3})
    assert "trainer.timeout_s: must be a number > 0" in schema.describe()


def _good():
    return {"status": "completed", "strategy": "ddp", "world_size": 2, "global_batch_size": 16,
            "throughput": {"samples_per_s": 1.0, "tokens_per_s": None}}


@pytest.mark.parametrize("rec,reason", [
    ([1], "a JSON list, not an object"),
    ({"strategy": "ddp"}, "missing key 'status'"),
    ({**_good(), "world_size": 0}, "world_size=0 is not an integer >= 1"),
    ({**_good(), "memory": {"peak_rss_bytes_per_rank": ["x"]}}, "memory.peak_rss_bytes_per_rank"),
    ({**_good(), "loss": {"final": "low"}}, "loss.final=\"low\" is not a number or null"),
])
def test_record_problems(rec, reason):
    assert reason in record_problem(rec)
    assert record_problem(_good()) is None


def test_read_records_skips_and_reports(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "run.json").write_text(json.dumps(_good()))
    (tmp_path / "b" / "run.json").write_text('{"status": "compl')
    problems = []
    recs = read_records([tmp_path], problems)
    assert len(recs) == 1 and len(problems) == 1 and str(tmp_path / "b" / "run.json") in problems[0]
    with pytest.raises(BadRecord, match="not valid JSON"):
        load_record(tmp_path / "b" / "run.json")


def test_a_globs_logs_and_scripts_are_one_line(tmp_path, capsys):
    """`scalelab compare outputs/slurm/*` names the job dirs and every .out / .sbatch beside them:
    those are one line together, not one "not valid JSON" line each."""
    (tmp_path / "7-x").mkdir()
    (tmp_path / "7-x" / "run.json").write_text(json.dumps(_good()))
    for name in ("scalelab-7.out", "scalelab-8.out", "s-1.sbatch", "s-2.sbatch"):
        (tmp_path / name).write_text("#!/bin/bash\n")
    recs = read_records(sorted(tmp_path.iterdir()))
    assert len(recs) == 1
    assert capsys.readouterr().err.splitlines() == [
        "skipped 4 file(s) that are not run records (not .json): s-1.sbatch, s-2.sbatch, scalelab-7.out and 1 more"]


def test_scrub_redacts_keys_overrides_and_known_values(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "sk-secret-123")
    register_secrets(["hunter22"])
    out = scrub({"logger": {"api_key": "XYZ", "project": "p"}, "hf_token": "t", "tokens_per_s": 5.0,
                 "tokenizer": "bytes", "job": {"overrides": ["+secret_token=abc123", "model=gpt_nano"]},
                 "note": "key sk-secret-123 and hunter22"})
    assert out["logger"] == {"api_key": "<redacted>", "project": "p"} and out["hf_token"] == "<redacted>"
    assert out["tokens_per_s"] == 5.0 and out["tokenizer"] == "bytes"
    assert out["job"]["overrides"] == ["+secret_token=<redacted>", "model=gpt_nano"]
    assert out["note"] == "key <redacted> and <redacted>"
    assert redact_text("#0 : +logger.api_key=XYZ strategy=ddp") == "#0 : +logger.api_key=<redacted> strategy=ddp"
