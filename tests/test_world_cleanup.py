"""The world in a box cleans up after itself: its own module, so no other box is up."""

from __future__ import annotations

import signal
import subprocess
import sys
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


def test_sigterm_leaves_nothing_behind(tmp_path: Path) -> None:
    """A process holding a box, ended with SIGTERM (no Ctrl-C, no context manager's
    exit): it exits, and its namespace, link and processes are gone with it."""
    name = "ppfw9999998"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ops.lab.world import World\n"
        f"World(Path({str(tmp_path / 'w')!r}), name={name!r}).start()\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert name in boxes()
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=True
        ).stdout.split()
        assert pids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert name not in boxes()
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert f"{name}h" not in links
    for pid in pids:
        assert process_gone(pid), pid
