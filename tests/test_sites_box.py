"""Works where you are going, in the world in a box: three sites turn most of the pool
away, each its own way (ops/lab/sitebox.py); a consumer that names no site gets each
site's real page through a proxy's exit, and the pool says which proxies get through."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ops.bench.sites import Consumer, precision_recall
from ops.lab.sitebox import SITES
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from tests.test_cli import Up

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

LEARN = 15  # requests to each site and scheme before the measured ones
MEASURED = 100  # requests to each site and scheme measured


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


async def _cli(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, argv
    return out.decode().strip()


@pytest.mark.timeout(300)
async def test_a_consumer_gets_each_sites_real_page_and_the_pool_learns_who_gets_through(
    tmp_path: Path, ppf_bin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a short learning period, at least 99 % of plain-HTTP and 95 % of HTTPS
    requests to each of three sites that turn most exits away (a closed connection, a
    403 page, a redirect to a captcha) get the site's real page through a proxy's exit;
    then ``works_on=SITE`` against the box's truth: precision at least 0.95, recall at
    least 0.8. (The endpoint says its sites' verdicts every 5 s here, not every minute:
    the suite's time; ``ppf bench sites`` measures at the defaults.)"""
    monkeypatch.setenv("PPF_SITES_S", "5")
    with World(tmp_path / "w", dead_each=1, extra_working=10, sites=True) as world:
        judge_port, tls_port = free_port(), free_port()
        up = Up(
            ppf_bin,
            tmp_path / "data",
            "--no-seed",
            *("--judge", world.judges["httpbin"]),
            *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
            *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
            *("--judge-tls-listen", f"{LINK_HOST}:{tls_port}"),
            *("--https-target", world.https_url),
            *("--agents-idle", "1"),
        )
        await asyncio.to_thread(up.start)
        try:
            await _cli(ppf_bin, "sources", "add", world.page_url, "--nats", up.nats)
            honest = {a for a, name in world.via().items() if not name.startswith("mitm")}
            served: set[str] = set()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and served != honest:
                rows = (await asyncio.to_thread(_json, up.base + "/v1/proxies?limit=0"))["proxies"]
                served = {f"{p['ip']}:{p['port']}" for p in rows}
                await asyncio.sleep(1)
            assert served == honest, (sorted(served), sorted(honest))
            token = await _cli(
                ppf_bin, "token", "issue", "scraper", "--role", "consumer", "--nats", up.nats
            )
            exits = {p.exit_ip for p in world.proxies}
            endpoint = f"http://scraper:{token}@127.0.0.1:{up.serve_port}"
            consumer = Consumer(endpoint, exits, concurrency=20)
            await consumer.send([s.name for s in SITES], LEARN)
            consumer.reset()
            await consumer.send([s.name for s in SITES], MEASURED)
            for site in SITES:
                for scheme, least in (("http", 0.99), ("https", 0.95)):
                    got, wrong = consumer.tally[(site.name, scheme)]
                    share = got / MEASURED
                    assert share >= least, (site.name, scheme, share, wrong[:5])
            assert not consumer.elsewhere, consumer.elsewhere[:5]
            # The pool says who gets through once the endpoint's verdicts, and the probes
            # that follow the sites of its traffic, are folded.
            deadline = time.monotonic() + 90
            scores: dict[str, tuple[float, float]] = {}
            while time.monotonic() < deadline:
                for site in SITES:
                    url = up.base + f"/v1/proxies?limit=0&works_on={site.name}"
                    rows = (await asyncio.to_thread(_json, url))["proxies"]
                    said = {f"{p['ip']}:{p['port']}" for p in rows}
                    scores[site.name] = precision_recall(
                        said, world.gets_through(site.name) & honest
                    )
                if all(p >= 0.95 and r >= 0.8 for p, r in scores.values()):
                    break
                await asyncio.sleep(2)
            assert all(p >= 0.95 and r >= 0.8 for p, r in scores.values()), scores
            # Both sources spoke of every site: the endpoint's traffic and ppf up's
            # checker, probing the sites of traffic at their roots (4 an hour at most).
            admin = await _cli(
                ppf_bin, "token", "issue", "op", "--role", "admin", "--nats", up.nats
            )
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
        finally:
            assert await asyncio.to_thread(up.stop) == 0
