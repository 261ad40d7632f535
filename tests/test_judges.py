"""Judges in every public format: the echo is found by the nonce, or the answer is not the
judge's; what surrounds the echo (its frame) tells an altered page."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agents.judges import read_echo

NONCE = "a1b2c3d4e5f6"


def _ppf(nonce: str = NONCE) -> bytes:
    return json.dumps(
        {
            "remote": "45.68.2.1",
            "peer": ["45.68.2.1", 4000],
            "method": "GET",
            "path": f"/judge?n={nonce}",
            "headers": [["Host", "j"], ["Via", "1.1 squid"]],
        }
    ).encode()


def _httpbin(nonce: str = NONCE) -> bytes:
    return json.dumps(
        {
            "args": {"n": nonce},
            "headers": {"Host": "j", "X-Forwarded-For": "45.67.0.1"},
            "origin": "45.68.2.3, 10.0.0.1",
            "url": f"http://j/get?n={nonce}",
        }
    ).encode()


def _azenv(nonce: str = NONCE) -> bytes:
    return (
        "<html><body><pre>\nREMOTE_ADDR = 45.68.2.4\nREQUEST_URI = /azenv.php?n="
        f"{nonce}\nQUERY_STRING = n={nonce}\nHTTP_HOST = j\nHTTP_VIA = 1.1 tinyproxy\n"
        "</pre></body></html>\n"
    ).encode()


def test_each_format_gives_the_address_and_the_headers() -> None:
    """ppf, httpbin and azenv answers give one address and header set each."""
    ppf, httpbin, azenv = (
        read_echo(_ppf(), NONCE),
        read_echo(_httpbin(), NONCE),
        read_echo(_azenv(), NONCE),
    )
    assert ppf is not None and (ppf.format, ppf.remote) == ("ppf", "45.68.2.1")
    assert ("Via", "1.1 squid") in ppf.headers
    assert httpbin is not None and (httpbin.format, httpbin.remote) == ("httpbin", "45.68.2.3")
    assert ("X-Forwarded-For", "45.67.0.1") in httpbin.headers
    assert azenv is not None and (azenv.format, azenv.remote) == ("azenv", "45.68.2.4")
    assert ("Via", "1.1 tinyproxy") in azenv.headers


def test_an_answer_without_our_nonce_is_not_the_judges() -> None:
    """Another check's nonce, a portal page or garbage is no echo."""
    assert read_echo(_ppf("ffffffffffff"), NONCE) is None
    assert read_echo(_httpbin("ffffffffffff"), NONCE) is None
    assert read_echo(_azenv("ffffffffffff"), NONCE) is None
    portal = b"<html><h1>Welcome to FreeWiFi</h1>Please log in.</html>"
    assert read_echo(portal, NONCE) is None
    # The nonce alone, outside any judge format (a page that reflects the URL), is not one.
    assert read_echo(f"<a href='/?n={NONCE}'>again</a>".encode(), NONCE) is None


def test_a_page_with_something_added_has_another_frame() -> None:
    """An appended script leaves the echo readable but changes its frame."""
    script = b"<script src=//ads.invalid/x.js></script>"
    for page in (_ppf(), _httpbin(), _azenv()):
        direct, altered = read_echo(page, NONCE), read_echo(page + script, NONCE)
        assert direct is not None and altered is not None
        assert altered.remote == direct.remote
        assert altered.frame != direct.frame


async def _get(host: str, port: int, target: str, host_header: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode()
    )
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_the_judge_answers_only_nonces_minted_for_it_once_in_time(tmp_path: Path) -> None:
    """No nonce, a made-up one, one for another judge, one of an agent not enrolled, one
    expired or dated past its lifetime, one used already: 403 with nothing echoed. An
    enrolled agent's fresh nonce gets a signed echo it verifies; the same echo with one
    header changed inside (its frame intact) is forged."""
    from aiohttp.test_utils import TestServer

    from agents.check import Judge
    from events.wire import NONCE_LIFETIME_S, judge_nonce
    from gateway.judge import JUDGE_DOOR, JudgeDoor, JudgeKeys, judge

    keys = JudgeKeys.load(tmp_path / "judge.key")
    enrolled = {"w1"}
    app = web.Application()
    app[JUDGE_DOOR] = JudgeDoor(keys, enrolled.__contains__)
    app.router.add_get("/judge", judge)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/judge"))
    host, port = "127.0.0.1", server.port
    here = f"{host}:{port}"
    key = keys.agent_key("w1")
    now = int(time.time())

    def minted(agent: str = "w1", judge_at: str = here, expires: int = now + 60) -> str:
        return judge_nonce(agent, keys.agent_key(agent), judge_at, expires, os.urandom(8).hex())

    try:
        refused = {
            "none": "/judge",
            "random": "/judge?n=0123456789abcdef",
            "wrong key": "/judge?n=" + judge_nonce("w1", b"0" * 32, here, now + 60, "ab"),
            "another judge": "/judge?n=" + minted(judge_at=f"{host}:{port + 1}"),
            "not enrolled": "/judge?n=" + minted(agent="w2"),
            "expired": "/judge?n=" + minted(expires=now - 120),
            "too far ahead": "/judge?n=" + minted(expires=now + NONCE_LIFETIME_S + 600),
        }
        for case, target in refused.items():
            status, body = await _get(host, port, target, here)
            assert status == 403, case
            assert b"remote" not in body and b"127.0.0.1" not in body, case
        once = minted()
        assert (await _get(host, port, f"/judge?n={once}", here))[0] == 200
        assert (await _get(host, port, f"/judge?n={once}", here))[0] == 403  # spent
        with pytest.raises(ConnectionError, match="403"):
            await Judge.discover(url, signer=("w1", b"0" * 32))
        ours = await Judge.discover(url, signer=("w1", key))
        assert ours.format == "ppf"
        nonce = ours.nonce()
        status, body = await _get(host, port, f"/judge?n={nonce}", here)
        assert status == 200
        honest = read_echo(body, nonce, key)
        assert honest is not None and not honest.forged
        rewritten = read_echo(body.replace(here.encode(), b"10.0.0.1:80"), nonce, key)
        assert rewritten is not None and rewritten.frame == honest.frame and rewritten.forged
        enrolled.discard("w1")  # revoked: its next nonce is refused
        assert (await _get(host, port, f"/judge?n={minted()}", here))[0] == 403
    finally:
        await server.close()


def _httpbin_echo(request: web.Request) -> web.Response:
    """What an httpbin-style judge answers: the request, as it saw it."""
    echo = {"args": dict(request.query), "headers": dict(request.headers)}
    return web.json_response({**echo, "origin": request.remote, "url": str(request.url)})


async def _judge_at(get: Any) -> tuple[Any, str]:
    """A judge on loopback answering ``GET /get`` with ``get``: its server and URL."""
    from aiohttp.test_utils import TestServer

    app = web.Application()
    app.router.add_get("/get", get)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("/get"))


async def _held_judge() -> tuple[asyncio.Event, asyncio.Event, Any, str]:
    """A judge that answers while ``gate`` is set and holds its answer while not;
    ``reached`` is set when an ask arrives. (gate, reached, its server, its URL)."""
    gate, reached = asyncio.Event(), asyncio.Event()
    gate.set()

    async def get(request: web.Request) -> web.Response:
        reached.set()
        await gate.wait()
        return _httpbin_echo(request)

    server, url = await _judge_at(get)
    return gate, reached, server, url


async def test_an_answer_to_an_ask_sent_before_a_check_does_not_clear_the_judge() -> None:
    """A health ask reaches the judge, a check begins, the judge answers the ask and then
    dies: the check's failure is the judge's (``answers`` is False), since nothing sent
    after the check began was answered. Counting the answer's arrival made it the
    proxy's (tests/test_world.py's killed judge, now and then)."""

    from agents.judgepool import JudgePool

    gate, reached, server, url = await _held_judge()
    pool = await JudgePool([url], own=[url], health_every_s=3600, timeout_s=2).start()
    try:
        judge = pool.states[0].judge
        assert judge is not None and judge.format == "httpbin"
        gate.clear()
        reached.clear()
        held = asyncio.ensure_future(pool.answers(judge, time.monotonic()))  # an ask...
        await asyncio.wait_for(reached.wait(), 5)  # ...at the judge, which holds its answer
        began = time.monotonic()  # a check begins
        gate.set()
        assert await asyncio.wait_for(held, 5)  # the judge answered that ask
        await server.close()  # and died
        assert not await asyncio.wait_for(pool.answers(judge, began), 5)
        assert not pool.states[0].healthy
    finally:
        await pool.stop()
        await server.close()


async def test_while_no_judge_answers_none_is_benched_past_the_base_cooldown() -> None:
    """The agent's own network down benches every judge: each is asked again within the
    base cooldown however often it failed, so the agent sees its network back (and tells
    the fleet) within it; beside a judge that answers, a failing one's bench doubles."""

    from agents.judgepool import JudgePool

    async def get(request: web.Request) -> web.Response:
        return _httpbin_echo(request)

    server, up = await _judge_at(get)
    down = "http://127.0.0.1:9/get"  # discard: refused
    try:
        alone = JudgePool([down], own=[down], timeout_s=2, cooldown_s=30)
        await alone.start(require=False)
        for _ in range(5):
            await alone._ask(alone.states[0], quiet=True)
        assert alone.outage().startswith("no judge answers directly")
        assert alone.states[0].cooldown_s == 30  # not 30 * 2**5
        await alone.stop()
        beside = await JudgePool([up, down], own=[up, down], timeout_s=2, cooldown_s=30).start()
        for _ in range(5):
            await beside._ask(beside.states[1], quiet=True)
        assert beside.states[0].healthy and beside.states[1].cooldown_s == 30 * 2**5
        await beside.stop()
    finally:
        await server.close()


async def test_a_stop_ends_the_asks_in_flight_and_closes_their_connections() -> None:
    """A check whose judge is asked (``answers``) and that is gone before the answer
    leaves the ask running on its own; the pool's stop ends it and closes its connection,
    so nothing of the pool is left when its loop closes (an unclosed transport at the
    teardown of tests/test_world.py's killed judge, once)."""

    from agents.judgepool import JudgePool

    gate, reached, server, url = await _held_judge()
    pool = await JudgePool([url], own=[url], health_every_s=3600, timeout_s=30).start()
    try:
        judge = pool.states[0].judge
        assert judge is not None
        gate.clear()
        reached.clear()
        check = asyncio.ensure_future(pool.answers(judge, time.monotonic()))
        await asyncio.wait_for(reached.wait(), 5)  # the ask is at the judge, held there
        check.cancel()  # the check is gone; its ask goes on, shielded
        await asyncio.gather(check, return_exceptions=True)
        asks = list(pool._asking.values())
        assert asks and not any(a.done() for a in asks)
        await asyncio.wait_for(pool.stop(), 5)
        assert all(a.done() for a in asks) and not pool._asking
    finally:
        gate.set()
        await server.close()
