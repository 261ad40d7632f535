"""The rotating endpoint (``ppf serve``) through the real proxy lab on loopback: curl,
Python ``requests`` (PySocks for SOCKS) and a raw SOCKS5 client, unchanged but for the
proxy address; every answer through an upstream proxy, never a direct connection."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import events as ev
from endpoint.connection.client import serve
from endpoint.feed import Feed
from endpoint.link.upstream import Upstream
from endpoint.router.choose import AVOID_S, Pool
from endpoint.router.login import LoginError, parse_login
from endpoint.router.outcomes import Outcomes
from endpoint.router.router import Router
from eventlog.client import Log
from events.batches import group
from events.mint import fresh_id, now_ms
from gateway.http import GatewayConfig
from ops.cli.admin import enroll
from ops.cli.workers import start_workers
from ops.lab.testbed import ProxyLab
from ops.nats.server import free_port
from tests.fleet import serving
from tests.helpers import until

# The lab's proxies that carry traffic, as the pool holds them after a check.
CARRIERS = {"squid": ("http", "yes"), "microsocks": ("socks5", ""), "dante": ("socks5", "")}


def test_the_login_grammar_reads_options_after_the_name() -> None:
    """Options start at the first keyword (names may hold "-"); a bad value, an unknown
    option after one, or a name no agent can have is refused with its reason."""
    want = parse_login("my-shop-country-de,nl-proto-socks5-anon-elite-https-maxlat-800")
    assert (want.consumer, want.country, want.proto, want.anonymity) == (
        "my-shop",
        ("DE", "NL"),
        "socks5",
        "elite",
    )
    assert want.https and want.max_latency_ms == 800 and not want.mitm
    sticky = parse_login("shop-session-a1b2-sessmin-30-strategy-lru-mitm")
    assert (sticky.session, sticky.session_min, sticky.strategy, sticky.mitm) == (
        "a1b2",
        30,
        "lru",
        True,
    )
    for bad in (
        "shop-country-deu",
        "shop-proto-ftp",
        "shop-maxlat",
        "bad name",
        "shop-proto-http-bogus-1",
    ):
        with pytest.raises(LoginError):
            parse_login(bad)


@contextlib.asynccontextmanager
async def _target() -> AsyncIterator[tuple[str, list[str]]]:
    """A web site on loopback that says who reached it (the address it saw)."""
    seen: list[str] = []

    async def page(request: web.Request) -> web.Response:
        seen.append(request.remote or "")
        status = int(request.query.get("status", "200"))
        return web.Response(text=f"hello {request.remote}", status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _endpoint(
    lg: Log, lab: ProxyLab, *, extra: int = 0, named: str = "", **endpoint: Any
) -> AsyncIterator[tuple[str, str, Router, Feed]]:
    """A lab-mode gateway whose pool is the lab's carriers (confirmed by the operator's
    checker; ``extra``: a port on loopback also in it, as a very fast SOCKS5 proxy), a
    consumer's token, and the endpoint fed by that gateway: (address, token, endpoint,
    feed). ``named``: the endpoint's own name, enrolled and trusted, under which what its
    traffic shows of sites goes to the log every 0.3 s."""
    own = ("c-own", named) if named else ("c-own",)
    settings = ev.Settings(
        lab=True, agent_subjects=True, trust=True, trusted_agents=own, guarded=True
    )
    await lg.publish(ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=settings))
    await enroll(lg, "c-own", "checker")
    token = await enroll(lg, "shop", "consumer")
    identity = (named, await enroll(lg, named, "endpoint")) if named else None

    def confirmed(port: int, proto: str, latency_ms: int = 5, **facts: Any) -> ev.ProxyWorked:
        return ev.ProxyWorked(
            id=fresh_id(),
            agent="c-own",
            at=now_ms(),
            ip="127.0.0.1",
            port=port,
            proto=proto,
            latency_ms=latency_ms,
            **facts,
        )

    events = [
        confirmed(
            p.port,
            CARRIERS[p.name][0],
            exit_ip=p.exit_ip,
            anonymity=p.anonymity,
            https=CARRIERS[p.name][1],
        )
        for p in lab.proxies
        if p.name in CARRIERS
    ]
    if extra:
        events.append(confirmed(extra, "socks5", latency_ms=1))
    for event in group(events):
        await lg.publish_raw(ev.agent_subject(event), ev.encode(event), msg_id=event.id)
    outcomes = Outcomes()  # the gateway's /metrics reports the endpoint's, as in ppf up
    async with serving(lg, GatewayConfig(endpoint_outcomes=outcomes)) as (client, fold):
        assert await fold.wait_for(await lg.head_seq(), 10)
        gateway = str(client.make_url("")).rstrip("/")
        pool = Pool()
        feed = Feed([gateway], pool, every_s=0.5, identity=identity, sites_every_s=0.3)
        await feed.start()
        relay = Router(
            pool, feed.logins.ok, record=feed.record, outcomes=outcomes, lab=True, **endpoint
        )
        port = free_port()
        server = await serve(relay, "127.0.0.1", port)
        try:
            want = len(CARRIERS) + bool(extra)  # the view follows the fold within ~1 s
            assert await until(lambda: len(pool.upstreams) == want, 3), pool.upstreams
            yield f"127.0.0.1:{port}", token, relay, feed
        finally:
            server.close()
            await server.wait_closed()
            relay.close()
            await feed.stop()


async def _curl(*argv: str) -> tuple[int, str]:
    quiet = ("-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "15")
    proc = await asyncio.create_subprocess_exec(
        "curl", *quiet, *argv, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    body, _, code = out.decode().rpartition("\n")
    return int(code or 0), body


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="apt-get install curl")


@needs_curl
async def test_curl_through_the_endpoint_over_http_connect_and_socks(
    lab: ProxyLab, log_client: Log
) -> None:
    """`curl -x http://NAME:TOKEN@endpoint` (plain and CONNECT) and `curl --socks5-hostname`:
    each request answered, and the site saw a lab proxy's exit address, never ours; a
    target's own 404 is the proxy working."""
    exits = {p.exit_ip for p in lab.proxies if p.name in CARRIERS}
    async with _target() as (site, seen), _endpoint(log_client, lab) as (addr, token, relay, _):
        for _ in range(6):
            code, body = await _curl("-x", f"http://shop:{token}@{addr}", f"http://{site}/a")
            assert code == 200 and body.startswith("hello"), (code, body)
            code, _ = await _curl(
                "-p", "-x", f"http://shop:{token}@{addr}", f"http://{site}/b"
            )  # CONNECT (-p: tunnel through the proxy)
            assert code == 200
            code, _ = await _curl("--socks5-hostname", f"shop:{token}@{addr}", f"http://{site}/c")
            assert code == 200
        code, _ = await _curl("-x", f"http://shop:{token}@{addr}", f"http://{site}/x?status=404")
        assert code == 404
        assert len(seen) == 19 and set(seen) <= exits, (set(seen), exits)
        assert relay.outcomes.counts.get("upstream_failed", 0) == 0


@needs_curl
async def test_no_login_no_match_no_direct_connection(lab: ProxyLab, log_client: Log) -> None:
    """Without a login: 407 with Proxy-Authenticate; a wrong token: 407; a filter nothing
    matches: 503 (SOCKS: a failure), and the site never sees a direct connection."""
    async with _target() as (site, seen), _endpoint(log_client, lab) as (addr, token, _, _):
        argv = ["curl", "-s", "-i", "-x", f"http://{addr}", f"http://{site}/"]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        head, _ = await proc.communicate()
        assert b" 407 " in head and b"Proxy-Authenticate: Basic" in head
        assert (await _curl("-x", f"http://shop:wrong@{addr}", f"http://{site}/"))[0] == 407
        code, _ = await _curl("-x", f"http://shop-country-zz:{token}@{addr}", f"http://{site}/")
        assert code == 503
        code, _ = await _curl(
            "--socks5-hostname", f"shop-country-zz:{token}@{addr}", f"http://{site}/"
        )
        assert code == 0  # the SOCKS failure: curl gets no HTTP answer at all
        assert seen == []


async def test_python_requests_over_http_and_socks(lab: ProxyLab, log_client: Log) -> None:
    """Python ``requests`` with ``proxies=`` as scrapers write it: http:// and socks5h://."""
    requests = pytest.importorskip("requests")
    pytest.importorskip("socks", reason="PySocks: pip install PySocks (make test does)")
    async with _target() as (site, seen), _endpoint(log_client, lab) as (addr, token, _, _):
        for scheme in ("http", "socks5h"):
            proxies = {"http": f"{scheme}://shop:{token}@{addr}"}
            r = await asyncio.to_thread(
                requests.get, f"http://{site}/r", proxies=proxies, timeout=15
            )
            assert r.status_code == 200 and r.text.startswith("hello"), scheme
    assert len(seen) == 2


@needs_curl
async def test_a_dead_upstream_is_avoided_at_once_and_reported(
    lab: ProxyLab, log_client: Log
) -> None:
    """An upstream that refuses connections (the lab's closed port, in the pool as a fast
    SOCKS5 proxy): the request that met it goes through another (no failed answer), the
    endpoint avoids it from then on, and the consumer's report reaches the log, where the
    proxy is first in the checkers' queue."""
    closed = next(p for p in lab.proxies if p.name == "closed")
    async with (
        _target() as (site, _),
        _endpoint(log_client, lab, extra=closed.port) as (
            addr,
            token,
            relay,
            feed,
        ),
    ):
        dead = relay.pool.upstreams[("127.0.0.1", closed.port)]
        login = f"shop-strategy-lru:{token}@{addr}"  # each upstream in turn: the dead one too
        for _ in range(5):
            code, _ = await _curl("--socks5-hostname", login, f"http://{site}/")
            assert code == 200
        assert relay.outcomes.counts.get("upstream_failed") == 1
        assert dead.avoid_until > 0
        for _ in range(50):
            if feed.reports:
                break
            await asyncio.sleep(0.1)
        assert feed.reports == 1  # its traffic's round reached the log: 1 failure in it
        async with aiohttp.ClientSession() as http, http.get(f"{feed.gateways[0]}/v1/agents") as r:
            rows = {a["name"]: a for a in (await r.json())["agents"]}
        counts = rows["shop"]["counts"]
        assert counts["Traffic.failed"] == 1 and counts["Traffic.worked"] >= 5, counts


def test_the_pool_picks_by_strategy_and_avoids_what_failed() -> None:
    """Round robin goes in turn; a session keeps its upstream while it works; a tunnel
    goes only through proxies that tunnel; a failure sits a proxy out 10 s, then 20 s in
    a row, never over 300 s however many in a row (a float overflowed at 1,025 strikes);
    when all are out, the soonest back is tried; mitm only when asked."""
    pool = Pool(rng=random.Random(1))
    pool.replace(
        [
            Upstream("9.9.9.1", 80, "http", https="yes", latency_ms=50),
            Upstream("9.9.9.2", 80, "http", latency_ms=50),
            Upstream("9.9.9.3", 1080, "socks5", latency_ms=50),
            Upstream("9.9.9.4", 80, "http", mitm=True, latency_ms=1),
        ]
    )
    rr = parse_login("shop-strategy-roundrobin")
    turns = [pool.pick(rr, tunnel=False, now=0).ip for _ in range(6)]  # type: ignore[union-attr]
    assert turns == ["9.9.9.1", "9.9.9.2", "9.9.9.3"] * 2
    tunnels = {pool.pick(rr, tunnel=True, now=0).ip for _ in range(6)}  # type: ignore[union-attr]
    assert tunnels == {"9.9.9.1", "9.9.9.3"}
    assert "9.9.9.4" in {
        pool.pick(parse_login("shop-mitm"), tunnel=False, now=0).ip for _ in range(40)
    }  # type: ignore[union-attr]
    sticky = parse_login("shop-session-s1")
    first = pool.pick(sticky, tunnel=False, now=0)
    assert first is not None
    assert all(pool.pick(sticky, tunnel=False, now=t) is first for t in range(1, 100))
    pool.failed(first, now=100)
    assert first.avoid_until == 110 and pool.pick(sticky, tunnel=False, now=101) is not first
    pool.failed(first, now=111)
    assert first.avoid_until == 131  # twice as long, in a row
    only = parse_login("shop-proto-socks5")
    socks = pool.pick(only, tunnel=True, now=0)
    assert socks is not None
    pool.failed(socks, now=0)
    assert pool.pick(only, tunnel=True, now=1) is socks  # all out: the soonest back
    for _ in range(2_000):  # the only one, failing on and on
        pool.failed(socks, now=1_000)
    assert socks.strikes == 2_001 and socks.avoid_until == 1_000 + AVOID_S
    assert pool.pick(parse_login("shop-country-de"), tunnel=False, now=0) is None


BUSY = 60_000


# A rate: the fold works off BUSY messages in ENROLMENT_WAIT_S (2 s) with a core its own.
@pytest.mark.serial
async def test_a_token_works_the_moment_ppf_token_issue_prints_it(
    lab: ProxyLab, log_client: Log, nats_server: Any
) -> None:
    """`ppf token issue` (the command, in its own process) while the gateway's fold has
    ``BUSY`` messages in hand, and the consumer's first request through the endpoint less
    than 50 ms after the token is printed: answered by the site, each of three times,
    never a 407."""
    import sys
    import time

    async with (
        _target() as (site, seen),
        _endpoint(log_client, lab) as (addr, _, _, _),
        aiohttp.ClientSession() as http,
    ):
        for n in range(3):
            name = f"fresh{n}"
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ops.cli", "token", "issue", name, "--role", "consumer",
                "--nats", nats_server.url, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            # The fold has work in hand as the token is issued (a busy fleet's gateway):
            # messages published while the command starts, its enrolment among them.
            beat = ev.Heartbeat(id=fresh_id(), agent="c-own", at=now_ms())
            subject, payload = ev.subject_for(beat), ev.encode(beat)
            for _ in range(BUSY):
                await log_client.nc.publish(subject, payload)
            assert proc.stdout is not None
            token = (await proc.stdout.readline()).decode().strip()
            printed = time.monotonic()
            proxy = f"http://{name}:{token}@{addr}"
            request = http.get(f"http://{site}/{name}", proxy=proxy)
            assert time.monotonic() - printed < 0.05  # what the test is about
            async with request as r:
                assert r.status == 200, (name, r.status)
            assert await proc.wait() == 0
        assert len(seen) == 3


@needs_curl
async def test_what_the_traffic_shows_of_a_site_reaches_the_log_under_the_endpoints_name(
    lab: ProxyLab, log_client: Log
) -> None:
    """A site that turns away squid's exit: the consumer gets its page every time, and
    the endpoint's rounds of site verdicts (under its own name, never the consumer's)
    make the gateway serve, for that site, the proxies that got through and not squid."""
    from tests.test_site_routing import _site

    squid = next(p for p in lab.proxies if p.name == "squid")
    async with (
        _site("127.0.0.13", refused=squid.exit_ip) as site,
        _endpoint(log_client, lab, named="edge") as (addr, token, _, feed),
    ):
        codes = []
        for _ in range(12):
            code, _ = await _curl(
                "-x", f"http://shop-strategy-roundrobin:{token}@{addr}", f"http://{site}/"
            )
            codes.append(code)
        await feed.flush_sites()
        assert feed.sites_sent >= 2 and feed.sites_dropped == 0
        url = f"{feed.gateways[0]}/v1/proxies?works_on=127.0.0.13&limit=0"
        served: set[int] = set()
        async with aiohttp.ClientSession() as http:
            for _ in range(50):
                async with http.get(url) as r:
                    served = {p["port"] for p in (await r.json())["proxies"]}
                if served:
                    break
                await asyncio.sleep(0.1)
            async with http.get(f"{feed.gateways[0]}/v1/agents") as r:
                rows = {a["name"]: a["counts"] for a in (await r.json())["agents"]}
    assert rows["edge"].get("SitesChecked", 0) >= 1, rows["edge"]
    assert "SitesChecked" not in rows["shop"]  # the consumer's name is in no site verdict
    assert codes[1:] == [200] * 11  # the first may meet squid before anything is known
    assert served and squid.port not in served
    assert served <= {p.port for p in lab.proxies if p.name in ("microsocks", "dante")}


@needs_curl
async def test_a_tls_site_that_closes_on_listed_exits_is_reached_through_another(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """A TLS site that drops connections from squid's exit before its first byte: every
    HTTPS request through the endpoint gets the page (the ClientHello goes again through
    another proxy, the client none the wiser); squid is turned away for that site and
    counted as no failure."""
    import ssl

    from gateway.judge import self_signed

    squid = next(p for p in lab.proxies if p.name == "squid")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*self_signed(tmp_path, "site"))

    async def visitor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer.get_extra_info("peername")[0] == squid.exit_ip:
            writer.close()  # a listed network: not a byte back
            return
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.start_tls(ctx)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nthe page"
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(visitor, "127.0.0.14", 8443)
    try:
        async with _endpoint(log_client, lab) as (addr, token, relay, _):
            login = f"http://shop-strategy-roundrobin:{token}@{addr}"
            got = [await _curl("-k", "-x", login, "https://127.0.0.14:8443/") for _ in range(6)]
            up = relay.pool.upstreams[("127.0.0.1", squid.port)]
            assert "127.0.0.14" in up.turned_away and up.strikes == 0
            assert relay.outcomes.counts.get("turned_away", 0) >= 1
    finally:
        server.close()
        await server.wait_closed()
    assert got == [(200, "the page")] * 6


async def test_a_hanging_upstream_costs_a_request_its_hedge_delay_not_the_timeout(
    lab: ProxyLab, log_client: Log
) -> None:
    """An upstream that accepts and never answers (the lab's tarpit, in the pool as a 1 ms
    SOCKS5 proxy): a request that picks it starts a second upstream beside it after
    0.25 s and is answered through that one, well within the connect timeout (20 s: past
    it the tarpit is blamed and avoided), over SOCKS5 and over plain HTTP alike; the
    hedges are counted and each request is sent once."""
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    async with (
        _target() as (site, seen),
        _endpoint(log_client, lab, extra=tarpit.port, connect_s=20.0) as (addr, token, relay, _),
    ):
        # Each upstream in turn, the tarpit too. Not lru: once a plain-HTTP page got
        # through, lru (as weighted) picks among the upstreams that got through to the site
        # (endpoint/router/choose.py), and the tarpit came up again only when it was the least
        # recently used at that first request: one run in a few it was not.
        login = f"shop-strategy-roundrobin:{token}@{addr}"
        counts, sent = relay.outcomes.counts, 0
        for how in ("--socks5-hostname", "-x"):
            hedged = counts.get("hedge_started", 0)
            for _ in range(2 * len(relay.pool.upstreams)):  # within two turns of the pool
                started = time.monotonic()
                via = login if how != "-x" else f"http://{login}"
                code, _ = await _curl(how, via, f"http://{site}/")
                sent += 1
                assert code == 200 and time.monotonic() - started < 2.5
                if counts.get("hedge_started", 0) > hedged:
                    break
            assert counts.get("hedge_started", 0) == hedged + 1, (how, counts)
        assert counts.get("hedge_won", 0) >= 2, counts
        assert len(seen) == sent  # every request reached the site once


@needs_curl
async def test_workers_share_one_port_and_one_feed(lab: ProxyLab, log_client: Log) -> None:
    """`ppf serve --workers 2`'s workers (each its own process) on one port: 40 new
    connections, over SOCKS5 and plain HTTP, all answered through the pool; the gateway
    is asked for the pool (once a refresh period) and the login once for both workers,
    not once each, and a caller without the workers' secret is refused."""
    async with _target() as (site, seen), _endpoint(log_client, lab) as (_, token, _, feed):
        args = argparse.Namespace(
            serve_refresh=0.5, serve_max_conns=64, serve_hedges=64, lab=True, serve_workers=2
        )
        listen = f"127.0.0.1:{free_port()}"
        async with contextlib.AsyncExitStack() as stack:
            began = time.monotonic()
            shared = await start_workers(stack, listen, feed.gateways, args, None)
            assert shared is not None
            for i in range(40):
                how, via = ("-x", f"http://shop:{token}@{listen}") if i % 2 else (
                    "--socks5-hostname", f"shop:{token}@{listen}")  # fmt: skip
                code, _ = await _curl(how, via, f"http://{site}/")
                assert code == 200
            await asyncio.sleep(2)  # each worker asks for the pool every 0.5 s meanwhile
            # The login asked of the gateway once; the other worker had it kept: both served.
            assert shared.asked["/v1/agents/me"] == 1, shared.asked
            assert shared.kept_answers["/v1/agents/me"] >= 1, shared.kept_answers
            periods = (time.monotonic() - began) / args.serve_refresh
            assert shared.asked["/v1/proxies"] <= periods + 1, (shared.asked, periods)  # one feed
            assert shared.kept_answers["/v1/proxies"] >= 1, shared.kept_answers
            async with aiohttp.ClientSession() as http, http.get(shared.url + "/v1/proxies") as r:
                assert r.status == 403
        assert len(seen) == 40
