"""The live fold and the gateway skeleton, against a real nats-server and a real port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

import events as ev
from endpoint.feed import Feed
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from eventlog.client import Log, fresh_id, now_ms
from eventlog.stream import Firehose
from events.sites import SiteRule
from gateway.app import make_app
from projections import Folder, digest
from projections.live import LAG_BOUND, FoldService
from reducers import State
from tests.helpers import worked


async def _caught_up(fold: FoldService, lg: Log, timeout: float = 10.0) -> None:
    head = await lg.head_seq()
    assert await fold.wait_for(head, timeout), f"fold stuck at {fold.applied_seq} of {head}"


async def _dlq(lg: Log, reason: str) -> list[tuple[bytes, dict[str, str]]]:
    out = []
    sub = await lg.js.subscribe(f"ppf.dlq.{reason}", ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            out.append((msg.data, dict(msg.headers or {})))
    finally:
        await sub.unsubscribe()
    return out


async def test_bad_messages_go_to_the_dlq_and_the_fold_goes_on(
    log_client: Log, tmp_path: Path
) -> None:
    """Bad payloads go to the DLQ with their reason and the fold goes on."""
    await log_client.publish(worked("8.8.8.8"))
    await log_client.publish_raw("ppf.proxy.x", b"{garbage", msg_id="bad-1")
    await log_client.publish_raw("ppf.proxy.x", b'{"type": "Nope", "id": "1"}', msg_id="bad-2")
    await log_client.publish_raw(
        "ppf.proxy.x", b'{"type": "ProxyWorked", "id": "x", "agent": "a", "at": 1}', msg_id="b3"
    )
    for ip, port in [("10.0.0.1", 80), ("1.2.3.4", 0), ("999.1.1.1", 80)]:
        await log_client.publish(worked(ip, port))
    await log_client.publish(worked("8.8.4.4"))
    fold = FoldService(log_client, db=tmp_path / "p.duckdb")
    await fold.start()
    try:
        await _caught_up(fold, log_client)
        assert set(fold.state.proxies) == {("8.8.8.8", 8080), ("8.8.4.4", 8080)}
        assert fold.folder.rejected == 3
        for _ in range(100):
            if fold.dead_letters.sent == 3:
                break
            await asyncio.sleep(0.05)
        undecodable = await _dlq(log_client, "undecodable")
        assert [d for d, _ in undecodable] == [b"{garbage"]
        assert undecodable[0][1]["Ppf-Seq"] == "2"
        assert undecodable[0][1]["Ppf-Subject"] == "ppf.proxy.x"
        assert len(await _dlq(log_client, "unknown_type")) == 1
        invalid = await _dlq(log_client, "invalid")
        assert "missing required field" in invalid[0][1]["Ppf-Error"]
        # The fold skips its own DLQ entries, and they do not move the projection.
        await _caught_up(fold, log_client)
        assert fold.folder.rejected == 3
    finally:
        await fold.stop()


async def test_restart_resumes_after_the_checkpoint_without_double_counting(
    log_client: Log, tmp_path: Path
) -> None:
    """A restarted fold resumes after its checkpoint and counts nothing twice."""
    db = tmp_path / "p.duckdb"
    first = [worked(f"8.8.8.{i % 20 + 1}", latency_ms=i) for i in range(300)]
    await log_client.publish_many(first)
    fold = FoldService(log_client, db=db, every_events=50, every_ms=10)
    await fold.start()
    await _caught_up(fold, log_client)
    await fold.stop()
    second = [worked(f"8.8.4.{i % 20 + 1}", latency_ms=i) for i in range(300)]
    await log_client.publish_many(second)
    again = FoldService(log_client, db=db)
    assert again.applied_seq == 300
    await again.start()
    try:
        await _caught_up(again, log_client)
        reference = State()
        msgs = []
        async for batch in Firehose(log_client.url).batches(until=600):
            msgs.extend(batch)
        Folder(reference).apply(msgs)
        assert (await again.checkpoint_now())[1] == digest(reference)
        confirmations = sum(p.confirmations for p in again.state.proxies.values())
        assert confirmations == 600
    finally:
        await again.stop()


@pytest.fixture
async def gateway(log_client: Log) -> AsyncIterator[tuple[TestClient, FoldService]]:  # type: ignore[type-arg]
    fold = FoldService(log_client, db=None)
    await fold.start()
    client = TestClient(TestServer(make_app(fold)))
    await client.start_server()
    try:
        yield client, fold
    finally:
        await client.close()
        await fold.stop()


async def test_gateway_serves_the_projections(
    gateway: tuple[TestClient, FoldService],  # type: ignore[type-arg]
    log_client: Log,
) -> None:
    """health, readiness and stats answer from the projections, digest at digest_seq."""
    client, fold = gateway
    url = "http://list.example/socks5.txt"
    uid = ev.url_id(url)
    await log_client.publish(
        ev.SourceAdded(
            id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=uid, proto_hint="socks5"
        )
    )
    await log_client.publish(worked("8.8.8.8", 1080, proto="socks5", latency_ms=50))
    await log_client.publish(worked("1.1.1.1", 3128, proto="http", latency_ms=500))
    await _caught_up(fold, log_client)

    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    body = await ready.json()
    assert ready.status == 200 and body["applied_seq"] == body["head_seq"] == 3

    assert await fold.checkpoint_now() == (3, digest(fold.state))
    stats = await (await client.get("/v1/stats")).json()
    assert stats["applied_seq"] == 3 and stats["head_seq"] == 3
    assert (stats["digest_seq"], stats["digest"]) == (3, digest(fold.state))
    assert stats["proxies"] == {"known": 2, "alive": 2}
    assert stats["pool"]["by_proto"] == {"http": 1, "socks5": 1}
    assert stats["pool"]["by_anonymity"] == {"unknown": 2}
    assert set(stats["rates"]) == {"1m", "5m", "15m"} and "fold" in stats["rates"]["1m"]
    assert stats["queues"]["due_sources"] == 1 and stats["queues"]["stale_proxies"] == 0
    assert stats["lag"] == 0 and stats["lag_s"] == 0
    assert {"publish", "direct_get"} <= set(stats["nats_ops"]) and stats["deposit_ops"] == {}
    activity = {a["name"]: a for a in stats["agent_activity"]}
    assert activity["w1"]["events"] == {"ProxyWorked": 2}
    assert stats["tap"] is None

    everything = await (await client.get("/v1/proxies")).json()
    assert [p["ip"] for p in everything["proxies"]] == ["8.8.8.8", "1.1.1.1"]
    socks = await (await client.get("/v1/proxies?proto=socks5&format=txt")).text()
    assert socks == "socks5://8.8.8.8:1080\n"
    fast = await (await client.get("/v1/proxies?max_latency_ms=100")).json()
    assert fast["count"] == 1
    csv = await (await client.get("/v1/proxies?format=csv&sort=last_seen&limit=1")).text()
    assert csv.splitlines()[0].startswith("proto,ip,port") and len(csv.splitlines()) == 2
    none = await (await client.get("/v1/proxies?status=dead")).json()
    assert none == {"count": 0, "proxies": []}

    bad = await client.get("/v1/proxies?limit=lots")
    assert bad.status == 400
    assert bad.content_type == "application/problem+json"
    problem = await bad.json()
    assert problem["type"].endswith("/bad-parameter") and problem["parameter"] == "limit"
    assert (await client.get("/v1/proxies?status=zombie")).status == 400

    # Per site: a proxy is served for a site only with an answer through from it.
    results = [
        ev.SiteResult(ip="8.8.8.8", port=1080, site="google.com", through=2),
        ev.SiteResult(ip="1.1.1.1", port=3128, site="google.com", blocked=1),
        ev.SiteResult(ip="1.1.1.1", port=3128, site="shop.example", through=1),
    ]
    await log_client.publish(
        ev.SitesChecked(id=fresh_id(), agent="c1", at=now_ms(), key="s001", results=results)
    )
    await _caught_up(fold, log_client)
    assert sum(fold.state.site_cells.values()) == 3, fold.state.refusals
    for _ in range(50):  # the pool view follows the fold within a tenth of a second
        got = await (await client.get("/v1/proxies?works_on=google.com")).json()
        if got["count"]:
            break
        await asyncio.sleep(0.1)
    for sites, served in [
        ("google.com", ["8.8.8.8"]),
        ("shop.example", ["1.1.1.1"]),
        ("google.com,shop.example", []),
        ("reddit.com", []),
    ]:
        got = await (await client.get(f"/v1/proxies?works_on={sites}")).json()
        assert [p["ip"] for p in got["proxies"]] == served, sites
    wrong = await client.get("/v1/proxies?works_on=Google.COM")
    assert wrong.status == 400 and (await wrong.json())["parameter"] == "works_on"
    # Which sites are watched is the admin's: /metrics sums them for anyone else.
    metrics = await (await client.get("/metrics")).text()
    assert 'ppf_site_proxies{latest="blocked",site="*"} 1' in metrics
    assert "google.com" not in metrics and "shop.example" not in metrics
    drop_in = await (await client.get("/all/?works_on=shop.example")).json()
    assert [p["proxy"] for p in drop_in] == ["1.1.1.1:3128"]

    # What the fleet knows of sites is the admin's alone.
    for name, role in (("ops", "admin"), ("shop", "consumer"), ("edge", "endpoint")):
        await log_client.publish(
            ev.AgentEnrolled(
                id=fresh_id(), agent="admin", at=now_ms(), name=name, role=role,
                token_sha256=ev.token_sha256(f"{name}-token"),
            )
        )  # fmt: skip
    # The operator's rules, on their own subject, served to the endpoints and the agents.
    rule = SiteRule(site="shop.example", blocked=(403,), redirects=("/captcha",))
    await log_client.publish(ev.SiteRuled(id=fresh_id(), agent="admin", at=now_ms(), rule=rule))
    await _caught_up(fold, log_client)
    pool = Pool()
    feed = Feed([str(client.make_url("")).rstrip("/")], pool, identity=("edge", "edge-token"))
    await feed.start()
    await feed.stop()
    assert pool.rules == (rule,) and fold.state.site_rules == {"shop.example": rule}
    ops = {"Authorization": "Bearer ops-token"}
    named = await (await client.get("/metrics", headers=ops)).text()
    assert 'ppf_site_proxies{latest="through",site="google.com"} 1' in named
    assert 'ppf_site_proxies{latest="blocked",site="google.com"} 1' in named
    assert (await client.get("/v1/sites")).status == 401
    shop = {"Authorization": "Bearer shop-token"}
    assert (await client.get("/v1/sites", headers=shop)).status == 403
    assert (await client.get("/v1/sites/rules")).status == 401
    assert (await client.get("/v1/sites/rules", headers=shop)).status == 403
    known = await (
        await client.get("/v1/sites", headers={"Authorization": "Bearer ops-token"})
    ).json()
    by_site = {row["site"]: row for row in known["sites"]}
    assert (by_site["google.com"]["through"], by_site["google.com"]["blocked"]) == (1, 1)
    assert by_site["google.com"]["turned_away_share"] == 0.5
    assert (
        by_site["google.com"]["probes_this_hour"],
        by_site["google.com"]["traffic_this_hour"],
    ) == (3, 0)
    assert by_site["shop.example"]["vantages"] == 1 and known["unkept"] == 0

    # An endpoint's feed takes what moved since its last ask into its pool (the fleet's
    # word routes its requests too); a consumer may not ask.
    assert (await client.get("/v1/sites/changes", headers=shop)).status == 403
    edge = Pool()
    edge.replace(
        [Upstream("8.8.8.8", 1080, "socks5"), Upstream("1.1.1.1", 3128, "http")]
    )  # fmt: skip
    feed = Feed([str(client.make_url("")).rstrip("/")], edge, identity=("edge", "edge-token"))
    await feed.start()
    await feed.refresh_standing()
    await feed.stop()
    assert set(edge.standing.through["google.com"]) == {("8.8.8.8", 1080)}
    assert set(edge.standing.through["shop.example"]) == {("1.1.1.1", 3128)}
    assert "google.com" in edge.upstreams[("1.1.1.1", 3128)].turned_away
    assert edge.tally.take(0.0) == ({}, 0)  # the fleet's word is not this endpoint's to say again
    later = await client.get(
        f"/v1/sites/changes?since={feed._standing_at}",
        headers={"Authorization": "Bearer edge-token"},
    )
    assert (await later.json())["cells"] == []  # nothing moved since

    sources = await (await client.get("/v1/sources")).json()
    assert [s["url_id"] for s in sources["sources"]] == [uid]
    assert sources["sources"][0]["due"] is True
    missing = await client.get("/v1/nothing-here")
    assert missing.status == 404 and missing.content_type == "application/problem+json"


async def test_rejected_messages_are_logged_with_seq_and_reason(log_client: Log) -> None:
    """A rejected message is logged with its sequence and reason."""
    from structlog.testing import capture_logs

    await log_client.publish_raw("ppf.proxy.x", b"{garbage", msg_id="bad-log")
    fold = FoldService(log_client, db=None)
    with capture_logs() as logs:
        await fold.start()
        try:
            assert await fold.wait_for(1, 10)
        finally:
            await fold.stop()
    rejected = [x for x in logs if x["event"] == "event_rejected"]
    assert rejected and rejected[0]["seq"] == 1 and rejected[0]["reason"] == "undecodable"


async def test_queries_read_the_stream_head_without_a_round_trip(log_client: Log) -> None:
    """head_seq answers from the background read: a burst of asks costs no JetStream API
    call of its own, and a newly published event shows within the read interval."""
    fold = FoldService(log_client, db=None)
    await fold.start()
    try:
        await _caught_up(fold, log_client)
        await fold.head_seq()
        asked = log_client.ops["stream_info"]
        for _ in range(200):
            await fold.head_seq()
        # Only the watcher's reads (one every 250 ms) happened meanwhile, not 200.
        assert log_client.ops["stream_info"] - asked <= 2
        await log_client.publish(worked("8.8.8.8"))
        head = await log_client.head_seq()
        await asyncio.sleep(0.6)
        assert await fold.head_seq() == head
    finally:
        await fold.stop()


async def _midway(fold: FoldService) -> None:
    """Wait (on the fold's own loop) until a slice has ended inside a round."""
    for _ in range(20_000):
        if fold.folder.midway:
            return
        await asyncio.sleep(0)
    pytest.fail("the fold never stopped midway through a round")


# Enough rounds that the fold, which may start on them while ``start()`` still awaits
# its writer, is still inside one after a checkpoint has waited for another.
ROUNDS = 20


def _rounds(count: int) -> list[ev.ProxiesChecked]:
    """``count`` checker rounds of 500 new proxies each: tens of ms of the fold each."""
    return [
        ev.ProxiesChecked(
            id=fresh_id(),
            agent="c1",
            at=now_ms(),
            key="s001",
            results=[
                ev.CheckResult(ip=f"54.{r}.{i // 250}.{i % 250 + 1}", port=80, proto="http")
                for i in range(500)
            ],
        )
        for r in range(count)
    ]


async def test_no_checkpoint_and_no_stop_cuts_a_round_in_pieces(
    log_client: Log, tmp_path: Path
) -> None:
    """The fold gives the loop back inside a round of 500 new proxies; a checkpoint
    asked for then waits until the round is whole (its digest is a replay's at its
    sequence), and a stop that comes midway finishes the round before its last cut: a
    restart folds on from there to the digest of the whole log, nothing applied twice."""
    await log_client.publish_many(_rounds(ROUNDS))
    db = tmp_path / "p.duckdb"
    msgs = []
    async for batch in Firehose(log_client.url).batches(until=ROUNDS):
        msgs.extend(batch)
    fold = FoldService(log_client, db=db, every_events=10**9, every_ms=10**9)
    await fold.start()
    try:
        await _midway(fold)
        seq, found = await fold.checkpoint_now()
        reference = State()
        Folder(reference).apply(msgs[:seq])
        assert found == digest(reference) and len(fold.state.proxies) == 500 * seq
        await _midway(fold)
        before = fold.state.last_seq  # the stop comes inside the round after this one
    finally:
        await fold.stop()
    stopped = fold.state.last_seq
    assert stopped == before + 1  # that round finished, and no further one begun
    assert len(fold.state.proxies) == 500 * stopped  # whole rounds only
    again = FoldService(log_client, db=db)
    assert again.applied_seq == stopped
    await again.start()
    try:
        await _caught_up(again, log_client)
        reference = State()
        Folder(reference).apply(msgs)
        assert (await again.checkpoint_now())[1] == digest(reference)
    finally:
        await again.stop()


async def test_a_fold_far_behind_the_log_cuts_no_timed_checkpoint_until_it_caught_up(
    log_client: Log, tmp_path: Path
) -> None:
    """Catching up with a backlog, the fold checkpoints every ``every_events`` only (a
    timed cut held the fold, and the served view after it); once within ``LAG_BOUND``
    of the head, its timed checkpoints come again, the last at the head."""
    backlog = 8 * LAG_BOUND
    await log_client.publish_many(
        [worked(f"8.{i // 250 + 1}.{i % 250 + 1}.1") for i in range(backlog)]
    )
    fold = FoldService(log_client, db=tmp_path / "p.duckdb", every_events=3_000, every_ms=1)
    cuts: list[tuple[int, bool]] = []  # (seq, catching up) at each checkpoint
    cut = fold.checkpointer.checkpoint

    async def counted(state: State) -> None:
        cuts.append((state.last_seq, fold.catching_up()))
        await cut(state)

    fold.checkpointer.checkpoint = counted  # type: ignore[method-assign]
    await fold.start()
    try:
        await _caught_up(fold, log_client)
        for _ in range(100):
            if fold.digest()[0] == backlog:
                break
            await asyncio.sleep(0.05)
        assert fold.digest()[0] == backlog  # the idle checkpoint, at the head
    finally:
        await fold.stop()
    behind = [seq for seq, catching_up in cuts if catching_up]
    assert behind, "the backlog was caught up before the head was known: no test"
    spaced = [b - a for a, b in zip([0, *behind], behind, strict=False)]
    assert min(spaced) >= 3_000, cuts  # by the count of events alone


async def test_a_timed_checkpoint_waits_while_the_pool_view_is_wanted(
    log_client: Log, tmp_path: Path
) -> None:
    """``cut_waits_for`` (the gateway's pool view, built or due) holds a timed
    checkpoint; it is cut within a second or so once the view no longer wants the loop."""
    await log_client.publish_many([worked(f"8.8.{i}.1") for i in range(50)])
    fold = FoldService(log_client, db=tmp_path / "p.duckdb", every_events=10**9, every_ms=10)
    wanted = [True]
    fold.cut_waits_for = lambda state: wanted[0]
    await fold.start()
    try:
        await _caught_up(fold, log_client)
        await asyncio.sleep(1.5)  # the idle checkpoints looked at least once
        assert fold.checkpointer.written == 0
        wanted[0] = False
        for _ in range(60):
            if fold.digest()[0] == 50:
                break
            await asyncio.sleep(0.05)
        assert fold.digest()[0] == 50
    finally:
        await fold.stop()
