"""A consumer told what it got wrong in its endpoint login, the real endpoint on a port:
407 with the reason in the body and in the ``Proxy-Authenticate`` realm, for plain HTTP
and CONNECT, the token never said back."""

from __future__ import annotations

import asyncio
import base64

from endpoint.connection.client import serve
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.router import Router
from tests.test_walls_endpoint import _recording_upstream

TOKEN = "t0ken-secret"


async def test_a_login_mistake_is_answered_with_what_is_wrong() -> None:
    """A misspelt option, a bad value of each kind and a wrong token each get a 407
    whose body and realm name the mistake (a misspelling with the option it resembles);
    the token is in no answer; a good login is carried."""

    async def login_ok(name: str, token: str) -> bool:
        return name == "shop" and token == TOKEN

    async with _recording_upstream() as (up_port, heard):
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", up_port, "http", https="yes", latency_ms=5)])
        relay = Router(pool, login_ok, login_failures_burst=100)
        server = await serve(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def ask(user: str, token: str = TOKEN, connect: bool = False) -> bytes:
            auth = base64.b64encode(f"{user}:{token}".encode())
            line = b"CONNECT 93.184.216.34:443" if connect else b"GET http://93.184.216.34/"
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nProxy-Authorization: Basic %s"
                b"\r\n\r\n" % (line, auth)
            )
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

        try:
            said = {
                "shop-sesion-a1": b"is 'sesion' meant as the option 'session'?",
                "shop-proto-sock5": b"proto: one of http, https, socks4, socks5",
                "shop-strategy-random": b"strategy: one of weighted, roundrobin, lru",
                "shop-maxlat-abc": b"maxlat: a number",
                "shop-country-zzzz": b"country: ISO 3166 alpha-2 codes",
            }
            for user, reason in said.items():
                for connect in (False, True):
                    got = await ask(user, connect=connect)
                    head, _, body = got.partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 407"), (user, got)
                    assert reason in body, (user, body)
                    realm = next(h for h in head.split(b"\r\n") if h.startswith(b"Proxy-Auth"))
                    assert reason[:20] in realm and b"\r" not in realm, (user, realm)
                    assert TOKEN.encode() not in got
            wrong = await ask("shop", token="not-it")
            assert wrong.startswith(b"HTTP/1.1 407") and b"no consumer 'shop' with this" in wrong
            assert b"not-it" not in wrong
            assert heard == []
            assert (await ask("shop")).startswith(b"HTTP/1.1 200")
        finally:
            server.close()
            await server.wait_closed()
            relay.close()
