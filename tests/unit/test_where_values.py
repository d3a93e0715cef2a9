"""`scalelab compare --where KEY=VALUE` on numbers: a run matches when its value is numerically
VALUE, or when VALUE is exactly the text the table shows for it in its column. Rounding the stored
value at VALUE's last digit (before) matched values that differ: weight_decay=0 took 0.1,
scaling_efficiency=1 took 0.75, lr=1e-3 took 0.0014142 (shown 0.00141). Expected values by hand."""
from __future__ import annotations

import pytest

from scalelab.results.table import SelectError, filter_records

from .test_report import _rec


def _runs():
    a = _rec(0, "ddp", 2, 16, 100.0, lr=0.0014142, scaling_efficiency=0.75, config={"optim": {"weight_decay": 0.1}})
    b = _rec(1, "ddp", 1, 16, 2.4, lr=0.0042371, scaling_efficiency=1.0, config={"optim": {"weight_decay": 0.0}})
    return a, b


def _kept(where):
    a, b = _runs()
    try:
        kept = filter_records([a, b], [where])
    except SelectError:
        return []
    return ["a" if r is a else "b" for r in kept]


@pytest.mark.parametrize("where, kept", [
    ("config.optim.weight_decay=0", ["b"]),       # before: a's 0.1 too (0.1 rounded at the units is 0)
    ("scaling_efficiency=1", ["b"]),              # before: a's 0.75 too
    ("lr=1e-3", []),                              # before: a's 0.0014142 (rounded at 1e-3: 0.001)
    ("lr=0.001", []),
    ("lr=0.00141", ["a"]),                        # the table shows 0.0014142 as 0.00141
    ("lr/used=0.00141", ["a"]),                   # its W&B name: the same column
    ("lr=0.0014142", ["a"]),                      # exactly equal
    ("world_size=2.0", ["a"]),                    # an int typed as a float
    ("world_size=2", ["a"]),
    ("throughput.samples_per_s=2", []),           # before: b's 2.4
    ("throughput.samples_per_s=2.4", ["b"]),
    ("throughput.tokens_per_s=1e3", []),          # b: 153.6; a: 6400 (before: 1e3 took 1400-ish values)
    ("throughput.tokens_per_s=6400", ["a"]),
    ("throughput.tokens_per_s=6.4e3", ["a"]),     # numerically equal
    ("scaling_efficiency=0.75", ["a"]),
    ("scaling_efficiency=0.750", ["a"]),          # numerically equal
])
def test_where_matches_equal_numbers_and_the_shown_text_only(where, kept):
    assert _kept(where) == kept


def test_where_1e3_does_not_take_1400():
    a, b = _runs()
    a["throughput"]["tokens_per_s"] = 1400.0
    with pytest.raises(SelectError):               # before: kept a (1400 rounded at the thousands)
        filter_records([a, b], ["throughput.tokens_per_s=1e3"])
    b["throughput"]["tokens_per_s"] = 1000.0
    assert filter_records([a, b], ["throughput.tokens_per_s=1e3"]) == [b]
