"""A command whose work is done exits within its grace, whatever holds the exit: what
held it is said (``exit_stalled``, each thread's stack) and the command's code stands
(ops/cli/common.py ``watched_exit``); a stop step that stalls is named while it stalls
(``stop_step``)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time

import pytest
from structlog.testing import capture_logs

from ops.cli import common

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


async def test_a_stop_step_that_stalls_is_named_while_it_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step of a stop that does not end is said (``stop_waiting``, naming it) while the
    stop still waits on it, not only once it ends (``stop_slow``): a stop that hangs for
    good tells where. A quick step says nothing."""
    monkeypatch.setattr(common, "SLOW_STOP_S", 0.1)
    release = asyncio.Event()
    with capture_logs() as logs:
        async with contextlib.AsyncExitStack() as stack:
            common.stop_step(stack, "the quick part", asyncio.sleep, 0)
            common.stop_step(stack, "the stuck part", release.wait)
            stopping = asyncio.ensure_future(stack.aclose())
            await asyncio.sleep(0.3)
            said = [(e["event"], e["part"]) for e in logs]
            assert said == [("stop_waiting", "the stuck part")]
            release.set()
            await stopping
    said = [(e["event"], e["part"]) for e in logs]
    assert said == [("stop_waiting", "the stuck part"), ("stop_slow", "the stuck part")]
