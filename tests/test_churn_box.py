"""The churn lab played in the world in a box: real proxies that really die, each in
the way the plan says, and come back; nothing left behind."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agents.check import Judge, check
from ops.lab.churn import Down, Plan
from ops.lab.world import World, boxes, unavailable
from tests.helpers import process_gone

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

SPEED = 10
# Six proxies (microsocks, tinyproxy, in turn): the first three down from simulated
# 30 s to 60 s (3 to 6 s of wall time), one in each of the three ways; the rest up.
DOWN = {0: "refusing", 1: "silent", 2: "tarpit"}
PLAN = Plan(
    profile="test",
    seed=0,
    duration_ms=600_000,
    servers=("microsocks", "tinyproxy") * 3,
    rtt_ms=(100, 150, 200, 250, 300, 350),
    downs=tuple(((Down(30_000, 60_000, DOWN[i]),) if i in DOWN else ()) for i in range(6)),
)


async def _behaviour(addr: str, port: int, judge: Judge) -> str:
    """What a client sees: works, refused, silent (no connect) or tarpit (no answer)."""
    try:
        async with asyncio.timeout(1.5):
            _, writer = await asyncio.open_connection(addr, port)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "silent"
    writer.close()
    result = await check(addr, port, None, judge, timeout=2.5)
    if result.ok:
        return "works"
    return "tarpit" if result.error.startswith("TimeoutError") else result.error


async def _all(world: World, judge: Judge) -> list[str]:
    return list(
        await asyncio.gather(*(_behaviour(a, p, judge) for a, p in world.churn_addresses()))
    )


async def test_the_plan_is_played_by_real_proxies(tmp_path: Path) -> None:
    """Before the deaths every proxy works through a public judge, as the lab's truth
    says; during them each refuses, stays silent or holds the connection as planned;
    after them all work again (the killed process was started anew)."""
    with World(tmp_path / "w", churn=PLAN, speed=SPEED) as world:
        judge = await Judge.discover(world.judges["httpbin"])
        assert await _all(world, judge) == ["works"] * 6
        assert all(world.churn_up(i) for i in range(6))
        await asyncio.sleep(max(0.0, world.churn_t0 + 3.3 - time.time()))
        assert [world.churn_up(i) for i in range(6)] == [False] * 3 + [True] * 3
        got = await _all(world, judge)
        assert got == ["refused", "silent", "tarpit", "works", "works", "works"], got
        await asyncio.sleep(max(0.0, world.churn_t0 + 6.5 - time.time()))
        assert await _all(world, judge) == ["works"] * 6
        page = (world.root / "world.json").read_text()
        assert all(f"{a}:{p}" in page for a, p in world.churn_addresses())


def test_the_churn_box_leaves_nothing_behind(tmp_path: Path) -> None:
    """After stop: no namespace, and none of the churn's proxy processes."""
    before = set(boxes())
    world = World(tmp_path / "w", churn=PLAN, speed=SPEED, name="ppfw9999998").start()
    pids = subprocess.run(
        ["ip", "netns", "pids", world.name], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(pids) >= 7  # the box's internet and the six proxies
    world.stop()
    assert set(boxes()) == before - {world.name}
    for pid in pids:
        assert process_gone(pid), pid


def test_ppf_lab_churn_stands_the_lab_up_and_takes_it_down(tmp_path: Path) -> None:
    """The command prints where the page is, the page lists every proxy, and SIGTERM
    removes the box."""
    before = set(boxes())
    cmd = [sys.executable, "-m", "ops.cli", "lab", "churn", "--proxies", "4", "--speed", "10"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            where = json.loads(proc.stdout.readline())
            assert where["proxies"] == 4 and set(boxes()) - before
            with urllib.request.urlopen(where["page"], timeout=5) as page:
                assert len(page.read().decode().split()) == 4
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    assert set(boxes()) == before
