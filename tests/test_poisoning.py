"""One consumer cannot make a site unreachable for another (issue 55's poisoning): it
sends bytes that are not TLS into tunnels to a site, which draw the real server's TLS
alert through every exit, and asks a ruled site's path that answers 403 to everyone.
What its traffic teaches acts for others only within its share of the pool
(endpoint/router/shares.py), and no request of it reaches more than 3 upstreams."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from endpoint.router.router import Router
from events.sites import SiteRule
from ops.lab.testbed import ProxyLab, self_signed
from ops.nats.server import free_port
from tests.test_forward import TOKEN, _endpoint

TLS_SITE, RULED_SITE = "127.0.0.30", "127.0.0.31"
PAGE = b"<html><title>the shop</title>the real page</html>"


class _Site:
    """A site on ``host``: every connection counted as it is accepted (before TLS, so a
    handshake that fails counts too); ``/forbidden`` answers 403 to everyone."""

    def __init__(self) -> None:
        self.accepted = 0

    async def handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: ssl.SSLContext | None
    ) -> None:
        self.accepted += 1
        try:
            if tls is not None:
                await writer.start_tls(tls)
            head = await reader.readuntil(b"\r\n\r\n")
            forbidden = b" /forbidden" in head.split(b"\r\n", 1)[0]
            status, body = (b"403 Forbidden", b"no") if forbidden else (b"200 OK", PAGE)
            writer.write(
                b"HTTP/1.1 %s\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (status, len(body), body)
            )
            await writer.drain()
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the garbage drew the server's alert, or the client went away
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def _sites(root: Path) -> AsyncIterator[tuple[_Site, _Site, int]]:
    """The TLS site on port 443 and the ruled site on a free port (its port given)."""
    cert, key = self_signed(root, "poisoned")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    secure, ruled = _Site(), _Site()
    port = free_port(RULED_SITE)
    servers = [
        await asyncio.start_server(lambda r, w: secure.handle(r, w, tls), TLS_SITE, 443),
        await asyncio.start_server(lambda r, w: ruled.handle(r, w, None), RULED_SITE, port),
    ]
    try:
        yield secure, ruled, port
    finally:
        for server in servers:
            server.close()


def _login(name: str) -> str:
    return f"{name}:{TOKEN}"


async def _alice(relay: Router, ruled_port: int) -> float:
    """Alice's share of real pages: 15 HTTPS requests to the TLS site and 15 plain-HTTP
    requests to the ruled site's page, each on a new connection."""
    proxy = f"http://{_login('alice')}@127.0.0.1:{relay.port}"  # type: ignore[attr-defined]
    got = 0
    timeout = aiohttp.ClientTimeout(total=20)
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for url in [f"https://{TLS_SITE}/"] * 15 + [f"http://{RULED_SITE}:{ruled_port}/"] * 15:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url, proxy=proxy, ssl=False) as r:
                    got += r.status == 200 and await r.read() == PAGE
    return got / 30


async def _mallory_tunnel(relay: Router) -> None:
    """A tunnel to the TLS site carrying bytes that are not TLS, read until it ends."""
    port = relay.port  # type: ignore[attr-defined]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(_login("mallory").encode())
    writer.write(
        b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\nProxy-Authorization: Basic %s\r\n\r\n"
        % (TLS_SITE.encode(), TLS_SITE.encode(), auth)
    )
    try:
        async with asyncio.timeout(15):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"GET / HTTP/1.1\r\nHost: not-tls\r\n\r\n")
            while await reader.read(65536):
                pass
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _mallory_forbidden(relay: Router, ruled_port: int, n: int) -> int:
    """Mallory asks the ruled site's 403 path; the status it got."""
    proxy = f"http://{_login('mallory')}@127.0.0.1:{relay.port}"  # type: ignore[attr-defined]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        url = f"http://{RULED_SITE}:{ruled_port}/forbidden?{n}"
        async with http.get(url, proxy=proxy) as r:
            return r.status


async def test_one_consumers_alerts_and_403s_leave_anothers_share_of_real_pages(
    lab: ProxyLab, tmp_path: Path
) -> None:
    """Alice's share of real pages through the endpoint (three HTTP proxies of the lab,
    each its own exit), before and after Mallory sends 10 tunnels of non-TLS bytes to
    the same site and asks the ruled site's 403 path 10 times: at least 99 % of what it
    was. Each of Mallory's requests reaches at most 3 upstreams (the sites count every
    connection they accept), and what Mallory taught the endpoint for everyone is at
    most its share: 2 proxies a site."""
    async with (
        _sites(tmp_path) as (secure, ruled, ruled_port),
        _endpoint(lab, "squid", "tinyproxy-via", "tinyproxy-elite") as relay,
    ):
        relay.pool.rules = (SiteRule(site=RULED_SITE),)  # an operator's rule: 403 is a block
        for up in relay.pool.upstreams.values():
            up.https = "yes"  # each tunnels (CONNECT), as the lab's HTTP proxies do
        before = await _alice(relay, ruled_port)
        assert before == 1.0, before
        for n in range(10):
            accepted = secure.accepted
            await _mallory_tunnel(relay)
            assert secure.accepted - accepted <= 3, (n, secure.accepted - accepted)
            accepted = ruled.accepted
            # The site's 403, or, once every proxy is out of its own picks, the endpoint's
            # 503: either way its own.
            assert await _mallory_forbidden(relay, ruled_port, n) in (403, 503)
            assert ruled.accepted - accepted <= 3, (n, ruled.accepted - accepted)
        for site in (TLS_SITE, RULED_SITE):
            marked = [u for u in relay.pool.upstreams.values() if site in u.turned_away]
            assert len(marked) <= 2, (site, len(marked))
        after = await _alice(relay, ruled_port)
        assert after >= 0.99 * before, (before, after)
