"""The nearest layouts that fit keep the asked global batch: `plan --params 7B --strategy zero3
--devices 8 --global-batch 64` suggested "strategy=tp: 46.61 GiB per device, step 390 ms", which was
tp's dp 1 x the old micro-batch 8 = batch 8, not 64 (planned at 64: 285 GiB), and fsdp_tp (dp 4)
at batch 32. A suggestion re-splits the 64 over its own dp and prints the split."""
import json

import pytest

from ..conftest import run_cli as _run

# vocab 50304 (a multiple of 128): the trainer lets tp split it, so tp and fsdp_tp are suggestions
BASE = ["plan", "--params", "7B", "--vocab", "50304", "--devices", "8", "--global-batch", "64",
        "--hardware", "h100_sxm"]


def test_every_suggestion_keeps_the_global_batch_and_prints_its_split(capsys):
    code, out = _run([*BASE, "--strategy", "ddp", "--json"], capsys)
    alts = json.loads(out.out)["alternatives"]
    assert code == 1 and alts
    for a in alts:
        assert a["global_batch"] == 64 and a["micro_batch"] * a["micro_batches"] * a["dp"] == 64, a
    by = {a["change"]: a for a in alts}
    # tp 8 on 8 devices: dp 8 / 8 = 1, so the whole 64 is one replica's: micro x accumulation = 64
    assert by["strategy=tp"]["dp"] == 1 and by["strategy=tp"]["micro_batch"] * by["strategy=tp"]["micro_batches"] == 64
    # fsdp_tp's tp 2: dp 4, 16 sequences a replica
    assert by["strategy=fsdp_tp"]["dp"] == 4
    assert by["strategy=fsdp_tp"]["micro_batch"] * by["strategy=fsdp_tp"]["micro_batches"] == 16
    code, out = _run([*BASE, "--strategy", "ddp"], capsys)
    tp = by["strategy=tp"]
    assert (f"  strategy=tp (micro-batch {tp['micro_batch']} x {tp['micro_batches']} accumulation x dp 1 = "
            "global batch 64): ") in out.err


def test_a_suggestion_is_what_planning_it_gives(capsys):
    """Planning the suggested tp layout at the asked batch gives the suggestion's figures and fits."""
    code, out = _run([*BASE, "--strategy", "ddp", "--json"], capsys)
    tp = next(a for a in json.loads(out.out)["alternatives"] if a["change"] == "strategy=tp")
    code, out = _run([*BASE, "--strategy", "tp", "--micro-batch", str(tp["micro_batch"]), "--json"], capsys)
    doc = json.loads(out.out)
    assert code == 0 and doc["memory"]["fits"] and doc["inputs"]["parallel"]["global_batch"] == 64
    assert doc["memory"]["total_bytes_per_device"] == pytest.approx(tp["total_bytes"])
    assert doc["time"]["step_s"] == pytest.approx(tp["step_s"])


def test_more_devices_keep_the_global_batch(capsys):
    """16 devices for zero3's 64: dp 16, 4 sequences each (it was micro-batch 8 at 16 devices: batch 128)."""
    code, out = _run([*BASE, "--strategy", "zero3", "--json"], capsys)
    alts = {a["change"]: a for a in json.loads(out.out)["alternatives"]}
    a = alts["16 devices (2 node(s) x 8)"]
    assert (a["dp"], a["micro_batch"], a["micro_batches"], a["global_batch"]) == (16, 4, 1, 64)
