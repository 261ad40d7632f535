"""The Axiom tap against local servers that speak Axiom's ingest API, well or badly."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from eventlog.client import Log
from ops.telemetry.tap import Tap, TapConfig
from projections.live import FoldService, metrics_row
from tests.helpers import worked


class FakeAxiom:
    """Records ingested rows; ``mode`` ok, fail (500)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.rows: list[dict[str, Any]] = []
        self.requests = 0
        self.auth: set[str] = set()

    async def ingest(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.auth.add(request.headers.get("Authorization", ""))
        body = await request.read()
        if body[:2] == b"\x1f\x8b":  # aiohttp may have inflated it already
            body = gzip.decompress(body)
        if self.mode == "fail":
            return web.json_response({"message": "down"}, status=500)
        lines = [json.loads(x) for x in body.splitlines() if x.strip()]
        if len(lines) == 1 and isinstance(lines[0], list):
            lines = lines[0]
        self.rows.extend(lines)
        return web.json_response(
            {
                "ingested": len(lines),
                "failed": 0,
                "failures": [],
                "processedBytes": len(body),
                "blocksCreated": 0,
                "walLength": 0,
            }
        )


@pytest.fixture
async def axiom() -> AsyncIterator[tuple[FakeAxiom, str]]:
    fake = FakeAxiom()
    app = web.Application()
    app.router.add_post("/v1/datasets/{dataset}/ingest", fake.ingest)
    server = TestServer(app)
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def _until(cond: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.05)


def _config(url: str, **kw: Any) -> TapConfig:
    return TapConfig(
        token="xaat-test", dataset="ppf-test", url=url, batch_rows=50, batch_s=0.05, **kw
    )


async def test_every_folded_event_reaches_axiom(log_client: Log, axiom: Any) -> None:
    """Every folded event reaches the Axiom ingest endpoint."""
    fake, url = axiom
    events = [worked(f"8.8.8.{i}", latency_ms=i) for i in range(1, 121)]
    await log_client.publish_many(events)
    fold = FoldService(log_client, db=None, tap=Tap(_config(url)))
    await fold.start()
    try:
        assert await fold.wait_for(120, 10)
        await log_client.publish(worked("9.9.9.9"))  # a later frame flushes the last rows
        await _until(lambda: len(fake.rows) >= 121)
    finally:
        await fold.stop()
    assert fake.auth == {"Bearer xaat-test"}
    by_seq = {r["seq"]: r for r in fake.rows if r.get("type") == "ProxyWorked"}
    assert sorted(by_seq) == list(range(1, 122))
    row = by_seq[5]
    assert row["subject"] == "ppf.proxy.8-8-8-5_8080" and row["ip"] == "8.8.8.5"
    assert row["_time"].endswith("+00:00") and row["_time"].startswith("20")
    assert fold.tap is not None and fold.tap.stats.dropped == 0


async def test_axiom_answering_500_costs_rows_never_the_fold(log_client: Log, axiom: Any) -> None:
    """Axiom answering 500 drops tap rows, never slows or stops the fold."""
    fake, url = axiom
    fake.mode = "fail"
    await log_client.publish_many([worked(f"8.8.4.{i}") for i in range(1, 201)])
    fold = FoldService(log_client, db=None, tap=Tap(_config(url, timeout_s=1.0)))
    await fold.start()
    try:
        assert await fold.wait_for(200, 10)
        assert len(fold.state.proxies) == 200
        await log_client.publish(worked("9.9.9.9"))
        tap = fold.tap
        assert tap is not None
        await _until(lambda: tap.stats.errors > 0 and tap.stats.failed > 0, 30)
        assert "500" in tap.stats.last_error or "Error" in tap.stats.last_error
    finally:
        await fold.stop()


async def test_axiom_that_never_answers_costs_rows_never_the_fold(log_client: Log) -> None:
    """An Axiom that never answers drops tap rows, never the fold."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(100)  # accepts connections (the kernel does), never answers
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    tap = Tap(_config(url, timeout_s=0.5, max_rows=100, max_pipe_bytes=64 * 1024))
    fold = FoldService(log_client, db=None, tap=tap)
    await fold.start()
    try:
        for round_ in range(5):
            await log_client.publish_many(
                [worked(f"8.{round_ + 1}.{i // 250}.{i % 250 + 1}") for i in range(1000)]
            )
        assert await fold.wait_for(5000, 20)
        assert len(fold.state.proxies) == 5000
        await _until(lambda: tap.stats.dropped + tap.stats.failed > 0, 30)
        assert tap.stats.sent == 0
    finally:
        await fold.stop()
        hole.close()


def test_tap_is_off_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AXIOM_TOKEN there is no tap."""
    monkeypatch.delenv("AXIOM_TOKEN", raising=False)
    assert TapConfig.from_env() is None
    monkeypatch.setenv("AXIOM_TOKEN", "xaat-1")
    monkeypatch.setenv("AXIOM_URL", "http://127.0.0.1:9")
    config = TapConfig.from_env()
    assert config is not None and config.dataset == "ppf" and config.url == "http://127.0.0.1:9"


async def test_the_metrics_row_counts_deposit_store_operations(log_client: Log) -> None:
    """The tap's metrics row carries the deposit store's operations by outcome."""
    from eventlog.protocol import DepositError

    data = b"1.2.3.4:80\n"
    key = "page/" + hashlib.sha256(data).hexdigest()
    await log_client.deposits.put(key, data)
    with pytest.raises(DepositError):
        await log_client.deposits.get(key, hashlib.sha256(b"not it").hexdigest())
    fold = FoldService(log_client, db=None, deposits=log_client.deposits)
    row = await metrics_row(fold)
    assert row["deposit.put.ok"] == 1 and row["deposit.get.digest"] == 1


def test_a_round_reaches_axiom_as_a_row_per_result() -> None:
    """The dashboard counts by type: a ProxiesChecked gives one ProxyWorked or
    ProxyFailed row per result, with its envelope and index; a Located of many, a row
    per address."""
    import events as ev
    from ops.telemetry.tap import _rows

    batch = ev.ProxiesChecked(
        id="r1",
        agent="c1",
        at=5,
        key="s001",
        lease="l1",
        results=[
            ev.CheckResult(ip="60.0.0.1", port=80, proto="http", latency_ms=9),
            ev.CheckResult(ip="60.0.0.2", port=81, proto="http", ok=False, error="timeout"),
        ],
    )
    located = ev.Located(
        id="g1", agent="fold", at=5, ip="60.0.0.1", country="DE", geo="v1",
        more=[ev.Place(ip="60.0.0.2", country="FR")],
    )  # fmt: skip
    rows = _rows([(7, 1_000, b"ppf.checked.s001", ev.encode(batch)),
                  (8, 1_000, b"ppf.geo.60-0-0-1", ev.encode(located))])  # fmt: skip
    assert [(r["type"], r["ip"], r.get("index"), r["seq"]) for r in rows] == [
        ("ProxyWorked", "60.0.0.1", 0, 7),
        ("ProxyFailed", "60.0.0.2", 1, 7),
        ("Located", "60.0.0.1", None, 8),
        ("Located", "60.0.0.2", None, 8),
    ]
    assert rows[1]["lease"] == "l1" and rows[1]["error"] == "timeout" and "results" not in rows[0]
    assert rows[3]["country"] == "FR" and rows[3]["geo"] == "v1"


def test_the_tap_leaves_sites_out() -> None:
    """Which sites the traffic goes to stays in the fleet: site verdicts give no row, and
    a consumer's report of a block gives its row without the site."""
    import events as ev
    from ops.telemetry.tap import _rows

    verdicts = ev.SitesChecked(
        id="v1", agent="local-endpoint", at=5, key="traffic",
        results=[ev.SiteResult(ip="60.0.0.1", port=80, site="clinic.example.com", blocked=1)],
    )  # fmt: skip
    report = ev.ProxyReported(
        id="p1", agent="shop", at=5, ip="60.0.0.1", port=80, outcome="blocked",
        site="clinic.example.com",
    )  # fmt: skip
    rows = _rows([(7, 1_000, b"ppf.checked.traffic", ev.encode(verdicts)),
                  (8, 1_000, b"ppf.report.x", ev.encode(report))])  # fmt: skip
    assert [r["type"] for r in rows] == ["ProxyReported"]
    assert "clinic.example.com" not in repr(rows)
