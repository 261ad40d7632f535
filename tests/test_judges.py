"""Judges in every public format: the echo is found by the nonce, or the answer is not the
judge's; what surrounds the echo (its frame) tells an altered page."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

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


async def test_the_public_judge_answers_only_agents_and_signs(tmp_path: Path) -> None:
    """A stranger's nonce gets 403; an agent's gets a signed echo it can verify; the same
    echo with one header changed inside (its frame intact) is forged."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from agents.check import Judge, _request
    from gateway.judge import JUDGE_KEYS, JudgeKeys, judge

    keys = JudgeKeys.load(tmp_path / "judge.key")
    app = web.Application()
    app[JUDGE_KEYS] = keys
    app.router.add_get("/judge", judge)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/judge"))
    try:
        with pytest.raises(ConnectionError, match="403"):
            await Judge.discover(url, signer=("w1", b"0" * 32))
        signer = ("w1", keys.agent_key("w1"))
        ours = await Judge.discover(url, signer=signer)
        assert ours.format == "ppf" and ours.signer == signer
        reader, writer = await asyncio.open_connection(ours.host, ours.port)
        nonce = ours.nonce()
        writer.write(
            f"GET /judge?n={nonce} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        raw = await reader.read()
        writer.close()
        body = raw.partition(b"\r\n\r\n")[2]
        honest = read_echo(body, nonce, signer[1])
        assert honest is not None and not honest.forged
        rewritten = read_echo(body.replace(b'"Host","x"', b'"Host","y"'), nonce, signer[1])
        assert rewritten is not None and rewritten.frame == honest.frame and rewritten.forged
        assert _request  # the agent's own request path is the one discover used
    finally:
        await server.close()
