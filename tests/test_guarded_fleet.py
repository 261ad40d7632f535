"""A guarded fleet tried as an attacker would (restored from tests/test_probes.py at 3af57fd, which
the probe-budget tests took over): what a stranger or a consumer can still do, probed against
the real gateway and the real NATS with the tokens an operator hands out: every probe ends in
a 4xx, a 403 or a DLQ entry with its reason, and a replay of the log verifies against the
live digest after all of them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient

import events as ev
from eventlog.client import Log
from events.batches import group
from events.ids import uuid7
from events.mint import fresh_id, now_ms
from gateway.http import GatewayConfig
from ops.cli.admin import enroll
from ops.nats.server import NatsServer
from projections.live import FoldService
from tests.fleet import serving
from tests.helpers import clear_of_the_hour, dlq_messages
from tests.test_agent_identity import Agent, _me

OPERATOR = ("w-own", "c-own")
# Addresses a public proxy cannot have, and ports outside 1-65535: each once as ProxyWorked.
NOT_PROXIES = [
    ("8.8.8.8", 0, "port"),
    ("8.8.8.8", 70000, "port"),
    ("127.0.0.1", 8080, "ip"),
    ("::1", 8080, "ip"),
    ("::ffff:127.0.0.1", 8080, "ip"),
    ("10.0.0.1", 8080, "ip"),
    ("0.0.0.0", 8080, "ip"),
]
# Hosts that pass the address rules by their spelling alone.
SPELLED = [
    "http://127.0.0.1.nip.io/",
    "http://169.254.169.254.nip.io/",
    "http://[64:ff9b::7f00:1]/",
    "http://[2002:7f00:1::]/",
    "http://%31%32%37.0.0.1/",
    "http://a b.example/",
    "http://10-0-0-1.sslip.io/",
    "http://lvh.me/",
]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def _guarded(
    lg: Log, server: NatsServer, **settings: Any
) -> AsyncIterator[tuple[TestClient, FoldService, dict[str, str]]]:
    """The settings ``ppf up`` publishes (guarded included), the operator's worker and
    checker, an untested worker, a consumer and an admin; a gateway deciding logins."""
    base = ev.Settings(
        agent_subjects=True,
        trust=True,
        trusted_agents=OPERATOR,
        resend_window=512,
        batches=True,
        guarded=True,
    )
    config = ev.Configured(
        id=fresh_id(),
        agent="admin",
        at=now_ms(),
        settings=msgspec.structs.replace(base, **settings),
    )
    await lg.publish(config)
    tokens = {
        "w-own": await enroll(lg, "w-own", "worker"),
        "c-own": await enroll(lg, "c-own", "checker"),
        "w1": await enroll(lg, "w1", "worker"),
        "shop": await enroll(lg, "shop", "consumer"),
        "root": await enroll(lg, "root", "admin"),
    }
    async with serving(lg, GatewayConfig(agent_nats=server.agent_auth())) as (client, fold):
        yield client, fold, tokens


async def _say(lg: Log, event: ev.Event) -> None:
    """Publish as the agent it names would, on its own subjects (the service may)."""
    await lg.publish_raw(ev.agent_subject(event), ev.encode(event), msg_id=ev.agent_msg_id(event))


def _worked(agent: str, ip: str, port: int = 8080, **kw: Any) -> ev.ProxyWorked:
    return ev.ProxyWorked(
        id=fresh_id(),
        agent=agent,
        at=now_ms(),
        ip=ip,
        port=port,
        proto="http",
        latency_ms=100,
        **kw,
    )


async def _dlq(log_client: Log, fold: FoldService, since: int, count: int) -> list[str]:
    """The DLQ entries' subjects and reasons (``ppf.dlq.<reason> <why>``) from ``since``."""
    deadline = asyncio.get_running_loop().time() + 10
    while fold.dead_letters.sent < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    out = []
    for msg in await dlq_messages(log_client):  # those of what was refused from ``since``
        if msg.headers and int(msg.headers.get("Ppf-Seq", 0)) >= since:
            out.append(f"{msg.subject} {msg.headers['Ppf-Error']}")
    return out


async def _verified(
    ppf_bin: str, tmp_path: Path, client: TestClient, fold: FoldService, nats: str
) -> None:
    """``ppf replay --verify`` against the live gateway: the same digest."""
    await fold.checkpoint_now()  # the digest /v1/stats gives is a checkpoint's
    base = str(client.make_url("")).rstrip("/")
    db = str(tmp_path / "replay.duckdb")
    argv = [ppf_bin, "replay", "--db", db, "--verify", "--gateway", base, "--nats", nats]
    replay = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=120)
    assert replay.returncode == 0, replay.stderr.decode()[-2000:]


async def test_facts_the_fold_would_refuse_are_refused_at_both_doors(
    log_client: Log, nats_server: NatsServer, ppf_bin: str, tmp_path: Path
) -> None:
    """Ports outside 1-65535, addresses no public proxy has, an id ten years ahead, an
    id that is no UUIDv7, one in the prefix the fold derives, a round with one bad
    result, source URLs that only look public: over HTTP a 400 naming the index and the
    field, nothing published; over the agent's own NATS, stored, then each in the DLQ
    with its reason and counted in the agent's ``rejected``, which the agent itself
    reads with its skew and the last reason; the pool untouched; the agent not muted;
    the replay verifies. (The worker is one the operator trusts: an untested agent has
    no NATS login at all, tests/test_bounds.py.)"""
    trusted = (*OPERATOR, "w1")
    async with _guarded(log_client, nats_server, trusted_agents=trusted) as (client, fold, tokens):
        future = uuid7(now_ms() + 10 * 365 * 86_400_000, bytes(10))
        bad: list[tuple[ev.Event, str]] = [
            (_worked("w1", ip, port), field) for ip, port, field in NOT_PROXIES
        ]
        bad += [
            (msgspec.structs.replace(_worked("w1", "8.8.4.4"), id=future), "id"),
            (msgspec.structs.replace(_worked("w1", "8.8.4.4"), id="not-a-uuid"), "id"),
            (msgspec.structs.replace(_worked("w1", "8.8.4.4"), id="dep:x:1"), "id"),
        ]
        [round_] = group([_worked("w1", "9.9.9.9"), _worked("w1", "10.1.1.1")])
        bad.append((round_, "results[1].ip"))
        for event, field in bad:
            r = await client.post(
                "/v1/events",
                json={"events": [msgspec.to_builtins(event)]},
                headers=_auth(tokens["w1"]),
            )
            assert r.status == 400, event
            [error] = (await r.json())["errors"]
            assert (error["index"], error["field"]) == (0, field), (event, error)
        discovered = ev.Discovered(
            id=fresh_id(), agent="w1", at=now_ms(), parent="0123456789abcdef", urls=SPELLED[:1]
        )
        for url in SPELLED:
            r = await client.post(
                "/v1/sources", json={"urls": [url]}, headers=_auth(tokens["root"])
            )
            assert r.status == 400, url
        head = await log_client.head_seq()
        w1 = await Agent.connect((await _me(client, tokens["w1"]))["nats"], "w1")
        try:
            seqs = [await w1.publish(ev.agent_subject(e), e) for e, _ in bad]
            seqs.append(await w1.publish(ev.agent_subject(discovered), discovered))
            honest = _worked("w1", "8.8.4.4")  # after a future id: folded, not muted
            seqs.append(await w1.publish(ev.agent_subject(honest), honest))
        finally:
            await w1.close()
        assert await fold.wait_for(seqs[-1], 10)
        dlq = await _dlq(log_client, fold, head + 1, len(bad) + 1)
        assert len(dlq) == len(bad) + 1, dlq
        for (_, field), entry in zip(bad, dlq, strict=False):
            assert entry.startswith("ppf.dlq.invalid "), entry
            assert f"{field}:" in entry or f"{field.split('.')[0]}" in entry, (field, entry)
        assert "cannot be public" in dlq[-1]
        state = fold.state
        assert set(state.proxies) == {("9.9.9.9", 8080), ("8.8.4.4", 8080)}
        assert not state.sources
        rows = {a["name"]: a for a in (await (await client.get("/v1/agents")).json())["agents"]}
        assert rows["w1"]["rejected"] == len(bad) + 1
        me = await _me(client, tokens["w1"])
        assert me["rejected"] == len(bad) + 1 and me["last_refusal"].startswith("invalid")
        assert abs(me.get("skew_ms", 0)) < 5_000  # left out when 0
        await _verified(ppf_bin, tmp_path, client, fold, nats_server.url)


async def test_a_reissued_token_lets_an_agent_a_future_id_had_muted_recover(
    log_client: Log, nats_server: NatsServer
) -> None:
    """Before guarded (a log of the high-water mark), one id ten years ahead mutes its
    agent; once guarded, issuing its token again drops that id from its mark and its
    next observation is folded."""
    await log_client.publish(
        ev.Configured(
            id=fresh_id(),
            agent="admin",
            at=now_ms(),
            settings=ev.Settings(agent_subjects=True, trusted_agents=OPERATOR),
        )
    )
    await enroll(log_client, "w1", "worker")
    config = GatewayConfig(agent_nats=nats_server.agent_auth())
    async with serving(log_client, config) as (_, fold):
        future = uuid7(now_ms() + 10 * 365 * 86_400_000, bytes(10))
        for event in (
            msgspec.structs.replace(_worked("w1", "8.8.4.4"), id=future),
            _worked("w1", "8.8.8.8"),  # muted: at or below the high-water mark
        ):
            await _say(log_client, event)
        assert await fold.wait_for(await log_client.head_seq(), 10)
        assert ("8.8.8.8", 8080) not in fold.state.proxies
        guarded = msgspec.structs.replace(fold.state.settings, guarded=True)
        await log_client.publish(
            ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=guarded)
        )
        await enroll(log_client, "w1", "worker")  # issued again
        again = _worked("w1", "8.8.8.8")
        await _say(log_client, again)
        assert await fold.wait_for(await log_client.head_seq(), 10)
        assert ("8.8.8.8", 8080) in fold.state.proxies


async def _pool(log_client: Log, fold: FoldService, n: int) -> list[str]:
    """``n`` alive proxies the operator's worker confirmed, in rounds."""
    ips = [f"45.{60 + i // 250}.{i % 250}.1" for i in range(n)]
    for start in range(0, n, 500):
        for event in group([_worked("w-own", ip) for ip in ips[start : start + 500]]):
            await _say(log_client, event)
    assert await fold.wait_for(await log_client.head_seq(), 20)
    return ips


async def _served_at(
    client: TestClient, head: int, token: str | None = None, timeout_s: float = 35.0
) -> set[str]:
    """The addresses ``/v1/proxies`` serves once the query view has folded the log up to
    ``head`` (its seq leads the answer's ETag): an older view, still fresh by its age
    (gateway/queries.py, up to 30 s under load), would answer from before what the test
    just did."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        r = await client.get("/v1/proxies?limit=0", headers=_auth(token) if token else {})
        assert r.status == 200
        seq = int(r.headers["ETag"].strip('W/"').split(".")[0])
        if seq >= head:
            return {p["ip"] for p in (await r.json())["proxies"]}
        assert asyncio.get_running_loop().time() < deadline, f"the view stayed at {seq} < {head}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("size", [50, 5_000])
async def test_one_untested_consumer_cannot_empty_the_pool(
    log_client: Log, nats_server: NatsServer, size: int
) -> None:
    """A consumer reports every alive proxy failed: at most ``report_share`` (2 %) of the
    pool leaves alive for others (its hourly budget answers 429 past 100 reports); it is
    not served any it reported until a trusted check brings them back; each reported
    one is first in the checkers' queue."""
    async with _guarded(log_client, nats_server) as (client, fold, tokens):
        ips = await _pool(log_client, fold, size)
        assert len(await _served_at(client, await log_client.head_seq())) == size
        await clear_of_the_hour(45)  # the reports, and what they take, within one hour
        statuses = []
        for ip in ips:
            r = await client.post(
                f"/v1/proxies/{ip}:8080/report",
                json={"outcome": "failed"},
                headers=_auth(tokens["shop"]),
            )
            statuses.append(r.status)
        reported = [ip for ip, s in zip(ips, statuses, strict=True) if s == 200]
        assert set(statuses) <= {200, 429}
        assert len(reported) == min(size, 100)
        head = await log_client.head_seq()
        others = await _served_at(client, head)
        share = fold.state.settings.report_share
        assert size - len(others) <= int(share * size), (size, len(others))
        assert len(others) >= size - max(1, int(share * size))
        mine = await _served_at(client, head, tokens["shop"])
        assert not mine & set(reported)
        assert all(fold.state.proxies[(ip, 8080)].reported_at for ip in reported)
        # The operator's checker finds them working: served to the consumer again.
        for event in group([_worked("c-own", ip) for ip in reported]):
            await _say(log_client, event)
        assert await fold.wait_for(await log_client.head_seq(), 10)
        assert not fold.state.doubts
        # The query view follows the fold within a few times its build (gateway/queries.py).
        head = await log_client.head_seq()
        assert set(reported) <= await _served_at(client, head, tokens["shop"])
        assert len(await _served_at(client, head)) == size


async def test_a_trusted_consumer_takes_a_proxy_out_at_once_and_a_bare_report_only_queues_it(
    log_client: Log, nats_server: NatsServer
) -> None:
    """``ppf token trust`` makes a consumer the operator's: its failed report takes the
    proxy out of alive for everyone. A report without a token only moves a proxy up the
    checkers' queue, within a budget per address (429 past it)."""
    async with _guarded(log_client, nats_server, trusted_agents=(*OPERATOR, "shop")) as (
        client,
        fold,
        tokens,
    ):
        ips = await _pool(log_client, fold, 20)
        r = await client.post(
            f"/v1/proxies/{ips[0]}:8080/report",
            json={"outcome": "failed"},
            headers=_auth(tokens["shop"]),
        )
        assert r.status == 200 and (await r.json())["status"] == "suspect"
        bare = []
        for ip in ips[1:]:
            r = await client.post(f"/v1/proxies/{ip}:8080/report", json={"outcome": "failed"})
            bare.append(r.status)
        burst = int(GatewayConfig().anonymous_reports_burst)
        assert bare[:burst] == [200] * burst and 429 in bare[burst:]
        # The view that has folded the reports: one a moment older still serves ips[0].
        assert await _served_at(client, await log_client.head_seq()) == set(ips[1:])
        queued = [ip for ip, s in zip(ips[1:], bare, strict=False) if s == 200]
        assert all(fold.state.proxies[(ip, 8080)].reported_at for ip in queued)
        assert fold.state.agents["~anonymous"].counts["ProxyReported"] == len(queued)


async def test_stats_count_what_is_served_after_fabricated_reports(
    log_client: Log, nats_server: NatsServer
) -> None:
    """2,000 proxies an untested worker made up, beside 100 the operator's worker
    confirmed (one of them seen tampering): at one applied sequence, with the fold idle,
    /v1/stats' pool.alive is the count /v1/proxies serves; the unconfirmed and the mitm
    are on their own lines; the admin shows as the operator's."""
    async with _guarded(log_client, nats_server) as (client, fold, _):
        await _pool(log_client, fold, 100)
        tampering = _worked("w-own", "45.99.0.1", mitm=True)
        await _say(log_client, tampering)
        made_up = [_worked("w1", f"46.{i // 250}.{i % 250}.9") for i in range(2_000)]
        for event in group(made_up):
            await _say(log_client, event)
        assert await fold.wait_for(await log_client.head_seq(), 20)
        # The view follows the fold within about a second of its standing still (the
        # contract's /v1/stats row): asked until it holds the applied sequence.
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            stats = await (await client.get("/v1/stats")).json()
            pool = stats["pool"]
            if pool["seq"] == stats["applied_seq"] or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        served = await (await client.get("/v1/proxies?limit=0")).json()
        assert stats["applied_seq"] == stats["head_seq"] == pool["seq"]
        assert pool["alive"] == served["count"] == 100
        assert stats["proxies"]["alive"] == 100
        assert (pool["unconfirmed"], pool["mitm"]) == (2_000, 1)
        assert sum(pool["by_proto"].values()) == 100
        rows = {a["name"]: a for a in (await (await client.get("/v1/agents")).json())["agents"]}
        assert rows["root"]["trust"] == "trusted"


async def test_ppf_token_finds_the_nats_its_data_dir_listens_on(
    tmp_path: Path, ppf_bin: str
) -> None:
    """``ppf up --nats-listen`` on another port: ``ppf token issue`` run beside the same
    data dir reaches that server, not 127.0.0.1:4222."""
    from ops.nats.server import free_port

    server = NatsServer(tmp_path / "nats", port=free_port())
    await server.astart()
    try:
        argv = [ppf_bin, "token", "issue", "w9", "--role", "worker"]
        env = {**os.environ, "PPF_DATA": str(tmp_path)}
        out = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, timeout=60, env=env
        )
        assert out.returncode == 0, out.stderr.decode()[-1000:]
        assert len(out.stdout.strip()) >= 40  # the token, shown once
    finally:
        await server.astop()


def test_a_consumers_traffic_is_its_reports_and_never_a_check() -> None:
    """A consumer's round (the endpoint's outcomes of its traffic): a success confirms
    nothing (no new proxy, no fresher last_seen); a failure is its failed report (hidden
    from it, first in the queue); a bad result goes to the DLQ alone."""
    from events.batches import group as rounds
    from tests.folded import FoldedLog, ip
    from tests.helpers import eid

    log = FoldedLog(guarded=True)
    log.enrol("shop", "consumer")
    log.report("w-own", ip(1), at_s=1)
    seen = log.state.proxies[(ip(1), 8080)].last_seen
    results = [
        ev.ProxyWorked(
            id=eid(), agent="shop", at=0, ip=ip(1), port=8080, proto="http", latency_ms=5
        ),
        ev.ProxyWorked(
            id=eid(), agent="shop", at=0, ip=ip(2), port=8080, proto="http", latency_ms=5
        ),
        ev.ProxyFailed(id=eid(), agent="shop", at=0, ip=ip(1), port=8080, proto="http"),
        ev.ProxyFailed(id=eid(), agent="shop", at=0, ip="10.0.0.1", port=8080, proto="http"),
    ]
    [batch] = rounds(results, key="traffic")
    log.service(batch, at_s=5)
    state = log.state
    assert set(state.proxies) == {(ip(1), 8080)} and state.proxies[(ip(1), 8080)].last_seen == seen
    assert state.proxies[(ip(1), 8080)].reported_at > 0
    assert state.doubts["shop"] == {(ip(1), 8080)}
    counts = state.agents["shop"].counts
    assert (counts["Traffic.worked"], counts["Traffic.failed"]) == (2, 1)
    assert [reason for reason, _ in log.refused] == ["invalid"]
