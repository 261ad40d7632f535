"""A live ``ppf up --lab`` as a newcomer runs it: its local agents find the lab's proxies
in a list, a consumer's traffic goes through its endpoint, and then the dashboard (in
Chromium) and ``ppf mcp`` (driven by the MCP SDK's own client) are read against it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestServer

from events.catalogue import Heartbeat
from events.mint import fresh_id, now_ms
from ops.lab.testbed import ProxyLab
from tests.browser import Browser, chromium_path
from tests.test_cli import Up

ARTICLE = (
    "<html><head><title>Proxy pools</title></head><body><nav>home | about | login</nav>"
    "<article><h1>Why free proxy lists die</h1>"
    + "".join(
        f"<p>Paragraph {i}: a published proxy is found by many scrapers within minutes, "
        "used until its owner notices, and closed; a list that is a day old is mostly "
        "dead, which is why a pool has to check what it serves again and again.</p>"
        for i in range(8)
    )
    + "</article><footer>cookie banner, share buttons</footer></body></html>"
)


def _json(url: str, token: str = "") -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def _token(ppf_bin: str, up: Up, name: str, role: str) -> str:
    issued = subprocess.run(
        [ppf_bin, "token", "issue", name, "--role", role, "--nats", up.nats],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    return issued.stdout.strip().splitlines()[-1]


@dataclass
class Live:
    up: Up
    site: str  # a loopback site: /article (a page with a story in it), /plain
    consumer: str  # the consumer "shop"'s token
    admin: str
    proxy: dict[str, Any]  # one proxy the pool serves


@asynccontextmanager
async def live_up(
    ppf_bin: str, lab: ProxyLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Live]:
    # The endpoint reports its figures, and what its traffic showed of sites, at once.
    monkeypatch.setenv("PPF_FIGURES_S", "1")
    monkeypatch.setenv("PPF_SITES_S", "2")
    monkeypatch.setenv("PPF_SITES_HOLD_S", "2")  # its one site lets every exit in
    listed = "\n".join(
        f"socks5://127.0.0.1:{p.port}" if p.name == "microsocks" else f"127.0.0.1:{p.port}"
        for p in lab.proxies
        if p.proto is not None and not p.mitm
    )

    async def page(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "list.txt":
            return web.Response(text=listed + "\n")
        if name == "article":
            return web.Response(text=ARTICLE, content_type="text/html")
        return web.Response(text="plain words\n")

    app = web.Application()
    app.router.add_get("/{name}", page)
    site = TestServer(app, host="127.0.0.1")
    await site.start_server()
    up = Up(ppf_bin, tmp_path / "data", "--lab")
    await asyncio.to_thread(up.start)
    try:
        admin = _token(ppf_bin, up, "operator", "admin")
        consumer = _token(ppf_bin, up, "shop", "consumer")
        added = await asyncio.to_thread(
            subprocess.run,
            [ppf_bin, "sources", "add", str(site.make_url("/list.txt")), "--nats", up.nats],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        deadline, pool = time.monotonic() + 120, []
        while time.monotonic() < deadline and not pool:
            pool = (await asyncio.to_thread(_json, up.base + "/v1/proxies?limit=5"))["proxies"]
            await asyncio.sleep(1)
        assert pool, "no proxy of the lab's was served in 120 s"
        yield Live(up, str(site.make_url("")).rstrip("/"), consumer, admin, pool[0])
    finally:
        assert await asyncio.to_thread(up.stop) == 0
        await site.close()


def _traffic(live: Live, requests_n: int) -> list[int]:
    """Requests through the endpoint as a consumer's scraper sends them."""
    proxy = f"http://shop:{live.consumer}@127.0.0.1:{live.up.serve_port}"
    with requests.Session() as session:
        session.proxies = {"http": proxy, "https": proxy}
        return [
            session.get(live.site + "/plain", timeout=20).status_code for _ in range(requests_n)
        ]


@pytest.mark.timeout(300)
async def test_the_dashboard_shows_the_endpoint_sites_and_quality_of_a_live_ppf_up(
    ppf_bin: str, lab: ProxyLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint's traffic (requests a second, answered share, latency to the first
    byte), the sites and the pool's quality show figures from a live ``ppf up`` with a
    consumer's traffic through its endpoint; no card's content is wider than the card
    at 1,400 and 800 pixels; an agent's outage is one line, and goes within one refresh
    once the gateway learns it is over; site names show only with an admin token."""
    if chromium_path() is None:
        pytest.skip("chromium not found: apt-get install chromium (make test does, as root)")
    async with live_up(ppf_bin, lab, tmp_path, monkeypatch) as live:
        statuses = await asyncio.to_thread(_traffic, live, 40)
        assert statuses.count(200) == 40, statuses
        worker = _token(ppf_bin, live.up, "remote-worker", "worker")
        # Only an endpoint reports figures: a consumer's would bend the dashboard.
        forged = {"process": "x", "counts": {"no_proxy": 10**9}, "first_byte_ms": []}
        for token in (live.consumer, worker):
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(
                    _post, live.up.base + "/v1/endpoints/figures", token, forged
                )
            assert refused.value.code == 403
        async with Browser(tmp_path / "profile") as browser:
            await browser.width(1400)
            await browser.goto(live.up.base + "/")
            endpoint = '#endpoint tr[data-figure="answered"] td:last-child'
            await browser.wait_text(endpoint, "100 %", timeout=30)
            # The traffic's rate, while it goes on: two reports a second apart.
            going = asyncio.create_task(asyncio.to_thread(_traffic, live, 60))
            rate = '#endpoint tr[data-figure="requests/s"] td:last-child'
            seen = ""
            for _ in range(100):
                seen = await browser.text(rate) or ""
                if seen not in ("", "-", "0"):
                    break
                await asyncio.sleep(0.2)
            assert float(seen) > 0, seen
            assert (await going).count(200) == 60
            p50 = await browser.text('#endpoint tr[data-figure="first byte p50"] td:last-child')
            assert p50 is not None and p50.endswith(" ms") and float(p50[:-3]) > 0, p50
            # The sites the traffic taught, and the quality of the served pool.
            sites = '#sites tr[data-figure="sites learned"] td:last-child'
            for _ in range(100):
                if (await browser.text(sites) or "").isdigit():
                    break
                await asyncio.sleep(0.3)
            assert (await browser.text(sites) or "").isdigit()
            # Uptime needs two checks of a proxy (a span known): a working run, one.
            quality = '#quality tr[data-figure="working without a break"] td:last-child'
            for _ in range(100):
                if (await browser.text(quality) or "0") not in ("0", "counting..."):
                    break
                await asyncio.sleep(0.3)
            assert int(await browser.text(quality) or 0) >= 1
            run = await browser.text(
                '#quality tr[data-figure="unbroken for, median"] td:last-child'
            )
            assert run is not None and run.endswith((" s", " min")), run
            # Site names: none without an admin token; given one, the site the traffic went to.
            assert await browser.evaluate("document.getElementById('site-names').hidden") is True
            await browser.evaluate(
                f"document.getElementById('admin-token').value = {live.admin!r};"
                "document.getElementById('admin').requestSubmit()"
            )
            for _ in range(100):
                if "127.0.0.1" in (await browser.text("#site-names tbody") or ""):
                    break
                await asyncio.sleep(0.3)
            assert "127.0.0.1" in (await browser.text("#site-names tbody") or "")
            # An agent's own network down: one line, its details on demand; over, gone.
            down = "no judge answers directly: " + "; ".join(
                f"http://judge{i}.example/get: ClientConnectorDNSError: cannot resolve"
                for i in range(6)
            )
            await _heartbeat(live, worker, down)
            banner = "#outage > div"
            for _ in range(100):
                if await browser.evaluate(f"document.querySelectorAll('{banner}').length"):
                    break
                await asyncio.sleep(0.2)
            line = await browser.text("#outage summary") or ""
            assert line.startswith("1 agent (remote-worker): no judge answers directly, "), line
            assert "judge3" not in line and "judge3" in (await browser.text("#outage pre") or "")
            for pixels in (1400, 800):
                await browser.width(pixels)
                await asyncio.sleep(0.5)
                wide = await browser.evaluate(
                    "[...document.querySelectorAll('.card, .panel, #outage > div')]"
                    ".filter((e) => e.scrollWidth > e.clientWidth)"
                    ".map((e) => e.id || e.dataset.figure || e.textContent.slice(0, 40))"
                )
                assert wide == [], (pixels, wide)
                shot = Path("/tmp") / f"ppf-dashboard-{pixels}.png"
                await browser.screenshot(shot)
                print(f"the dashboard at {pixels} px: {shot}")
            await _heartbeat(live, worker, "")
            learned = time.monotonic()
            while time.monotonic() - learned < 10:
                if not (await asyncio.to_thread(_json, live.up.base + "/v1/stats"))["outages"]:
                    break
                await asyncio.sleep(0.1)
            learned = time.monotonic()  # the gateway knows: the page follows within a refresh
            while await browser.evaluate(f"document.querySelectorAll('{banner}').length"):
                assert time.monotonic() - learned < 2.5, "the banner outlived a refresh"
                await asyncio.sleep(0.1)
            assert browser.errors == [], browser.errors


def _post(url: str, token: str, body: Any) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


async def _heartbeat(live: Live, token: str, outage: str) -> None:
    """An agent's heartbeat, as its gateway client announces it."""
    beat = Heartbeat(id=fresh_id(), agent="remote-worker", at=now_ms(), leases=[], outage=outage)
    body = {"events": [msgspec.to_builtins(beat)]}
    await asyncio.to_thread(_post, live.up.base + "/v1/events", token, body)


def _text(got: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in got.content)


@pytest.mark.timeout(300)
async def test_mcp_drives_its_four_tools_against_a_live_ppf_up(
    ppf_bin: str, lab: ProxyLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP SDK's stdio client, as an AI agent's host, drives ``ppf mcp --lab``'s four
    tools against a live pool: ``get_proxies`` answers as ``/v1/proxies`` does (an
    impossible ``limit`` is the tool's error), ``check_proxies`` passes a served proxy,
    ``fetch_url`` gets a page through the endpoint as its readable text (menus and
    footer left out) and raw, and ``report_proxy`` is taken by the gateway."""
    mcp = pytest.importorskip("mcp", reason="pip install -e '.[mcp]' (make test does)")
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    assert mcp is not None
    async with live_up(ppf_bin, lab, tmp_path, monkeypatch) as live:
        server = StdioServerParameters(
            command=ppf_bin,
            args=["mcp", "--lab"],
            env={
                "PPF_GATEWAY": live.up.base,
                "PPF_TOKEN": live.consumer,
                "PPF_ENDPOINT": f"127.0.0.1:{live.up.serve_port}",
            },
        )
        served = f"{live.proxy['ip']}:{live.proxy['port']}"
        async with Client(stdio_client(server)) as client:
            got = await client.call_tool("get_proxies", {"limit": 5})
            assert not got.is_error, _text(got)
            rows = json.loads(_text(got))["proxies"]
            assert served in {f"{r['ip']}:{r['port']}" for r in rows}, rows
            got = await client.call_tool("get_proxies", {"limit": 0})
            assert got.is_error and "limit" in _text(got), _text(got)
            got = await client.call_tool("check_proxies", {"addresses": [served], "timeout_s": 10})
            assert not got.is_error and "passed" in _text(got), _text(got)
            got = await client.call_tool("fetch_url", {"url": live.site + "/article"})
            assert not got.is_error, _text(got)
            page = json.loads(_text(got))
            assert page["status"] == 200 and "Paragraph 7: a published proxy" in page["text"]
            assert "cookie banner" not in page["text"] and "<p>" not in page["text"], page
            got = await client.call_tool(
                "fetch_url", {"url": live.site + "/article", "as_text": False}
            )
            assert not got.is_error and "<footer>cookie banner" in json.loads(_text(got))["text"]
            got = await client.call_tool(
                "report_proxy", {"address": served, "outcome": "failed", "detail": "timed out"}
            )
            assert not got.is_error, _text(got)
            assert json.loads(_text(got)).get("outcome") == "failed", _text(got)
