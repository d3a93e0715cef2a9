"""A plan for more devices per node than a node of the profile has is said to be so (stderr, and
`warning` in --json): 8 ranks on this 2-core host were planned at 142k tokens/s (measured 14k) and
'fits' without a word."""
import json

import pytest

from scalelab.cli import main

FLAGS = ["plan", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "64",
         "--strategy", "ddp", "--global-batch", "32", "--hardware", "h100_sxm"]


def _plan(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    return done.value.code, capsys.readouterr()


def test_more_devices_per_node_than_the_profile_has_is_a_warning(capsys):
    code, out = _plan([*FLAGS, "--devices", "16"], capsys)
    assert code == 0 and out.err == ("warning: 16 devices per node, but a h100_sxm node has 8 devices: the figures "
                                     "are for devices it does not have\n")
    code, out = _plan([*FLAGS, "--devices", "16", "--json"], capsys)
    assert "devices it does not have" in json.loads(out.out)["warning"]
    code, out = _plan([*FLAGS, "--devices", "8"], capsys)
    assert code == 0 and out.err == "" and "warning" not in out.out
