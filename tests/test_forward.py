"""Plain HTTP through the endpoint's protocols (endpoint/connection/client.py,
endpoint/link/uplink.py), against the lab's real squid and its broken proxies (tarpit,
garbage, closed), with a real aiohttp site behind: what HTTP allows a client to expect
of a proxy, kept.

The endpoint here has a pool of chosen upstreams and a login of one token, as in
``ppf bench serve``: the gateway's part (its feed, its logins) is tested in
tests/test_endpoint.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from endpoint.connection.client import serve
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.router import Router
from ops.lab.testbed import ProxyLab
from ops.nats.server import free_port

TOKEN = "t0ken"
AUTH = b"Proxy-Authorization: Basic " + base64.b64encode(f"shop:{TOKEN}".encode()) + b"\r\n"
BIG = bytes(range(256)) * 4096  # 1 MiB


@contextlib.asynccontextmanager
async def _site() -> AsyncIterator[str]:
    """A site: /echo answers the body it got, /big streams 1 MiB chunked, /status/N."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), headers={"X-Method": request.method})

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # no length: chunked
        await response.prepare(request)
        for i in range(0, len(BIG), 65_536):
            await response.write(BIG[i : i + 65_536])
        await response.write_eof()
        return response

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["n"]), text="as asked")

    async def closes(request: web.Request) -> web.Response:
        answer = web.Response(text="and closed")  # as an HTTP/1.0 server, or Connection: close
        answer.force_close()
        return answer

    app = web.Application(client_max_size=32 * 1024 * 1024)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/big", big)
    app.router.add_get("/status/{n}", status)
    app.router.add_get("/closes", closes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _endpoint(
    lab: ProxyLab, *names: str, proto: str = "http", **options: float
) -> AsyncIterator[Router]:
    """An endpoint on a free port (``endpoint.port``) whose pool is the lab's ``names``,
    each spoken to as ``proto``."""
    pool = Pool()
    pool.replace(
        Upstream("127.0.0.1", p.port, proto, latency_ms=5) for p in lab.proxies if p.name in names
    )

    async def login_ok(name: str, token: str) -> bool:
        return token == TOKEN

    relay = Router(pool, login_ok, lab=True, **options)  # type: ignore[arg-type]
    port = free_port()
    server = await serve(relay, "127.0.0.1", port)
    relay.port = port  # type: ignore[attr-defined]
    try:
        yield relay
    finally:
        server.close()
        await server.wait_closed()
        relay.close()


async def _raw(port: int, data: bytes, answers: int) -> list[bytes]:
    """``data`` written at once on one connection; ``answers`` answers read back whole
    (by their Content-Length), then the connection closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = []
    try:
        writer.write(data)
        async with asyncio.timeout(15):
            for _ in range(answers):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                got.append(head + await reader.readexactly(length))
    finally:
        writer.close()
    return got


def _get(site: str, path: str, extra: bytes = b"") -> bytes:
    return b"GET http://%s%s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n" % (
        site.encode(),
        path.encode(),
        site.encode(),
        AUTH,
        extra,
    )


async def test_pipelined_requests_on_one_connection_answered_in_order(lab: ProxyLab) -> None:
    """Three requests in one write, a 404 among them, a POST with a body last: three
    answers in their order on the one connection, each the site's own."""
    async with _site() as site, _endpoint(lab, "squid") as relay:
        post = b"POST http://%s/echo HTTP/1.1\r\nHost: %s\r\n%sContent-Length: 5\r\n\r\nhello" % (
            site.encode(),
            site.encode(),
            AUTH,
        )
        answers = await _raw(
            relay.port,  # type: ignore[attr-defined]
            _get(site, "/status/200") + _get(site, "/status/404") + post,
            3,
        )
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"404", b"200"]
    assert answers[2].endswith(b"\r\n\r\nhello") and b"X-Method: POST" in answers[2]
    assert relay.outcomes.counts["forwarded"] == 3


async def test_a_chunked_megabyte_and_a_head_arrive_as_sent(lab: ProxyLab) -> None:
    """aiohttp through the endpoint: a 1 MiB chunked answer byte for byte, a 4 MiB
    upload echoed, a HEAD with no body, and the same client connection used again."""
    async with _site() as site, _endpoint(lab, "squid") as relay:
        proxy = f"http://shop:{TOKEN}@127.0.0.1:{relay.port}"  # type: ignore[attr-defined]
        connector = aiohttp.TCPConnector(limit=1)  # one connection: each request reuses it
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.get(f"http://{site}/big", proxy=proxy) as r:
                assert r.status == 200 and await r.read() == BIG
            upload = BIG * 4
            async with http.put(f"http://{site}/echo", data=io.BytesIO(upload), proxy=proxy) as r:
                assert r.status == 200 and await r.read() == upload
            async with http.head(f"http://{site}/echo", proxy=proxy) as r:
                assert r.status == 200 and r.headers["X-Method"] == "HEAD"
            async with http.get(f"http://{site}/status/201", proxy=proxy) as r:
                assert r.status == 201 and await r.text() == "as asked"
    assert relay.outcomes.counts["forwarded"] == 4


async def test_a_chunked_upload_and_an_http10_client_are_carried(lab: ProxyLab) -> None:
    """A body sent chunked reaches the site whole (sent on with its length); an HTTP/1.0
    client gets a chunked answer as plain bytes ending with the connection; an Upgrade
    request is refused, not half carried."""
    async with _site() as site, _endpoint(lab, "squid") as relay:
        port = relay.port  # type: ignore[attr-defined]
        chunked = (
            b"POST http://%s/echo HTTP/1.1\r\nHost: %s\r\n%sTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n" % (site.encode(), site.encode(), AUTH)
        )
        (answer,) = await _raw(port, chunked, 1)
        assert answer.split(b" ", 2)[1] == b"200" and answer.endswith(b"\r\n\r\nhello world")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get(site, "/big").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        async with asyncio.timeout(15):
            whole = await reader.read(-1)  # to the end: the connection's
        writer.close()
        head, _, body = whole.partition(b"\r\n\r\n")
        assert b" 200 " in head and b"chunked" not in head.lower() and body == BIG
        upgrade = _get(site, "/echo", b"Connection: Upgrade\r\nUpgrade: websocket\r\n")
        (answer,) = await _raw(port, upgrade, 1)
        assert answer.split(b" ", 2)[1] == b"400"


async def test_what_the_endpoint_refuses_and_why(lab: ProxyLab) -> None:
    """No login, a wrong token: 407 with the challenge; a relative URI or an https:// one:
    400; a head past 64 KiB: 431; a body past the limit: 413. Nothing reaches the site."""
    async with _site() as site, _endpoint(lab, "squid") as relay:
        port = relay.port  # type: ignore[attr-defined]
        bare = b"GET http://%s/echo HTTP/1.1\r\nHost: x\r\n\r\n" % site.encode()
        wrong = bare.replace(b"\r\n\r\n", b"\r\nProxy-Authorization: Basic eDp5\r\n\r\n")
        for request, status in (
            (bare, b"407"),
            (wrong, b"407"),
            (b"GET /echo HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n", b"400"),
            (b"GET https://x/ HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n", b"400"),
            (_get(site, "/echo", b"X-Long: " + b"a" * 70_000 + b"\r\n"), b"431"),
            (  # refused on its length, before its body comes
                b"POST http://%s/echo HTTP/1.1\r\n%sContent-Length: %d\r\n\r\nxx"
                % (site.encode(), AUTH, 17 * 1024 * 1024),
                b"413",
            ),
        ):
            (answer,) = await _raw(port, request, 1)
            assert answer.split(b" ", 2)[1] == status, (request[:60], answer[:200])
            assert b"Connection: close" in answer
            if status == b"407":
                assert b'Proxy-Authenticate: Basic realm="ppf: ' in answer
    assert "forwarded" not in relay.outcomes.counts
    assert relay.outcomes.counts["client_error"] == 4  # 400, 400, 431, 413
    assert relay.outcomes.counts["login_refused"] == 2


@pytest.mark.parametrize("broken", ["tarpit", "garbage", "closed"])
async def test_a_proxy_that_fails_a_request_costs_the_client_nothing(
    lab: ProxyLab, broken: str
) -> None:
    """A pool of squid and one broken proxy (silent, answering garbage, refusing), picked
    in turn: every GET is answered through squid, the broken one blamed once and avoided;
    a POST sent to it alone is answered 502, never sent twice."""
    async with _site() as site, _endpoint(lab, "squid", broken, answer_s=1.0) as relay:
        port = relay.port  # type: ignore[attr-defined]
        login = f"shop-strategy-roundrobin:{TOKEN}"
        auth = b"Proxy-Authorization: Basic " + base64.b64encode(login.encode()) + b"\r\n"
        for _ in range(4):
            request = _get(site, "/status/200").replace(AUTH, auth)
            (answer,) = await _raw(port, request, 1)
            assert answer.split(b" ", 2)[1] == b"200", answer[:200]
        assert relay.outcomes.counts["upstream_failed"] == 1
        squid = next(p.port for p in lab.proxies if p.name == "squid")
        bad = next(u for u in relay.pool.upstreams.values() if u.port != squid)
        assert bad.avoid_until > 0
    async with _site() as site, _endpoint(lab, broken, answer_s=1.0) as relay:
        post = b"POST http://%s/echo HTTP/1.1\r\n%sContent-Length: 2\r\n\r\nhi" % (
            site.encode(),
            AUTH,
        )
        (answer,) = await _raw(relay.port, post, 1)  # type: ignore[attr-defined]
        assert answer.split(b" ", 2)[1] in (b"502", b"503"), answer[:200]
        assert relay.outcomes.counts["upstream_failed"] == 1


@contextlib.asynccontextmanager
async def _keeping_site() -> AsyncIterator[str]:
    """A site that keeps each connection open whatever its requests' ``Connection`` say,
    as some servers do: /moved is a redirect with an empty body, anything else is
    answered with the site's own address."""
    port = free_port()
    me = f"127.0.0.1:{port}".encode()
    kept: set[asyncio.StreamWriter] = set()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kept.add(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                if b"/moved " in head.split(b"\r\n", 1)[0]:  # origin or absolute form
                    writer.write(b"HTTP/1.1 302 Found\r\nLocation: /\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(me), me))
        writer.close()

    try:
        async with await asyncio.start_server(answer, "127.0.0.1", port):
            yield me.decode()
    finally:
        for writer in kept:  # what a proxy still holds open
            writer.close()


async def test_a_kept_upstream_link_never_carries_a_request_to_another_site(
    lab: ProxyLab,
) -> None:
    """tinyproxy reads an answer with an empty body as one without a length, and relays
    its connection to that answer's server until the server closes it: through it, a
    redirect from one site that keeps connections open, then a page of another, in turn,
    pipelined on one client connection and then on fresh ones: each page is the site's
    it names, never the first site's (which would get the client's headers for it)."""
    async with (
        _keeping_site() as one,
        _keeping_site() as two,
        _endpoint(lab, "tinyproxy-elite") as relay,
    ):
        port = relay.port  # type: ignore[attr-defined]
        asked = [(one, "/moved"), (two, "/"), (one, "/moved"), (two, "/")]
        answers = await _raw(port, b"".join(_get(site, path) for site, path in asked), 4)
        for site, path in asked:
            answers += await _raw(port, _get(site, path), 1)
        got = [a.split(b" ", 2)[1] + b" " + a.rsplit(b"\r\n\r\n", 1)[1] for a in answers]
        assert got == [b"302 ", b"200 " + two.encode()] * 4
        assert relay.outcomes.counts["forwarded"] == 8


async def test_a_client_gone_mid_answer_leaves_nothing_behind(lab: ProxyLab) -> None:
    """A client that reads a little of a megabyte and hangs up: the upstream link is
    closed (not kept idle) and the next client is answered."""
    async with _site() as site, _endpoint(lab, "squid") as relay:
        port = relay.port  # type: ignore[attr-defined]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get(site, "/big"))
        await reader.readexactly(1000)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(1.0)  # the site's answer has long ended by now
        assert not any(relay.idle.links.values())
        (answer,) = await _raw(port, _get(site, "/status/200"), 1)
        assert answer.split(b" ", 2)[1] == b"200"


async def test_a_site_that_closes_each_answer_gets_a_socks5_link_a_request(
    lab: ProxyLab,
) -> None:
    """Plain HTTP through real SOCKS5 upstreams (microsocks, dante) to a site that closes
    its connection after each answer: every request on one client connection is answered
    on a link of its own, none kept idle after; a site that speaks before it is asked is
    not taken for an answer: the client is told so at once (no proxy got an answer), not
    after a timeout, and the links that heard it are let go.

    The talker's connections are waited for to end before the test does: one the
    endpoint kept open would hang here, and one ended with the test's loop would leave
    its socket to a later test's teardown."""
    talks: list[asyncio.Task[None]] = []

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        talks.append(asyncio.current_task())  # type: ignore[arg-type]
        writer.write(b"220 not HTTP, and first\r\n")
        with contextlib.suppress(OSError):
            await reader.read()  # until the link is let go
        writer.close()

    talker = await asyncio.start_server(banner, "127.0.0.1", port := free_port())
    async with (
        _site() as site,
        _endpoint(lab, "microsocks", "dante", proto="socks5", answer_s=5.0) as relay,
        talker,
    ):
        answers = await _raw(relay.port, _get(site, "/closes") * 12, 12)  # type: ignore[attr-defined]
        assert [a.split(b" ", 2)[1] for a in answers] == [b"200"] * 12
        assert all(a.endswith(b"and closed") for a in answers)
        assert relay.outcomes.counts.get("upstream_failed", 0) == 0
        await asyncio.sleep(0.2)
        assert not any(relay.idle.links.values())
        started = asyncio.get_running_loop().time()
        (told,) = await _raw(relay.port, _get(f"127.0.0.1:{port}", "/"), 1)  # type: ignore[attr-defined]
        assert told.split(b" ", 2)[1] in (b"502", b"503"), told[:200]
        assert asyncio.get_running_loop().time() - started < 3.0
        assert talks  # a proxy reached the talker
        async with asyncio.timeout(10):
            await asyncio.gather(*talks)


async def test_a_socks4_upstream_carries_links_and_tunnels(lab: ProxyLab) -> None:
    """dante spoken to as SOCKS4 (python-socks' streams, taken over; SOCKS5 is socksio's
    handshake, endpoint/link/socks.py): plain HTTP to a site that closes after each
    answer, a link a request, and a CONNECT tunnel to the same site; a destination
    dante cannot reach is its refusal, the client told 502 or 503, not left waiting."""
    async with _site() as site, _endpoint(lab, "dante", proto="socks4", answer_s=5.0) as relay:
        port = relay.port  # type: ignore[attr-defined]
        answers = await _raw(port, _get(site, "/closes") * 4, 4)
        assert [a.split(b" ", 2)[1] for a in answers] == [b"200"] * 4
        assert all(a.endswith(b"and closed") for a in answers)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"CONNECT %s HTTP/1.1\r\n%s\r\n" % (site.encode(), AUTH))
            async with asyncio.timeout(10):
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                writer.write(
                    b"GET /status/201 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                    % site.encode()
                )
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 201")
                # The site closes, and its end comes back through dante and the endpoint:
                # the tunnel is over before the site and the endpoint stop.
                await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
        assert relay.outcomes.counts.get("upstream_failed", 0) == 0
        (refused,) = await _raw(port, _get(f"127.0.0.1:{free_port()}", "/"), 1)
        assert refused.split(b" ", 2)[1] in (b"502", b"503"), refused[:200]


async def test_bench_serve_counts_what_it_carried() -> None:
    """A small `ppf bench serve`, through an HTTP and a SOCKS5 upstream of its own (no
    package needed): every request answered through the endpoint, each run's rate its
    requests over its own time (a pair's ratio is its rates'), the endpoint's CPU a
    request from its process, and memory held by open tunnels."""
    from ops.bench.options import Serve
    from ops.bench.serve import bench_serve

    out = await bench_serve(Serve(requests=300, concurrency=5, runs=2, tunnels=50), 8)
    for kind in ("http", "socks5"):
        one = out[kind]
        assert one["answered"] == 600, kind
        pairs = zip(one["spread_direct"], one["spread_endpoint"], one["spread_ratio"], strict=True)
        assert all(abs(e / d - r) < 0.01 for d, e, r in pairs)
        assert all(r > 0 for r in one["spread_direct"] + one["spread_endpoint"])
        assert 0 < one["endpoint_cpu_us_per_request"] < 100_000
        assert set(one["added_latency_ms_median"]) == {"c1", "c2", "c3", "c4"}
    assert out["http"]["tunnel_kib"] > 0
