"""A proxy's download speed (agents/speed.py): bytes from ppf's own judge, to its own
checks' nonces alone, timed through a real proxy behind relays shaped to known rates;
and the checker's byte budget."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from agents.check import Judge
from agents.speed import SpeedBudget, speed
from events.wire import judge_nonce
from gateway.judge import JUDGE_DOOR, MAX_SPEED_BYTES, JudgeDoor, JudgeKeys, judge_bytes
from ops.lab.inet import relay
from ops.lab.testbed import ProxyLab

SIZE = 256 * 1024


async def _judge(tmp_path: Path) -> tuple[TestServer, JudgeKeys]:
    keys = JudgeKeys.load(tmp_path / "judge.key")
    app = web.Application()
    app[JUDGE_DOOR] = JudgeDoor(keys, {"c1"}.__contains__)
    app.router.add_get("/judge/bytes", judge_bytes)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, keys


async def _get(port: int, target: str) -> tuple[int, int]:
    """(status, body bytes) of a GET to the judge on ``port``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    )
    raw = await reader.read(-1)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), len(body)


async def test_the_judges_bytes_are_for_ppfs_checks_alone(tmp_path: Path) -> None:
    """No nonce, another agent's made-up one, a size out of bounds: refused, nothing
    sent; an enrolled agent's fresh nonce gets exactly the bytes asked for, once."""
    server, keys = await _judge(tmp_path)
    port = server.port
    assert port is not None
    here = f"127.0.0.1:{port}"

    def minted(agent: str = "c1") -> str:
        key = keys.agent_key(agent)
        return judge_nonce(agent, key, here, int(time.time()) + 60, os.urandom(8).hex())

    try:
        status, sent = await _get(port, f"/judge/bytes?size={SIZE}")
        assert status == 403 and sent < 100  # the reason, not the bytes
        assert (await _get(port, f"/judge/bytes?n={minted('c2')}&size={SIZE}"))[0] == 403
        assert (await _get(port, f"/judge/bytes?n={minted()}&size=0"))[0] == 400
        too_big = MAX_SPEED_BYTES + 1
        assert (await _get(port, f"/judge/bytes?n={minted()}&size={too_big}"))[0] == 400
        once = minted()
        assert await _get(port, f"/judge/bytes?n={once}&size={SIZE}") == (200, SIZE)
        assert (await _get(port, f"/judge/bytes?n={once}&size={SIZE}"))[0] == 403
    finally:
        await server.close()


async def test_a_download_through_a_proxy_measures_its_relays_rate(
    lab: ProxyLab, tmp_path: Path
) -> None:
    """microsocks behind relays carrying 100 and 400 kB/s: each download through it from
    the judge is timed within a fifth of its relay's rate; without a signing judge,
    nothing is downloaded."""
    server, keys = await _judge(tmp_path)
    assert server.port is not None
    microsocks = next(p for p in lab.proxies if p.name == "microsocks")
    relays = []
    try:
        signer = ("c1", keys.agent_key("c1"))
        judge = Judge("127.0.0.1", server.port, "/judge", "", signer=signer)
        measured = []
        for rate in (100, 400):
            shaped = relay(microsocks.port, 10, rate_kb_s=rate)
            relays.append(await asyncio.start_server(shaped, "127.0.0.1", 0))
            port = relays[-1].sockets[0].getsockname()[1]
            kb_s = await speed("127.0.0.1", port, "socks5", judge, SIZE, timeout=20)
            assert abs(kb_s - rate) <= rate / 5, (rate, kb_s)
            measured.append(kb_s)
        unsigned = Judge("127.0.0.1", server.port, "/judge", "")
        assert await speed("127.0.0.1", microsocks.port, "socks5", unsigned, SIZE) == 0
    finally:
        for r in relays:
            r.close()
        await server.close()


def test_the_checkers_budget_holds_its_downloads_to_its_bytes_an_hour() -> None:
    """A budget of 600 KiB an hour takes two downloads of 256 KiB, refuses the third,
    and has room for one again once 168 KiB more have refilled (17 minutes)."""
    now = [0.0]
    budget = SpeedBudget(600 * 1024, clock=lambda: now[0])
    assert budget.take(SIZE) and budget.take(SIZE)
    assert not budget.take(SIZE)
    now[0] = 900.0  # 150 KiB more: 238 KiB, not yet 256
    assert not budget.take(SIZE)
    now[0] = 1_020.0
    assert budget.take(SIZE) and budget.spent == 3 * SIZE


def test_a_proxy_is_timed_again_only_after_the_budgets_interval() -> None:
    """A proxy timed is not timed again within ``every_s``, whatever the bytes left;
    another one is; each is due again once the interval since its own timing passed."""
    now = [0.0]
    budget = SpeedBudget(64 * SIZE, clock=lambda: now[0], every_s=3600)
    a, b = ("45.1.2.3", 1080), ("45.1.2.4", 1080)
    assert budget.take(SIZE, a)
    assert not budget.take(SIZE, a)
    now[0] = 1_800.0
    assert budget.take(SIZE, b)
    now[0] = 3_600.0
    assert budget.take(SIZE, a)
    assert not budget.take(SIZE, b)
