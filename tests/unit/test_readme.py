"""The README's config-group table names every config a user can choose."""
from __future__ import annotations

import re

from scalelab.paths import conf_dir

from ..conftest import REPO


def test_config_table_lists_every_choice():
    readme = (REPO / "README.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.*?) \|", readme, re.M)}
    for group in sorted(p for p in conf_dir().iterdir() if p.is_dir()):
        names = {f.stem for f in group.glob("*.yaml") if not f.stem.endswith("_calibrated")}
        assert group.name in rows, f"README config table lacks the group {group.name}"
        listed = set(re.findall(r"`(\w+)`", rows[group.name]))
        assert names <= listed, f"README config table, {group.name}: missing {sorted(names - listed)}"
