"""Dashboard and W&B figures on hand-made records: the memory bar of offloaded ZeRO runs, sorting
past NaN (compare --sort, --group-by, the LR chart's median, the HTML table's click-to-sort), the
device peak and MFU in W&B, and which strategies the LR chart pools. Expected values by hand."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from scalelab.results import charts
from scalelab.results.table import group_records, lookup, sort_records

from .test_report import _rec

MIB, GIB = 2**20, 2**30
NAN, INF = float("nan"), float("inf")


def _gpu(num, strategy, params, grads, opt, peak, **strategy_cfg):
    """A 1-rank GPU run: model states and device peak in GiB."""
    r = _rec(num, strategy, 1, 16, 1.0, memory={
        "model_state_breakdown_per_rank": [{"params": params * GIB, "grads": grads * GIB, "optimizer": opt * GIB}],
        "peak_device_bytes_per_rank": [peak * GIB]})
    r["config"]["strategy"].update(strategy_cfg)
    return r


def _bars(ch):
    return {x: [t["y"][i] for t in ch["traces"]] for i, x in enumerate(ch["traces"][0]["x"])}


def test_offloaded_states_are_not_stacked_on_the_device_peak():
    recs = [_gpu(0, "zero3_offload", 1, 2, 6, 4, offload_optimizer="cpu", offload_params="cpu"),
            _gpu(1, "zero2_offload", 1, 2, 6, 4, offload_optimizer="cpu", offload_params="none"),
            _gpu(2, "zero2", 1, 2, 6, 4, offload_optimizer="none", offload_params="none"),
            _gpu(3, "zero3_offload", 1, 2, 6, 4)]       # an older record: no offload keys, known by its name
    ch = charts.memory(recs)
    # params, grads, optimizer, rest (MiB). Was [1024, 2048, 6144, 0] for fx/0: a 9 GiB bar on a 4 GiB peak
    assert _bars(ch) == {"fx/0 r0": [0.0, 0.0, 0.0, 4096.0],            # everything in host memory
                         "fx/1 r0": [1024.0, 0.0, 0.0, 3072.0],         # params on the device
                         "fx/2 r0": [1024.0, 2048.0, 1024.0, 0.0],      # no offload: cut at the 4 GiB peak
                         "fx/3 r0": [0.0, 0.0, 0.0, 4096.0]}
    assert all(sum(bar) <= 4096.0 for bar in _bars(ch).values())
    text = dict(zip(ch["traces"][0]["x"], ch["traces"][0]["text"]))
    assert "in host memory, not stacked: 9216.0 MiB (params, grads, optimizer)" in text["fx/0 r0"]
    assert "in host memory, not stacked: 8192.0 MiB (grads, optimizer)" in text["fx/1 r0"]
    assert ch["notes"] == ["model states above the measured peak device, cut at it: fx/2",
                           "offloaded to host memory, so not in the device bar (sizes in the hover text): "
                           "fx/0, fx/1, fx/3"]


def test_offload_on_a_cpu_run_stacks_everything_in_the_rss():
    r = _rec(0, "zero2_offload", 1, 16, 1.0, memory={
        "model_state_breakdown_per_rank": [{"params": GIB, "grads": 2 * GIB, "optimizer": 6 * GIB}],
        "peak_rss_bytes_per_rank": [10 * GIB]})
    assert _bars(charts.memory([r])) == {"fx/0 r0": [1024.0, 2048.0, 6144.0, 1024.0]}   # 10 - 9 GiB


def _losses(*finals):
    return [_rec(i, "ddp", 1, 16, 1.0, final=f) for i, f in enumerate(finals)]


def test_sort_puts_nan_and_infinities_last_like_missing_values():
    recs = _losses(3.0, NAN, 1.0, 2.0, 0.5)
    final = lambda rs: [r["loss"]["final"] for r in rs]  # noqa: E731
    got = final(sort_records(recs, "loss.final"))
    assert got[:4] == [0.5, 1.0, 2.0, 3.0] and got[4] != got[4]          # was [3, nan, 0.5, 1, 2]
    got = final(sort_records(recs, "-loss.final"))
    assert got[:4] == [3.0, 2.0, 1.0, 0.5] and got[4] != got[4]
    mixed = _losses(3.0, INF, None, 1.0, -INF)   # non-finite and null after the numbers, in the default order
    assert [r["job"]["name"] for r in sort_records(mixed, "loss.final")] == ["fx/3", "fx/0", "fx/1", "fx/2", "fx/4"]


def test_group_by_puts_nan_after_the_numbers():
    groups = group_records(_losses(3.0, NAN, 1.0, 3.0), "loss.final")
    assert [str(v) for v, _ in groups] == ["1.0", "3.0", "nan"]
    assert [[r["job"]["name"] for r in runs] for _, runs in groups] == [["fx/2"], ["fx/0", "fx/3"], ["fx/1"]]


def test_the_lr_chart_median_leaves_a_diverged_run_out():
    recs = _losses(3.0, NAN, 2.0) + [_rec(5, "ddp", 1, 32, 1.0, final=INF)]
    (t,) = charts.lr_scaling(recs)["traces"]
    # b16: median(3.0, 2.0) = 2.5 (statistics.median of [3, nan, 2] gave nan); b32: no finite loss
    assert (t["x"], t["y"]) == ([16, 32], [2.5, None])
    assert t["text"] == ["lr 0.001; 1 of 3 diverged (NaN/inf loss, not in the median)",
                         "lr 0.001; 1 of 1 diverged (NaN/inf loss, not in the median)"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's sort")
def test_the_html_table_sort_puts_nan_last_both_ways():
    from scalelab.results.report import CMP_JS

    cells = ["3.0000", "nan", "1.0000", "-", "0.5000", "inf", "2.0000*"]
    js = CMP_JS + f"const c={json.dumps(cells)};" + \
        "console.log(JSON.stringify([[...c].sort((a,b)=>sortCmp(a,b,true)),[...c].sort((a,b)=>sortCmp(a,b,false))]));"
    asc, desc = json.loads(subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True).stdout)
    assert asc == ["0.5000", "1.0000", "2.0000*", "3.0000", "nan", "-", "inf"]
    assert desc == ["3.0000", "2.0000*", "1.0000", "0.5000", "nan", "-", "inf"]


class _Logger:
    def log_metrics(self, summary, step):
        self.summary, self.step = summary, step

    def save(self):
        pass


def test_wandb_job_summary_has_the_device_peak_and_mfu():
    from scalelab.results.run_logger import log_summary

    gpu = _rec(0, "fsdp", 2, 16, 1.0, mfu={"value": 0.42},
               memory={"peak_device_bytes_per_rank": [3 * GIB, 5 * GIB]})
    lg = _Logger()
    log_summary(lg, gpu)
    assert lg.summary["memory/peak_device_bytes_max"] == 5 * GIB and lg.summary["mfu"] == 0.42
    assert lookup(gpu, "memory/peak_device_bytes_max") == 5 * GIB       # the same name in compare --sort
    cpu = _Logger()
    log_summary(cpu, _rec(1, "ddp", 2, 16, 1.0))
    assert "memory/peak_device_bytes_max" not in cpu.summary


def test_wandb_sweep_table_has_the_device_peak_and_mfu():
    from scalelab.results.wandb_summary import RUN_COLUMNS, _row

    gpu = _rec(0, "fsdp", 2, 16, 1.0, mfu={"value": 0.42}, num_nodes=2,
               memory={"peak_device_bytes_per_rank": [3 * GIB, 5 * GIB]})
    row = dict(zip(RUN_COLUMNS, _row(gpu)))
    assert (row["peak_device_bytes_max"], row["mfu"], row["peak_rss_bytes_max"], row["num_nodes"]) == (
        5 * GIB, 0.42, 100 * MIB, 2)
    cpu = dict(zip(RUN_COLUMNS, _row(_rec(1, "ddp", 2, 16, 1.0, mfu=None))))
    assert (cpu["peak_device_bytes_max"], cpu["mfu"]) == (None, None)


def test_the_lr_chart_pools_only_exact_gradient_strategies():
    recs = [_rec(0, "ddp", 2, 32, 1.0, final=2.0), _rec(1, "fsdp", 2, 32, 1.0, final=2.2),
            _rec(2, "zero2", 4, 32, 1.0, final=2.4), _rec(3, "single", 1, 32, 1.0, final=2.6),
            _rec(4, "single", 2, 32, 1.0, final=5.0),            # 2 independent replicas of 16 each
            _rec(5, "local_sgd", 2, 32, 1.0, final=3.0), _rec(6, "ddp_powersgd", 2, 32, 1.0, final=3.5),
            _rec(7, "ddp", 2, 32, 1.0, final=4.0)]
    recs[7]["config"]["strategy"]["comm_hook"] = "powersgd"     # ddp_powersgd by another name
    got = [(t["name"], t["y"]) for t in charts.lr_scaling(recs)["traces"]]
    # pooled: median(2.0, 2.2, 2.4, 2.6) = 2.3 (was median of all eight: 2.8)
    assert got == [("lr_rule=none", [pytest.approx(2.3)]), ("lr_rule=none ddp x2", [4.0]),
                   ("lr_rule=none ddp_powersgd x2", [3.5]), ("lr_rule=none local_sgd x2", [3.0]),
                   ("lr_rule=none single x2", [5.0])]
