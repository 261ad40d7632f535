"""Works where you are going, in the world in a box: seven sites turn most of the pool
away, each its own way (ops/lab/sitebox.py: a closed connection, a 403 page, a redirect
to a captcha, a 200 captcha page no rule names, a 429 past a pace, a redirect to a page
without a block word, a TLS alert); a consumer that names no site gets each site's real
page through a proxy's exit, and the pool says which proxies get through; an AI
agent's MCP client then gets them, and pages through them, from ``ppf mcp``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ops.bench.sites import Consumer, precision_recall, rates_of, served, sites_box
from ops.lab.sitebox import LEAVES, SITES, real_page_of
from ops.lab.world import unavailable
from tests.helpers import clear_of_the_hour, endpoint_counts

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

LEARN_S = 20  # seconds of learning before the measured ones
MEASURED_S = 30  # seconds measured
OWN_EXITS = 15  # the smaller pool: 20 honest exits (``ppf bench sites`` has 30)


@pytest.mark.timeout(350)  # 200 for the test, and up to 150 waiting out an hour's end
async def test_a_consumer_gets_each_sites_real_page_and_the_pool_learns_who_gets_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a short learning period (a consumer at 3 requests a second to each site, 1
    to the one that paces), at least 99 % of plain-HTTP and 95 % of HTTPS requests to
    seven sites that turn most exits away get the site's real page through a proxy's
    exit, and no site misses more than one request of a scheme; then ``works_on=SITE``
    against the box's truth, within 45 s: precision at least 0.85, recall at least 0.6
    (the bar of 0.95 and 0.8 is ``ppf bench sites``'s, after minutes of learning on 30
    exits: here a minute's on 20; before the classes were read, a 200 captcha page's
    was 0.0 and 0.0). The endpoint says its sites' verdicts every 5 s here, not every
    minute: the suite's time."""
    monkeypatch.setenv("PPF_SITES_S", "5")
    # The checker probes a site's root at most 4 times an hour, by the clock's hour: a run
    # that straddles two may see 8 (this test failed so at 07:00:00).
    await clear_of_the_hour(150)
    async with sites_box(tmp_path, own_exits=OWN_EXITS) as box:
        world, up, honest = box.world, box.up, box.honest
        token = await up.cli("token", "issue", "scraper", "--role", "consumer")
        exits = world.exit_ips()
        endpoint = f"http://scraper:{token}@{up.serve}"
        consumer = Consumer(endpoint, exits)
        rates = rates_of(3.0, 1.0)
        await consumer.send(rates, LEARN_S)
        consumer.reset()
        before = await endpoint_counts(up.base)
        await consumer.send(rates, MEASURED_S)
        # What the endpoint did in the measured window, for a failure to say.
        after = await endpoint_counts(up.base)
        during = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        # A site's 45 requests a scheme (the paced one's 15) cannot tell 99 % from 100 %:
        # one miss is 2.2 points (6.7). The seven sites together hold the bars, and no
        # site misses more than one request a scheme; ``ppf bench sites`` holds the bars
        # site by site, over 120 requests a scheme.
        for scheme, least in (("http", 0.99), ("https", 0.95)):
            missed = {s.name: consumer.tally[(s.name, scheme)][1] for s in SITES}
            asked = sum(consumer.share(s.name, (scheme,))[1] for s in SITES)
            shown = {site: got[:3] for site, got in missed.items() if got}
            assert sum(map(len, missed.values())) <= (1 - least) * asked, (
                scheme, asked, shown, during,
            )  # fmt: skip
            assert all(len(got) <= 1 for got in missed.values()), (scheme, shown, during)
        assert not consumer.elsewhere, consumer.elsewhere[:5]
        # The pool says who gets through once the endpoint's verdicts, and the probes
        # that follow the sites of its traffic, are folded.
        deadline = time.monotonic() + 45
        scores: dict[str, tuple[float, float]] = {}
        # Each site's proxies said wrongly: those that get through, unsaid, and (a "-")
        # those said that do not.
        wrong: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            for site in SITES:
                said, truth = await served(up.base, site.name), world.gets_through(site.name)
                scores[site.name] = precision_recall(said, truth & honest)
                via = world.via()
                wrong[site.name] = sorted(via[a] for a in truth & honest - said)
                wrong[site.name] += sorted(f"-{via.get(a, a)}" for a in said - truth)
            if all(p >= 0.85 and r >= 0.6 for p, r in scores.values()):
                break
            await asyncio.sleep(2)
        assert all(p >= 0.85 and r >= 0.6 for p, r in scores.values()), f"{scores} {wrong}"
        # Both sources spoke of every site: the endpoint's traffic and ppf up's
        # checker, probing the sites of traffic at their roots (4 an hour at most).
        admin = await up.cli("token", "issue", "op", "--role", "admin")
        request = urllib.request.Request(
            up.base + "/v1/sites", headers={"Authorization": f"Bearer {admin}"}
        )
        known = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(request)))
        by_site = {s["site"]: s for s in known["sites"]}
        for site in SITES:
            row = by_site[site.name]
            assert row["vantages"] >= 2, row
            assert row["probes_this_hour"] > 0 and row["traffic_this_hour"] > 0, row
        probed = world.root_asks()
        assert probed and all(n <= 4 * len(honest) for n in probed.values()), probed
        await _an_agent_speaks_mcp(up, token, exits, world.gets_through("example.net") & honest)
    assert up.proc.returncode == 0  # ppf up stopped cleanly


async def _an_agent_speaks_mcp(up: Any, token: str, exits: set[str], truth: set[str]) -> None:
    """``ppf mcp`` over stdio, started by the SDK's own client as an AI agent's host
    starts it: its four tools listed; ``get_proxies`` with ``works_on`` gives only
    proxies the pool serves that get through to the site; ``fetch_url`` gives a box
    site's page through a proxy's exit, and refuses URLs, and redirects, to loopback,
    private, link-local and internal hosts."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ops.cli", "mcp"],
        env={"PPF_GATEWAY": up.base, "PPF_TOKEN": token, "PPF_ENDPOINT": up.serve},
        cwd=str(Path(__file__).parent.parent),
    )
    async with Client(params) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {"get_proxies", "check_proxies", "fetch_url", "report_proxy"}
        got = await client.call_tool("get_proxies", {"works_on": ["example.net"], "limit": 500})
        assert not got.is_error, got.content
        rows = (got.structured_content or {})["proxies"]
        said = {f"{p['ip']}:{p['port']}" for p in rows}
        assert said and said <= truth, (said - truth, truth)
        assert said <= await served(up.base), "not served"
        page = await client.call_tool("fetch_url", {"url": "http://example.org/", "as_text": False})
        assert not page.is_error, page.content
        html = (page.structured_content or {})["text"].encode()
        assert real_page_of("example.org", html) in exits, html[:200]
        text = await client.call_tool("fetch_url", {"url": "http://example.org/"})
        assert "Lorem ipsum" in (text.structured_content or {})["text"]
        away = {u: urlsplit(u).hostname for u in ("http://127.0.0.1/", "http://10.1.2.3/")}
        away |= {
            u: urlsplit(u).hostname for u in ("http://169.254.169.254/", "http://db.internal/")
        }
        away["http://localhost/"] = "localhost"
        # Pages that redirect there: the refusal names where they sent the fetch.
        away |= {f"http://example.net{path}": urlsplit(to).hostname for path, to in LEAVES.items()}
        for url, host in away.items():
            refused = await client.call_tool("fetch_url", {"url": url})
            said_text = " ".join(getattr(c, "text", "") for c in refused.content)
            assert refused.is_error and f"refused: {host} " in said_text, (url, said_text)
