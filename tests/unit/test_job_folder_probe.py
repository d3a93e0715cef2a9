"""A job folder that cannot be created although write permission says yes (root; /proc, /sys) is
one line before any job: Hydra's own mkdir raised a FileNotFoundError / PermissionError traceback
(`scalelab-train hydra.run.dir=/proc/nope`). The probe leaves nothing behind where it can."""
import os

import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_folder_the_system_will_not_make_is_one_line():
    with pytest.raises(ConfigError, match=r"^hydra.run.dir /proc/nope/run cannot be created: No such file or directory$"):
        preflight(["hydra.run.dir=/proc/nope/run"], data=False)


def test_the_probe_leaves_no_folder(tmp_path):
    preflight([f"hydra.run.dir={tmp_path / 'a' / 'b' / 'run'}"], data=False)
    assert list(tmp_path.iterdir()) == []
