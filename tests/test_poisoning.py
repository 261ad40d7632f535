"""One consumer cannot make a site unreachable for another (issue 55's poisoning): it
sends bytes that are not TLS into tunnels to a site, which draw the real server's TLS
alert through every exit, and asks a ruled site's path that answers 403 to everyone.
What its traffic teaches acts for others only within its share of the pool
(endpoint/router/shares.py), and no request of it reaches more than 3 upstreams."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import random
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from endpoint.link.upstream import Upstream
from endpoint.router import choose, shares
from endpoint.router.choose import Pool
from endpoint.router.login import Want
from endpoint.router.router import Router
from events.sites import SiteRule
from ops.lab.testbed import ProxyLab, self_signed
from ops.nats.server import free_port
from tests.test_forward import TOKEN, _endpoint, _site

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


class _Mallorys:
    """Sites a consumer may run, or name, to make proxies fail on their way: a port where
    nothing listens (the SOCKS5 proxy's refusal), an answer that is not HTTP, no answer
    at all, and two sites that close before answering (a close from a second site is
    the proxy's failure, router/standing.py ``closed_on``)."""

    HOSTS = {"refused": "127.0.0.33", "garbage": "127.0.0.34", "silent": "127.0.0.35"}
    CLOSING = ("127.0.0.36", "127.0.0.37")

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self.held: list[asyncio.StreamWriter] = []
        self.accepted = 0

    async def handle(self, kind: str, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await r.readuntil(b"\r\n\r\n")
            if kind == "garbage":
                w.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
                await w.drain()
            elif kind == "silent":
                self.held.append(w)  # never answered: closed at the test's end
                return
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        w.close()

    def urls(self) -> list[str]:
        names = [*self.HOSTS, *(f"closing{i}" for i in range(len(self.CLOSING)))]
        return [f"http://{self._host(n)}:{self.ports[n]}/" for n in names]

    def _host(self, name: str) -> str:
        return self.HOSTS.get(name) or self.CLOSING[int(name.removeprefix("closing"))]

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[_Mallorys]:
        servers = []
        self.ports["refused"] = free_port(self.HOSTS["refused"])  # nothing listens there
        for name in ("garbage", "silent", "closing0", "closing1"):
            kind = "closing" if name.startswith("closing") else name
            host = self._host(name)
            self.ports[name] = port = free_port(host)
            handler = functools.partial(self.handle, kind)
            servers.append(await asyncio.start_server(handler, host, port))
        try:
            yield self
        finally:
            for w in self.held:
                w.close()
            for server in servers:
                server.close()


async def _through(relay: Router, name: str, url: str) -> int:
    """A GET of ``url`` through the endpoint as consumer ``name``: its status (0: none)."""
    proxy = f"http://{_login(name)}@127.0.0.1:{relay.port}"  # type: ignore[attr-defined]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(url, proxy=proxy) as r:
                await r.read()
                return r.status
    return 0


async def test_one_consumers_sites_that_fail_every_proxy_fail_at_most_its_share_for_anyone(
    lab: ProxyLab,
) -> None:
    """Eight SOCKS5 proxies (microsocks, dante and six more microsocks). Mallory asks,
    again and again, for a port where nothing listens, a site that answers what is not
    HTTP, one that never answers and two that close before answering: through each
    proxy the request dies on its way, as through a dead proxy. What it makes every
    consumer avoid is at most its share of the pool (2 proxies: each failure past it
    keeps the proxy out of Mallory's own picks at that site alone), and what it makes
    turned away at each of its sites too; no request of its reaches more than 3
    proxies; and Alice's pages, asked meanwhile and after, all come through."""
    extra = [lab.more(f"socks-{i}", "microsocks", "127.0.0.5").name for i in range(6)]
    async with (
        _Mallorys().serving() as mallorys,
        _site() as site,
        _endpoint(lab, "microsocks", "dante", *extra, proto="socks5", answer_s=1.0) as relay,
    ):
        assert len(relay.pool.upstreams) == 8
        urls, page = mallorys.urls() * 4, f"http://{site}/status/200"
        alice = [_through(relay, "alice", page) for _ in range(8)]
        said = await asyncio.gather(*(_through(relay, "mallory", u) for u in urls), *alice)
        assert said[len(urls) :] == [200] * 8, said
        assert all(s in (502, 503) for s in said[: len(urls)]), said
        now = time.monotonic()
        failed = [u.key for u in relay.pool.upstreams.values() if u.avoid_until > now]
        assert len(failed) <= 2, (failed, relay.outcomes.counts)
        for host in [*_Mallorys.HOSTS.values(), *_Mallorys.CLOSING]:
            marked = [u for u in relay.pool.upstreams.values() if host in u.turned_away]
            assert len(marked) <= 2, (host, len(marked))
        assert relay.outcomes.counts.get("upstream_failed_own", 0) > 0, relay.outcomes.counts
        assert mallorys.accepted <= 3 * (len(urls) - urls.count(urls[0])), mallorys.accepted
        assert [await _through(relay, "alice", page) for _ in range(8)] == [200] * 8


def test_a_consumers_share_of_failures_holds_across_sites_and_its_churn() -> None:
    """Failures on the way a consumer meets are the proxy's for everyone up to its share
    of the pool (5 %, at least 2) in 30 minutes, across all sites; past it, the proxy is
    left out of that consumer's picks at that site alone, for ``AVOID_S``. Refusals at
    more sites than the table of sites' pairs holds do not push its record of the share
    out: the share does not start again."""
    pool = Pool(rng=random.Random(1))
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 41)])
    ups = [pool.upstreams[k] for k in sorted(pool.upstreams)]
    router = Router(pool, lambda name, token: asyncio.sleep(0, True))
    mallory = Want("mallory")
    for n, up in enumerate(ups[:6]):
        router.charges.failed_on_the_way(mallory, "t", up, f"site{n % 2}.example", "request")
    avoided = [up for up in ups if up.avoid_until > 0]
    assert avoided == ups[:2], [up.key for up in avoided]
    assert router.outcomes.counts["upstream_failed_own"] == 4
    now = time.monotonic()
    assert router.charges.left_out("mallory", "site0.example", now) == {ups[2].key, ups[4].key}
    assert router.charges.left_out("mallory", "site1.example", now) == {ups[3].key, ups[5].key}
    assert router.charges.left_out("mallory", "elsewhere.example", now) == frozenset()
    assert router.charges.left_out("alice", "site0.example", now) == frozenset()
    later = now + choose.AVOID_S + 1
    assert router.charges.left_out("mallory", "site0.example", later) == frozenset()
    for n in range(shares.CONSUMER_SITES + 1):  # a refusal shared at a site of its own each
        router.shares.may_share("mallory", f"own{n}.example", len(ups), now)
    router.charges.failed_on_the_way(mallory, "t", ups[6], "site0.example", "request")
    assert ups[6].avoid_until == 0  # its share is still taken
