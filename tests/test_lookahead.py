"""The look-ahead (gateway/lookahead.py): while the fold is far behind the log, a grant
claims only targets the log has never leased, as the server's index of subjects says.
A projection that far behind shows free targets that another gateway has leased since;
each claim on one was refused by the server, and only after it had loaded the block
holding the subject's last message."""

from __future__ import annotations

import asyncio
import time

import nats.errors

from eventlog.client import Log, fresh_id, now_ms
from events import Heartbeat, Leased, Released
from gateway.commands import GRANTER
from gateway.http import GatewayConfig
from gateway.lookahead import FRESH_S, Lookahead
from ops.cli import enroll
from projections.live import LAG_BOUND, FoldService
from tests.fleet import serving


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def caught_up(fold: FoldService, lg: Log) -> None:
    assert await fold.wait_for(await lg.head_seq(), 10)


def claim(target: str, agent: str = "w2") -> Leased:
    """A claim made by another gateway for its agent."""
    lease = fresh_id()
    return Leased(
        id=lease, agent=agent, at=now_ms(), lease=lease, kind="source", target=target, ttl_s=600
    )


async def test_a_gateway_far_behind_claims_only_targets_the_log_has_not_moved(
    log_client: Log,
) -> None:
    """Six sources; two of them leased and released earlier, then, while this gateway's
    fold is held more than ``LAG_BOUND`` messages behind, another gateway leases one of
    those and one never leased before. Asked for six, this gateway grants the three
    never leased, claims nothing else (no claim refused, none on a target with a lease
    behind it), and once its fold has caught up grants the one released earlier and
    left alone; the ledger agrees."""
    tokens = {
        "admin": await enroll(log_client, "root", "admin"),
        "w1": await enroll(log_client, "w1", "worker"),
    }
    await enroll(log_client, "w2", "worker")
    config = GatewayConfig(rate_per_s=1000, burst=1000)
    async with serving(log_client, config) as (client, fold):
        urls = [f"http://lists.example/ahead-{i}.txt" for i in range(6)]
        r = await client.post("/v1/sources", json={"urls": urls}, headers=auth(tokens["admin"]))
        assert r.status == 200
        await caught_up(fold, log_client)
        targets = sorted(fold.state.sources)
        earlier = targets[:2]  # leased and released before
        for target in earlier:
            leased = claim(target)
            await log_client.publish(leased, expected_last_subject_seq=0)
            done = Released(
                id=fresh_id(), agent="w2", at=now_ms(), lease=leased.lease, target=target,
                outcome="done", kind="source",
            )  # fmt: skip
            await log_client.publish(done)
        await caught_up(fold, log_client)
        assert all(fold.state.leases[t].subject_seq > 0 for t in earlier)
        moved = {earlier[0], targets[2]}  # one with a row, one the projection never saw leased
        granter = client.app[GRANTER]
        async with fold._cut:  # the fold applies nothing while this is held
            for target in sorted(moved):
                row = fold.state.leases.get(target)
                await log_client.publish(
                    claim(target), expected_last_subject_seq=row.subject_seq if row else 0
                )
            beats = [
                Heartbeat(id=fresh_id(), agent="w2", at=now_ms()) for _ in range(LAG_BOUND + 1)
            ]
            await log_client.publish_many(beats)
            head = await log_client.head_seq()
            deadline = time.monotonic() + 5
            while await fold.head_seq() < head and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # its cached head is read every 250 ms
            assert await fold.head_seq() - fold.applied_seq > LAG_BOUND
            granted: set[str] = set()
            body = {"agent": "w1", "kind": "source", "count": 6, "ttl_s": 600}
            deadline = time.monotonic() + 10
            while len(granted) < 3 and time.monotonic() < deadline:
                r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
                assert r.status == 200
                granted |= {g["target"] for g in (await r.json())["leases"]}
                await asyncio.sleep(0.1)
            assert granted == set(targets) - moved - set(earlier)
            assert granter.lost == 0  # no claim refused: none was made on a moved subject
            assert granter.lookahead.passed_over >= 1  # targets[2], seen held in the index
            assert fold.applied_seq < head  # all of it while the fold was behind
        await caught_up(fold, log_client)
        r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
        assert {g["target"] for g in (await r.json())["leases"]} == {earlier[1]}
        await caught_up(fold, log_client)
        holders = {t: fold.state.leases[t].holder for t in targets}
        assert holders == {t: "w2" if t in moved else "w1" for t in targets}
        assert granter.lost == 0
        r = await client.get("/v1/stats", headers=auth(tokens["admin"]))
        grants = (await r.json())["grants"]
        assert grants["looked_up"] >= 4 and grants["passed_over"] >= 1  # said where seen


def test_a_lookup_vouches_only_for_a_subject_without_messages_for_a_while() -> None:
    """Confirmed: looked up a moment ago and found without a message, for a projection
    that has applied none on it. Moved: found with one the projection has not applied.
    A subject the projection has seen a message on is neither: only the fold can say."""
    ahead = Lookahead()
    ahead.note("ppf.lease.source.a", False)
    ahead.note("ppf.lease.source.b", True)
    now = time.monotonic()
    assert ahead.confirmed("ppf.lease.source.a", 0, now)
    assert not ahead.moved("ppf.lease.source.a", 0)
    assert not ahead.confirmed("ppf.lease.source.a", 0, now + FRESH_S)
    assert ahead.moved("ppf.lease.source.b", 0)
    assert not ahead.confirmed("ppf.lease.source.b", 0, now)
    for subject in ("ppf.lease.source.a", "ppf.lease.source.b"):
        assert not ahead.moved(subject, 17) and not ahead.confirmed(subject, 17, now)
    assert not ahead.moved("ppf.lease.source.c", 0)
    assert not ahead.confirmed("ppf.lease.source.c", 0, now)
    ahead.forget_old(now + 1e6)
    assert len(ahead) == 0


async def test_a_grant_never_asks_nats_for_the_head_itself(log_client: Log) -> None:
    """Whether the fold is far behind is judged from the head as last read: while NATS
    cannot say (a node killed, a leader being elected) and that reading grows old, a
    grant still answers from its claims; it answered 500 when it asked for the head."""
    tokens = {
        "admin": await enroll(log_client, "root", "admin"),
        "w1": await enroll(log_client, "w1", "worker"),
    }
    config = GatewayConfig(rate_per_s=1000, burst=1000)
    async with serving(log_client, config) as (client, fold):
        r = await client.post(
            "/v1/sources",
            json={"urls": ["http://lists.example/head.txt"]},
            headers=auth(tokens["admin"]),
        )
        assert r.status == 200
        await caught_up(fold, log_client)

        async def no_answer() -> int:
            raise nats.errors.NoRespondersError

        log_client.head_seq = no_answer  # type: ignore[method-assign]
        fold._head = (time.monotonic() - 60, fold._head[1])  # read a minute ago
        body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60}
        r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
        assert r.status == 200
        assert len((await r.json())["leases"]) == 1
