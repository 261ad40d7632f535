"""Fetching lists: bounded, conditional, through upstreams, and never into private networks."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agents.fetch import Fetcher
from agents.worker import Worker, WorkerConfig
from events.wire import SourcePayload
from ops.lab.testbed import ProxyLab

PAGE = b"8.8.8.8:3128\n1.1.1.1:1080\n"


async def _serve(host: str = "127.0.0.1", **pages: web.Response) -> TestServer:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/slow":
            await asyncio.sleep(5)
        if request.path == "/cached":
            if request.headers.get("If-None-Match") == '"v1"':
                return web.Response(status=304)
            return web.Response(body=PAGE, headers={"ETag": '"v1"'})
        if request.path == "/dated":
            stamp = "Sun, 29 Nov 2026 10:00:00 GMT"
            if request.headers.get("If-Modified-Since") == stamp:
                return web.Response(status=304)
            return web.Response(body=PAGE, headers={"Last-Modified": stamp})
        if request.path == "/loop":
            raise web.HTTPFound("/loop")
        if request.path.startswith("/to/"):
            raise web.HTTPFound(request.path[len("/to") :] if "//" not in request.path else "")
        if request.path == "/long":  # megabytes: many chunks on the wire
            return web.Response(body=PAGE * 150_000)
        return web.Response(body=b"x" * 5000 if request.path == "/big" else PAGE)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    server = TestServer(app, host=host)
    await server.start_server()
    return server


@pytest.fixture
async def site() -> AsyncIterator[TestServer]:
    server = await _serve()
    try:
        yield server
    finally:
        await server.close()


async def test_bounded_hashed_and_conditional(site: TestServer) -> None:
    """A fetch is size-bounded, hashed, and conditional when validators are known."""
    async with Fetcher(lab=True, timeout_s=1, max_bytes=4096) as f:
        page = await f.fetch(str(site.make_url("/list.txt")))
        assert page.ok and page.body == PAGE
        assert page.content_hash == hashlib.sha256(PAGE).hexdigest()
        big = await f.fetch(str(site.make_url("/big")))
        assert not big.ok and "larger than 4096" in big.error
    async with Fetcher(lab=True, timeout_s=10) as f:
        long = await f.fetch(str(site.make_url("/long")))
        assert long.ok and long.body == PAGE * 150_000  # read to its end, not one chunk
    async with Fetcher(lab=True, timeout_s=1, max_bytes=4096) as f:
        slow = await f.fetch(str(site.make_url("/slow")))
        assert not slow.ok and "Timeout" in slow.error and slow.fetch_ms < 3000
        first = await f.fetch(str(site.make_url("/cached")))
        again = await f.fetch(str(site.make_url("/cached")), etag=first.etag)
        assert first.etag == '"v1"' and again.ok and again.not_modified and again.status == 304
        dated = await f.fetch(str(site.make_url("/dated")))
        since = await f.fetch(str(site.make_url("/dated")), last_modified=dated.last_modified)
        assert since.not_modified


async def test_private_addresses_are_refused_without_the_lab_flag(site: TestServer) -> None:
    """URLs resolving to private addresses are refused unless lab mode allows them."""
    port = site.port
    async with Fetcher(timeout_s=2) as f:
        for url in (
            f"http://127.0.0.1:{port}/list.txt",
            "http://10.1.2.3/list.txt",
            "http://[::1]/list.txt",
            f"http://localhost:{port}/list.txt",  # a name: refused when it is resolved
        ):
            result = await f.fetch(url)
            assert not result.ok and "refused" in result.error, (url, result.error)
        assert "not an http(s) URL" in (await f.fetch("ftp://8.8.8.8/x")).error
    # An upstream resolves names for us, but an address written in the URL is ours to refuse.
    # And names that cannot be public are refused by their form: the upstream would
    # resolve them on its own network. None of these reaches the upstream.
    async with Fetcher(upstream=f"socks5://127.0.0.1:{port}", timeout_s=2) as f:
        for url in (
            "http://192.168.1.1/list.txt",
            "http://localhost/list.txt",
            "http://LOCALHOST./list.txt",
            "http://intranet/list.txt",
            "http://printer.local/list.txt",
            "http://metadata.google.internal/list.txt",
            "http://nas.lan/list.txt",
            "http://a.localhost/list.txt",
            "http://2130706433/list.txt",  # 127.0.0.1 in decimal
            "http://0x7f000001/list.txt",  # in hex
            "http://0177.0.0.1/list.txt",  # in octal
            "http://127.1/list.txt",  # short form
            "http://10.1/list.txt",
            "http://[::ffff:169.254.169.254]/list.txt",
        ):
            result = await f.fetch(url)
            assert not result.ok and "refused" in result.error, (url, result.error)
            assert not result.upstream_down, url
        # Public names, onion services included, are the upstream's to resolve.
        for url in ("http://lists.example.net/x.txt", "http://expyuzz4wqqyqhjn.onion/x.txt"):
            assert f._guard(url) is None, url


async def test_every_redirect_hop_is_guarded(site: TestServer) -> None:
    """A public page may not redirect the fleet into a private network: each hop is
    checked. Here 127.0.0.1 stands for the public page (admitted) and 127.0.0.2 for
    the private network behind it."""
    inside = await _serve("127.0.0.2")
    try:
        async with Fetcher(timeout_s=2, admitted=frozenset({"127.0.0.1"})) as f:
            followed = await f.fetch(str(site.make_url("/to/list.txt")))
            assert followed.ok and followed.body == PAGE
            looped = await f.fetch(str(site.make_url("/loop")))
            assert not looped.ok and "redirects" in looped.error
            app = web.Application()
            target = str(inside.make_url("/list.txt"))

            async def redirect(_: web.Request) -> web.Response:
                raise web.HTTPFound(target)

            app.router.add_get("/", redirect)
            hop = TestServer(app, host="127.0.0.1")
            await hop.start_server()
            try:
                refused = await f.fetch(str(hop.make_url("/")))
            finally:
                await hop.close()
            assert not refused.ok and "refused: 127.0.0.2" in refused.error
    finally:
        await inside.close()


async def test_through_upstreams(lab: ProxyLab, site: TestServer) -> None:
    """Tor is a SOCKS5 upstream; any HTTP or SOCKS proxy serves the same way."""
    by_name = {p.name: p for p in lab.proxies}
    for name, scheme in (("microsocks", "socks5"), ("dante", "socks4"), ("squid", "http")):
        upstream = f"{scheme}://127.0.0.1:{by_name[name].port}"
        async with Fetcher(upstream=upstream, lab=True, timeout_s=5) as f:
            result = await f.fetch(str(site.make_url("/list.txt")))
        assert result.ok and result.body == PAGE, (name, result.error)


async def test_worker_asks_conditionally_only_for_the_copy_the_log_saw(
    site: TestServer, tmp_path: Path
) -> None:
    """Validators are sent only for the copy whose hash the log last saw."""
    worker = Worker("http://127.0.0.1:1", "t", "w1", "", tmp_path, WorkerConfig(lab=True))
    url = str(site.make_url("/cached"))
    async with Fetcher(lab=True, timeout_s=2) as f:
        first = await worker._fetch(f, SourcePayload(url=url, last_hash=""))
        assert first.ok and not first.not_modified
        # The log's last copy is another one (another worker fetched since): ask plainly.
        other = await worker._fetch(f, SourcePayload(url=url, last_hash="0" * 64))
        assert not other.not_modified and other.body == PAGE
        same = await worker._fetch(f, SourcePayload(url=url, last_hash=first.content_hash))
        assert same.not_modified and same.content_hash == first.content_hash
    assert worker.not_modified == 1
