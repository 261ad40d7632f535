"""The world in a box cleans up after itself: its own module, so no other box is up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.lab.world import World, boxes, unavailable
from tests.helpers import process_gone

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def test_the_box_leaves_nothing_behind(tmp_path: Path) -> None:
    """After stop: no namespace, no link, no route, no process of the box."""
    before = set(boxes())
    w = World(tmp_path / "w", name="ppfw9999999").start()
    pids = subprocess.run(
        ["ip", "netns", "pids", w.name], capture_output=True, text=True, check=True
    ).stdout.split()
    assert pids and w.name in boxes()
    w.stop()
    assert set(boxes()) == before - {w.name}
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert f"{w.name}h" not in links
    for pid in pids:
        assert process_gone(pid), pid
