"""A verified candidate whose repeats partly failed: its medians are over the runs that completed,
and its status says how many ("completed 2 of 3"), not a bare "completed" next to an error."""
from scalelab.recommend.verify import measured_row

from .test_recommend import _rec, small_request


def test_a_partly_failed_candidate_says_how_many_runs_its_median_covers():
    from scalelab.recommend.space import enumerate_candidates

    req = small_request()
    c = enumerate_candidates(req)[0][0]
    failed = {"status": "failed", "error": "rank 1 failed first", "job": {"num": 6}}
    row = measured_row(c, [_rec(1000, 0, 0), _rec(1200, 3, 0), failed], "throughput", req.hardware, None)
    assert row["status"] == "completed 2 of 3" and row["error"] == "rank 1 failed first"
    assert row["measured_tokens_per_s"] == 1100 and row["runs"] == 3
    assert measured_row(c, [_rec(1000, 0, 0)], "throughput", req.hardware, None)["status"] == "completed"
