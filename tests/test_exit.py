"""A command whose work is done exits within its grace, whatever holds the exit: what
held it is said (``exit_stalled``, each thread's stack) and the command's code stands
(ops/cli/common.py ``watched_exit``)."""

from __future__ import annotations

import subprocess
import sys
import time

HELD = """
import asyncio, threading, time
from ops.cli import common
common.EXIT_GRACE_S = 0.5
async def work():
    threading.Thread(target=time.sleep, args=(60,), name="held").start()
    return 3
raise SystemExit(asyncio.run(common.watched_exit(work())))
"""


def test_a_thread_that_holds_the_exit_is_said_and_the_code_stands() -> None:
    """A non-daemon thread sleeping 60 s would hold the interpreter's exit as long: the
    process ends within seconds, with the work's code, naming the thread."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, timeout=30)
    assert time.monotonic() - began < 15
    assert done.returncode == 3
    said = (done.stdout + done.stderr).decode()
    assert "exit_stalled" in said and "held" in said


def test_a_clean_exit_is_not_held() -> None:
    """With nothing holding it, the process exits at once and says nothing of it."""
    quick = HELD.replace(
        'threading.Thread(target=time.sleep, args=(60,), name="held").start()', "pass"
    )
    done = subprocess.run([sys.executable, "-c", quick], capture_output=True, timeout=30)
    assert done.returncode == 3 and b"exit_stalled" not in done.stdout + done.stderr
