"""The dashboard in a real headless Chromium against a real gateway and nats-server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

import events as ev
from eventlog.client import Log, fresh_id, now_ms
from gateway.app import make_app
from gateway.http import GatewayConfig
from ops.cli.seed import plan
from projections.live import FoldService
from tests.browser import Browser, chromium_path
from tests.helpers import worked


@pytest.mark.timeout(120)
async def test_dashboard_shows_the_projection_and_follows_it(
    log_client: Log, tmp_path: Path
) -> None:
    """The dashboard page shows the pool and the bulk imports in Chromium and follows new
    events."""
    if chromium_path() is None:
        pytest.skip("chromium not found: apt-get install chromium (make test does, as root)")
    for i in range(3):
        url = f"http://lists.example/{i}.txt"
        await log_client.publish(
            ev.SourceAdded(
                id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=ev.url_id(url)
            )
        )
    await log_client.publish_many(
        [worked(f"8.8.8.{i}", proto="socks5" if i % 2 else "http", agent="w1") for i in range(1, 6)]
    )
    planned, _ = await plan(log_client, b"8.8.8.8:1\n8.8.8.8:2\n8.8.8.8:3\n", "proxies", 2, 1)
    assert planned is not None
    fold = FoldService(log_client, db=None)
    await fold.start()
    assert await fold.wait_for(await log_client.head_seq(), 10)
    server = TestServer(make_app(fold, log_client, GatewayConfig(series_every_s=0.5)))
    await server.start_server()
    try:
        async with Browser(tmp_path / "profile") as browser:
            await browser.goto(str(server.make_url("/")))
            alive = '[data-figure="alive proxies"] b'
            await browser.wait_text(alive, "5")
            assert await browser.text('[data-figure="sources"] b') == "3"
            rows = await browser.text("#proxies tbody")
            assert rows is not None and "socks5://8.8.8.1:8080" in rows
            # New events arrive: the page follows without a reload.
            await log_client.publish_many([worked(f"9.9.9.{i}", agent="w2") for i in range(1, 4)])
            await browser.wait_text(alive, "8")
            agents = await browser.text("#agents tbody")
            assert agents is not None and "w2" in agents
            seed = await browser.text("#seed tbody")
            assert seed is not None and f"{planned.plan} (proxies, priority 1)" in seed
            assert "0 / 3" in seed and "0 / 0 / 2 / 0" in seed, seed
            shot = tmp_path / "dashboard.png"
            await browser.screenshot(shot)
            assert shot.stat().st_size > 10_000
            shutil.copy(shot, Path("/tmp") / "ppf-dashboard.png")
            assert browser.errors == [], browser.errors
    finally:
        await server.close()
        await fold.stop()
