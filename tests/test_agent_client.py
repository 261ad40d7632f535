"""The agent's gateway client when the way to the gateway is broken: answers, never raises
where the agent would lose its batch (heartbeats, releases), and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agents.gateway_client import GatewayClient, GatewayError
from ops.nats.server import free_port


async def _broken_proxy() -> TestServer:
    """What a reverse proxy says while the gateway behind it restarts: HTML, 502."""

    async def bad_gateway(_: web.Request) -> web.Response:
        return web.Response(status=502, text="<html><h1>502 Bad Gateway</h1></html>")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", bad_gateway)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.mark.parametrize("way", ["502 page", "nobody listens"])
async def test_a_broken_way_to_the_gateway_is_an_answer_not_a_crash(
    way: str, tmp_path: Path
) -> None:
    """A 502 page or a closed port is a status the agent acts on, never an exception."""
    server = await _broken_proxy() if way == "502 page" else None
    base = str(server.make_url("")).rstrip("/") if server else f"http://127.0.0.1:{free_port()}"
    try:
        async with GatewayClient(base, "t", "w1", tmp_path / "outbox.jsonl") as gw:
            assert gw.via == "http"  # no NATS offer could be had
            assert await gw.heartbeat("l1") is False
            assert await gw.release("l1", "done") is False  # after its retries
            with pytest.raises(GatewayError, match=r"502|Connect"):
                await gw.lease("source", 1, 60)
            with pytest.raises(GatewayError):
                await gw.whoami()
    finally:
        if server is not None:
            await server.close()
