"""A dashboard series pools repeats only: ddp at global batch 32 on 2 ranks with gpt_nano (90k
tokens/s), gpt_mini (30k) and gpt_small (5k) was one throughput point, their median (30k), and the
LR chart's lr_rule=none point was the median of three models' losses. Runs that differ in the
model (or precision, ...) are series of their own, named by what tells them apart; repeats (seeds)
and LR rules (which change no speed) still pool."""
from scalelab.results import charts

from .test_report import _rec


def _model(rec, name, seed=0, precision="32-true"):
    rec["config"]["model"] = {"name": name, "arch": {"n_layer": len(name)}}
    rec["config"]["seed"], rec["config"]["trainer"]["precision"] = seed, precision
    return rec


def test_three_models_are_three_throughput_series_and_seeds_pool():
    recs = [_model(_rec(0, "ddp", 2, 32, 90_000 / 64), "gpt_nano"), _model(_rec(1, "ddp", 2, 32, 30_000 / 64), "gpt_mini"),
            _model(_rec(2, "ddp", 2, 32, 5_000 / 64), "gpt_small"),
            _model(_rec(3, "ddp", 2, 32, 7_000 / 64), "gpt_small", seed=1),            # a repeat: median
            _model(_rec(4, "ddp", 2, 32, 4_000 / 64, rule="linear"), "gpt_small")]    # LR rule: same speed
    got = [(t["name"], t["y"]) for t in charts.throughput(recs)["traces"]]
    assert got == [("ddp b32 model=gpt_mini", [30_000.0]), ("ddp b32 model=gpt_nano", [90_000.0]),
                   ("ddp b32 model=gpt_small", [5_000.0])]                            # median(5k, 7k, 4k)


def test_the_lr_chart_splits_models_and_precisions_and_pools_strategies():
    recs = [_model(_rec(0, "ddp", 2, 32, 1.0, final=2.0), "gpt_nano"),
            _model(_rec(1, "fsdp", 2, 32, 1.0, final=2.2), "gpt_nano"),                # strategies: pooled
            _model(_rec(2, "ddp", 2, 32, 1.0, final=4.0), "gpt_small"),
            _model(_rec(3, "ddp", 2, 32, 1.0, final=5.0), "gpt_small", precision="bf16-mixed")]
    got = [(t["name"], t["y"]) for t in charts.lr_scaling(recs)["traces"]]
    assert got == [("lr_rule=none model=gpt_nano trainer.precision=32-true", [2.1]),
                   ("lr_rule=none model=gpt_small trainer.precision=32-true", [4.0]),
                   ("lr_rule=none model=gpt_small trainer.precision=bf16-mixed", [5.0])]


def test_two_models_strong_scaling_lines_are_named_by_their_model(tmp_path):
    from scalelab.results.record import write_json
    from scalelab.results.sweep import aggregate

    recs = [_model(_rec(0, "ddp", 1, 16, 100.0), "gpt_nano"), _model(_rec(1, "ddp", 2, 16, 150.0), "gpt_nano"),
            _model(_rec(2, "ddp", 1, 16, 20.0), "gpt_small"), _model(_rec(3, "ddp", 2, 16, 36.0), "gpt_small")]
    for i, r in enumerate(recs):
        (tmp_path / str(i)).mkdir()
        write_json(tmp_path / str(i) / "run.json", r)
    ch = charts.efficiency([aggregate(tmp_path, write=False)], recs, "strong")
    # was "ddp b16 lr_rule=none (base fx/0)" and "... (base fx/2)": told apart by job ids only
    assert sorted((t["name"], t["y"][-1]) for t in ch["traces"]) == [
        ("ddp b16 model=gpt_nano", 0.75), ("ddp b16 model=gpt_small", 0.9), ("ideal", 1.0)]


def test_launchers_are_apart_and_a_pooled_or_short_point_says_so():
    """Review 2026-12-04: `compare runA runB --format html` (launcher=local 39.8k tokens/s, torchrun_local
    42.6k, a short run) drew one point, 41.2k, their median, with no note: the chart pooled every
    launcher.* key (sweep.json splits launcher.name) and marked no short run."""
    local, torchrun = _rec(0, "ddp", 2, 16, 39_800 / 64), _rec(1, "ddp", 2, 16, 42_600 / 64, short_run=True)
    local["config"]["launcher"], torchrun["config"]["launcher"] = {"name": "local"}, {"name": "torchrun_local"}
    local["job"], torchrun["job"] = {"name": "res"}, {"name": "trl"}
    chart = charts.throughput([local, torchrun])
    assert [(t["name"], t["y"]) for t in chart["traces"]] == [("ddp b16 launcher=local", [39_800.0]),
                                                             ("ddp b16 launcher=torchrun_local", [42_600.0])]
    assert chart["notes"] == ["short runs (fewer than 5 measured steps), their points not steady-state: trl"]
    again = _rec(2, "ddp", 2, 16, 41_000 / 64)   # the same config run again as its own command: a repeat
    again["config"]["launcher"], again["job"] = {"name": "local"}, {"name": "res2"}
    chart = charts.throughput([local, again])
    assert [(t["name"], t["y"]) for t in chart["traces"]] == [("ddp b16", [40_400.0])]
    assert chart["notes"] == ["ddp b16 at 2: the median of 2 runs (res, res2)"]
