"""Deposits: stored through the gateway, read by key against the log's digest, folded
once whoever ingests them, poisoned after five failed reads, kept for reparse, retired
by retention, reconciled daily behind a flag (docs/architecture.md §2, §4).

Real parts (tests/seedbox.py): nats-server with its object store, the gateway app on a
port, the fold with its DuckDB file and the deposit ingest.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import msgspec
import pytest

import events as ev
from agents.gateway_client import GatewayClient
from eventlog import objects
from eventlog.client import fresh_id, now_ms
from eventlog.protocol import DepositError
from events.keys import page_key, seed_key
from ops.cli.seed import plan
from ops.nats.server import NatsServer
from projections.ingest import DepositIngest
from projections.live import FoldService
from reducers.deposits import ATTEMPTS
from tests.helpers import until
from tests.seedbox import deposit_box, source_lease


async def test_a_deposit_lost_behind_the_folds_back_is_poisoned_across_a_restart(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A page announced but not in the store (deleted behind the fold's back) is read
    five times, each recorded as DepositRejected, then poisoned; the fold and the ingest
    restart between attempts and the count goes on from the log."""
    async with deposit_box(nats_server, tmp_path, {}) as box:
        data = b"1.2.3.4:80\n"
        sha = hashlib.sha256(data).hexdigest()
        key = page_key(sha)
        await box.log.deposits.put(key, data)
        await box.log.deposits.delete(key)
        await box.ingest.stop()  # the first two attempts here, the rest after a restart
        box.ingest.sweep_s = 0.2
        await box.log.publish(
            ev.Deposited(
                id=fresh_id(), agent="admin", at=now_ms(), key=key, sha256=sha, bytes=len(data)
            )
        )
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        for _ in range(2):
            assert not await box.ingest.ingest(key)
        assert box.fold.state.deposits[key].attempts == 2
    async with deposit_box(nats_server, tmp_path, {}) as box:
        row = box.fold.state.deposits[key]
        assert await until(lambda: row.status == "poisoned", 20), row
        assert row.attempts == ATTEMPTS and row.reason.startswith("missing")
        assert box.ingest.rejected == ATTEMPTS - 2
        await asyncio.sleep(1)  # sweeps go on: a poisoned deposit is read no more
        assert box.ingest.rejected == ATTEMPTS - 2
        gets = box.log.deposits.ops
        assert gets.get("get.missing") == ATTEMPTS - 2 and "get.ok" not in gets


async def test_junk_under_another_range_or_a_pages_key_is_refused_and_the_honest_deposit_folded(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """An enrolled agent tries to store junk under a range it does not hold and under a
    page's key before the page; the gateway refuses both, and a Deposited it publishes
    for the other range is refused by the fold. The honest batch and page are folded."""
    agents = {"honest": "seed", "rogue": "seed", "w1": "worker"}
    async with deposit_box(nats_server, tmp_path, agents) as box:
        dump = b"8.8.8.8:3128\n9.9.9.9:8080\n"
        planned, _ = await plan(box.log, dump, "proxies", 1, 0)
        assert planned is not None
        assert await box.fold.wait_for(await box.log.head_seq(), 10)  # the plan, folded
        gw_honest = GatewayClient(box.gateway, box.tokens["honest"], "honest", tmp_path / "h.jsonl")
        gw_rogue = GatewayClient(box.gateway, box.tokens["rogue"], "rogue", tmp_path / "r.jsonl")
        gw_worker = GatewayClient(box.gateway, box.tokens["w1"], "w1", tmp_path / "w.jsonl")
        async with gw_honest, gw_rogue, gw_worker:
            (grant,) = await gw_honest.lease("seed", 1, 60)
            rng = grant.seed()
            key = seed_key(rng.plan, rng.range, rng.cursor)
            junk = b'{"start": 0, "next": 1, "worked": [["1.1.1.1", 80, "http"]]}'
            status, _ = await gw_rogue.deposit(key, junk)
            assert status == 403
            forged = ev.Deposited(
                id=fresh_id(), agent="rogue", at=now_ms(), lease=grant.lease, key=key,
                sha256=hashlib.sha256(junk).hexdigest(), bytes=len(junk), items=1, cursor=1,
            )  # fmt: skip
            assert await gw_rogue.publish([forged])
            honest = ev.wire.SeedBatch(start=rng.cursor, next=rng.cursor + 1)
            body = msgspec.json.encode(honest)
            status, sha = await gw_honest.deposit(key, body)
            assert status == 200
            announce = ev.Deposited(
                id=fresh_id(), agent="honest", at=now_ms(), lease=grant.lease, key=key,
                sha256=sha, bytes=len(body), items=1, cursor=rng.cursor + 1,
            )  # fmt: skip
            assert await gw_honest.publish([announce])
            page = b"<pre>5.6.7.8:1080</pre>"
            pkey = page_key(hashlib.sha256(page).hexdigest())
            status, _ = await gw_rogue.deposit(pkey, b"junk")
            assert status == 403
            status, psha = await gw_worker.deposit(pkey, page, await source_lease(box, gw_worker))
            assert status == 200
            await gw_worker.publish(
                [ev.Deposited(id=fresh_id(), agent="w1", at=now_ms(), key=pkey, sha256=psha,
                              bytes=len(page))]
            )  # fmt: skip
        state = box.fold.state
        assert await until(
            lambda: key in state.deposits and pkey in state.deposits and not state.pending_deposits,
            20,
        )
        assert state.deposits[key].agent == "honest" and state.deposits[key].status == "folded"
        assert state.deposits[pkey].status == "folded"
        assert state.agents["rogue"].rejected == 1
        assert state.leases[grant.target].cursor == rng.cursor + 1
        assert ("1.1.1.1", 80) not in state.proxies


async def test_a_seed_deposit_that_is_not_a_seed_batch_is_rejected_as_malformed(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A seed node stores bytes under its range's key that are no seed batch and announces
    them: the ingest reads them, cannot derive a check from them, and keeps each attempt
    in the log as a DepositRejected whose reason says ``malformed`` and why; no proxy."""
    async with deposit_box(nats_server, tmp_path, {"seed1": "seed"}) as box:
        planned, _ = await plan(box.log, b"8.8.8.8:3128\n", "proxies", 1, 0)
        assert planned is not None
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        async with GatewayClient(
            box.gateway, box.tokens["seed1"], "seed1", tmp_path / "s.jsonl"
        ) as gw:
            (grant,) = await gw.lease("seed", 1, 60)
            rng = grant.seed()
            key = seed_key(rng.plan, rng.range, rng.cursor)
            body = b"8.8.8.8:3128\n"  # the dump's line itself, not a batch of its checks
            status, sha = await gw.deposit(key, body)
            assert status == 200
            assert await gw.publish(
                [ev.Deposited(id=fresh_id(), agent="seed1", at=now_ms(), lease=grant.lease,
                              key=key, sha256=sha, bytes=len(body), items=1, cursor=rng.cursor + 1)]
            )  # fmt: skip
        rows = box.fold.state.deposits
        assert await until(lambda: key in rows and rows[key].attempts >= 1, 10)
        assert rows[key].reason.startswith("malformed: not a seed batch: "), rows[key].reason
        assert ("8.8.8.8", 3128) not in box.fold.state.proxies


async def test_reparse_extracts_again_from_a_deposited_page_fetching_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A page a worker deposited, from which an older extractor found nothing: reparse
    reads it by key (its source answers nobody), publishes the current extractor's
    Extracted for its source and plans the candidates the pool does not know; a second
    run adds nothing."""
    from agents.extract import EXTRACTOR
    from ops.cli.reparse import reparse

    async with deposit_box(nats_server, tmp_path, {"w1": "worker"}) as box:
        url = "http://203.0.113.9:8080/list.txt"  # TEST-NET: nothing answers there
        uid = ev.url_id(url)
        added = ev.SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=uid)
        await box.log.publish(added)
        page = b"<pre>1.2.3.4:8080\nsocks5://5.6.7.8:1080\n8.8.8.8:3128</pre>"
        sha = hashlib.sha256(page).hexdigest()
        gw = GatewayClient(box.gateway, box.tokens["w1"], "w1", tmp_path / "w.jsonl")
        async with gw:
            status, _ = await gw.deposit(page_key(sha), page, await source_lease(box, gw))
            assert status == 200
            known = ev.ProxyWorked(
                id=fresh_id(), agent="w1", at=now_ms(), ip="8.8.8.8", port=3128, proto="http",
                latency_ms=100, exit_ip="8.8.8.8",
            )  # fmt: skip
            old = ev.Extracted(
                id=fresh_id(), agent="w1", at=now_ms(), url_id=uid, content_hash=sha, count=0,
                extractor="older/0",
            )  # fmt: skip
            deposited = ev.Deposited(
                id=fresh_id(), agent="w1", at=now_ms(), key=page_key(sha), sha256=sha,
                bytes=len(page), items=0,
            )  # fmt: skip
            assert await gw.publish([known, old, deposited])
        state = box.fold.state
        assert await until(
            lambda: getattr(state.deposits.get(page_key(sha)), "status", "") == "folded", 20
        )
        assert ("8.8.8.8", 3128) in state.proxies and state.sources[uid].cur_candidates == 0
        done = await reparse(box.log, 1, size=10, lab=True)
        assert (done.pages, done.extracted, done.candidates, done.new) == (1, 1, 3, 2)
        assert done.unreadable == {} and done.unsourced == 0
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        assert state.sources[uid].cur_candidates == 3  # the reparse's Extracted was folded
        last = await box.log.last_event(f"ppf.source.{uid}")
        assert isinstance(last, ev.Extracted) and last.extractor == EXTRACTOR
        assert last.agent == "reparse" and last.count == 3
        planned = state.leases[f"{done.plan}-r0"]
        assert (planned.kind, planned.start, planned.end) == ("seed", 0, 1)
        seeds = sorted(t for t, r in state.leases.items() if r.kind == "seed")
        again = await reparse(box.log, 1, size=10, lab=True)
        assert again.plan == done.plan and again.new == 2
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        assert sorted(t for t, r in state.leases.items() if r.kind == "seed") == seeds
        assert state.sources[uid].cur_candidates == 3
        # Pages deposited before --since are left alone.
        later = await reparse(box.log, state.deposits[page_key(sha)].seq + 1, lab=True)
        assert (later.pages, later.extracted) == (0, 0)


async def test_a_deposit_whose_chunks_are_lost_is_a_failed_read_and_the_ingest_goes_on(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store lost the chunks of a deposit's object: its read gives up once no chunk has
    come for ``CHUNK_WAIT_S`` (a DepositError saying how many came), the attempt is kept
    in the log as a DepositRejected, and the ingest folds the other deposit meanwhile
    rather than waiting for the lost chunks for ever (a run of the seed-node
    test once saw every deposit pending and none read)."""
    monkeypatch.setattr(objects, "CHUNK_WAIT_S", 0.5)
    async with deposit_box(nats_server, tmp_path, {}) as box:
        await box.ingest.stop()
        torn, whole = b"1.2.3.4:80\n" * 40_000, b"5.6.7.8:80\n"  # 440 KB: four chunks
        keys = {}
        for data in (torn, whole):
            sha = hashlib.sha256(data).hexdigest()
            keys[data] = page_key(sha)
            await box.log.deposits.put(page_key(sha), data)
            await box.log.publish(
                ev.Deposited(
                    id=fresh_id(), agent="admin", at=now_ms(), key=page_key(sha), sha256=sha,
                    bytes=len(data),
                )
            )  # fmt: skip
        store = await box.log.js.object_store(objects.BUCKET)
        info = await store.get_info(keys[torn])
        stream, chunks = f"OBJ_{objects.BUCKET}", f"$O.{objects.BUCKET}.C.{info.nuid}"
        await box.log.js.purge_stream(stream, subject=chunks)
        t = asyncio.get_running_loop().time()
        with pytest.raises(DepositError, match=r"store: 0 chunks came, then none for 0\.5 s"):
            await box.log.deposits.get(keys[torn], hashlib.sha256(torn).hexdigest())
        assert asyncio.get_running_loop().time() - t < 5
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        box.ingest.sweep_s = 30.0  # one read of each here
        await box.ingest.start()
        rows = box.fold.state.deposits
        assert await until(lambda: rows[keys[whole]].status == "folded", 10), rows[keys[whole]]
        assert await until(lambda: rows[keys[torn]].attempts == 1, 10), rows[keys[torn]]
        assert rows[keys[torn]].status == "pending"  # swept again later, poisoned at five
        assert rows[keys[torn]].reason.startswith("store: 0 chunks came, then none")


async def test_the_ingest_never_lists_the_store_counted_by_the_server() -> None:
    """``ppf bench ingest``, small: no list of the bucket over idle sweeps or while
    deposits and retries go on, and reads equal deposits plus retries, as the server's
    API advisories tell it; the bench's own list at the end is seen (the count works)."""
    from ops.bench.ingest import bench_ingest
    from ops.bench.options import Ingest

    got = await bench_ingest(Ingest(sweeps=20, sweep_s=0.05, deposits=12, missing=2))
    assert got["idle"]["lists"] == 0 and got["idle"]["reads"] == 0, got
    assert got["busy"]["lists"] == 0, got
    assert got["busy"]["reads"] == got["expected_reads"] == 12 + 2 * ATTEMPTS, got
    assert got["statuses"] == {"folded": 12, "poisoned": 2}
    assert got["canary_lists_seen"] == 1


def test_retention_deletes_the_oldest_settled_deposits_as_a_prefix() -> None:
    """Past age or budget the oldest go first; a pending deposit stops the prefix; seed
    inputs are never retention's; what was deleted (up to a seq) is not counted again."""
    from projections.retention import expired
    from reducers.state import DepositRow

    def row(key: str, seq: int, at: int, size: int, status: str = "folded") -> DepositRow:
        return DepositRow(key=key, sha256="", bytes=size, seq=seq, at=at, status=status)

    rows = [
        row("input/a", 1, 0, 500),
        row("page/b", 2, 10, 100),
        row("p1/r0/0", 3, 20, 100, "poisoned"),
        row("page/c", 4, 30, 100),
        row("page/d", 5, 40, 100, "pending"),
        row("page/e", 6, 50, 100),
    ]
    keys = lambda got: [r.key for r in got]  # noqa: E731
    # By age: announced before 35 (b, p1, c); d is pending, so e waits behind it.
    assert keys(expired(rows, after_seq=0, cutoff_ms=35, max_bytes=10**9)) == [
        "page/b", "p1/r0/0", "page/c",
    ]  # fmt: skip
    # By budget: 500 bytes kept (inputs aside) over 300: the oldest until within it.
    assert keys(expired(rows, after_seq=0, cutoff_ms=0, max_bytes=300)) == ["page/b", "p1/r0/0"]
    # After seq 3 is gone already: the budget counts what is left.
    assert keys(expired(rows, after_seq=3, cutoff_ms=0, max_bytes=250)) == ["page/c"]
    assert keys(expired(rows, after_seq=0, cutoff_ms=0, max_bytes=10**9)) == []


async def test_retention_deletes_old_deposits_by_key_once_and_keeps_a_page_stored_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Three pages, room for two: the oldest is deleted from the store, by key; a
    restarted ingest (its mark in the data dir) deletes nothing again; the page stored
    and announced again is kept, and reparse counts a deleted page as gone."""
    from ops.cli.reparse import reparse
    from projections.ingest import DepositIngest, Retention

    mark = tmp_path / "deposits-retained.json"
    async with deposit_box(nats_server, tmp_path, {"w1": "worker"}) as box:
        await box.ingest.stop()
        pages = [f"<pre>203.0.113.{i}:8080</pre>".encode() * 20 for i in range(3)]
        keys = [page_key(hashlib.sha256(p).hexdigest()) for p in pages]
        budget = Retention(max_bytes=2 * len(pages[0]), mark=mark, every_s=0.2)
        ingest = DepositIngest(
            box.fold, box.log.deposits, poll_s=0.05, sweep_s=0.2, retention=budget
        )
        gw = GatewayClient(box.gateway, box.tokens["w1"], "w1", tmp_path / "w.jsonl")
        state = box.fold.state

        leases: list[str] = []

        async def deposit(page: bytes, key: str) -> None:
            leases[:] = leases or [await source_lease(box, gw)]  # one fetch's lease for all
            status, sha = await gw.deposit(key, page, leases[0])
            assert status == 200
            announce = ev.Deposited(
                id=fresh_id(), agent="w1", at=now_ms(), key=key, sha256=sha, bytes=len(page)
            )
            served = ev.Extracted(
                id=fresh_id(), agent="w1", at=now_ms(), url_id=ev.url_id("http://a.example/"),
                content_hash=sha, count=1,
            )  # fmt: skip
            assert await gw.publish([served, announce])

        async with gw:
            for page, key in zip(pages, keys, strict=True):
                await deposit(page, key)
            await ingest.start()
            folded = lambda: all(state.deposits[k].status == "folded" for k in keys)  # noqa: E731
            assert await until(lambda: all(k in state.deposits for k in keys) and folded(), 20)
            assert await until(lambda: ingest.deleted == 1, 10)
            await ingest.stop()
            assert ingest.deleted_through == state.deposits[keys[0]].seq
            with pytest.raises(DepositError):
                await box.log.deposits.get(keys[0], state.deposits[keys[0]].sha256)
            for key in keys[1:]:
                await box.log.deposits.get(key, state.deposits[key].sha256)
            deletes = box.log.deposits.ops.get("delete.ok", 0)
            again = DepositIngest(box.fold, box.log.deposits, retention=budget)
            assert again.deleted_through == ingest.deleted_through  # from the mark
            assert await again.retain() == 0
            assert box.log.deposits.ops.get("delete.ok", 0) == deletes
            gone = await reparse(box.log, 1)
            assert gone.gone == 1 and gone.unreadable == {}
            # Fetched again: stored and announced again, it is the newest and is kept;
            # the budget now takes the next oldest.
            await deposit(pages[0], keys[0])
            assert await until(lambda: state.deposits[keys[0]].seq > again.deleted_through, 10)
            assert await again.retain() == 1
            await box.log.deposits.get(keys[0], state.deposits[keys[0]].sha256)
            with pytest.raises(DepositError):
                await box.log.deposits.get(keys[1], state.deposits[keys[1]].sha256)


async def test_the_daily_reconcile_lists_once_a_day_and_reports_orphans_and_losses(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Behind its flag: one list of the bucket a day (the day kept across a restart),
    reporting a key stored but never announced and one folded that the store lost."""
    from projections.ingest import DepositIngest, Retention

    async with deposit_box(nats_server, tmp_path, {}) as box:
        orphan, lost = b"<pre>203.0.113.1:80</pre>", b"<pre>203.0.113.2:80</pre>"
        okey = page_key(hashlib.sha256(orphan).hexdigest())
        lkey = page_key(hashlib.sha256(lost).hexdigest())
        await box.log.deposits.put(okey, orphan)
        await box.log.deposits.put(lkey, lost)
        await box.log.publish(
            ev.Deposited(
                id=fresh_id(), agent="admin", at=now_ms(), key=lkey,
                sha256=hashlib.sha256(lost).hexdigest(), bytes=len(lost),
            )
        )  # fmt: skip
        state = box.fold.state
        assert await until(lambda: getattr(state.deposits.get(lkey), "status", "") == "folded", 10)
        await box.log.deposits.delete(lkey)
        daily = Retention(mark=tmp_path / "mark.json", reconcile_every_s=86_400)
        ingest = DepositIngest(box.fold, box.log.deposits, retention=daily)
        found = await ingest.reconcile()
        assert found is not None
        assert (found["orphan_keys"], found["missing_keys"]) == ([okey], [lkey])
        assert await ingest.reconcile() is None  # not due again today
        again = DepositIngest(box.fold, box.log.deposits, retention=daily)
        assert await again.reconcile() is None  # nor after a restart
        assert box.log.deposits.ops.get("list.ok") == 1
        off = DepositIngest(box.fold, box.log.deposits, retention=Retention())
        assert await off.reconcile() is None  # without the flag: never


async def test_a_ranges_batch_deposited_at_once_after_its_grant_is_stored(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A seed node deposits a range's first batch before the gateway's fold has applied
    the range's grant (a sure claim is answered once stored, gateway/leases.py): the
    gateway waits for the log's head as it is now and stores it, where it answered 403
    (seen once in a fresh-clone run); a caller that holds no lease on it is still
    refused."""
    async with deposit_box(nats_server, tmp_path, {"honest": "seed", "other": "seed"}) as box:
        planned, _ = await plan(box.log, b"8.8.8.8:3128\n9.9.9.9:1080\n", "proxies", 2, 0)
        assert planned is not None
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        await asyncio.sleep(0.3)  # the cached head is this head: the grant comes after it
        found = [ev.wire.SeedFound("8.8.8.8", 3128, "http", 120, "8.8.8.8", "elite")]
        body = msgspec.json.encode(ev.wire.SeedBatch(start=0, next=1, worked=found))
        gw = GatewayClient(box.gateway, box.tokens["honest"], "honest", tmp_path / "h.jsonl")
        other = GatewayClient(box.gateway, box.tokens["other"], "other", tmp_path / "o.jsonl")
        async with gw, other:
            await box.fold._cut.acquire()  # the fold applies nothing while this is held
            try:
                (grant,) = await gw.lease("seed", 1, 60)
                assert box.fold.applied_seq < grant.epoch  # answered before the fold saw it
                key = seed_key(grant.seed().plan, grant.seed().range, 0)
                asyncio.get_running_loop().call_later(0.3, box.fold._cut.release)
                status, _ = await gw.deposit(key, body)
            finally:
                await asyncio.sleep(0.4)
                assert not box.fold._cut.locked()
            assert status == 200
            assert (await other.deposit(key, body))[0] == 403


async def test_two_gateways_ingesting_one_deposit_put_one_copy_of_each_event_in_the_log(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Two folds with their ingests (two gateways) read the same seed batch at once:
    the log holds one ProxyWorked per working proxy and one DepositFolded."""
    async with deposit_box(nats_server, tmp_path, {"honest": "seed"}) as box:
        await box.ingest.stop()  # both ingests below, by hand, at the same moment
        other = FoldService(box.log, db=None)
        await other.start()
        try:
            planned, _ = await plan(box.log, b"8.8.8.8:3128\n9.9.9.9:1080\n", "proxies", 2, 0)
            assert planned is not None
            # The plan folded before a range is asked for (under load it could come after).
            assert await box.fold.wait_for(await box.log.head_seq(), 10)
            gw = GatewayClient(box.gateway, box.tokens["honest"], "honest", tmp_path / "h.jsonl")
            async with gw:
                (grant,) = await gw.lease("seed", 1, 60)
                rng = grant.seed()
                found = [
                    ev.wire.SeedFound("8.8.8.8", 3128, "http", 120, "8.8.8.8", "elite"),
                    ev.wire.SeedFound("9.9.9.9", 1080, "socks5", 90, "9.9.9.9", "elite"),
                ]
                body = msgspec.json.encode(ev.wire.SeedBatch(start=0, next=2, worked=found))
                key = seed_key(rng.plan, rng.range, 0)
                status, sha = await gw.deposit(key, body)
                assert status == 200
                announce = ev.Deposited(
                    id=fresh_id(), agent="honest", at=now_ms(), lease=grant.lease, key=key,
                    sha256=sha, bytes=len(body), items=2, cursor=2,
                )  # fmt: skip
                assert await gw.publish([announce])
            head = await box.log.head_seq()
            assert await box.fold.wait_for(head, 10) and await other.wait_for(head, 10)
            one = DepositIngest(box.fold, box.log.deposits)
            two = DepositIngest(other, box.log.deposits)
            assert await asyncio.gather(one.ingest(key), two.ingest(key)) == [True, True]
            head = await box.log.head_seq()
            assert await box.fold.wait_for(head, 10)
            said: list[ev.Event] = []
            async for batch in box.log.read(1, until=head):
                said += [ev.decode(payload) for _, _, _, payload in batch]
            derived = [e for e in said if e.id.startswith("dep:")]
            assert sorted((e.ip, e.agent) for e in derived if isinstance(e, ev.ProxyWorked)) == [
                ("8.8.8.8", "honest"), ("9.9.9.9", "honest"),
            ]  # fmt: skip
            assert len(derived) == 2
            assert sum(isinstance(e, ev.DepositFolded) for e in said) == 1
            assert box.fold.state.deposits[key].status == "folded"
            assert {("8.8.8.8", 3128), ("9.9.9.9", 1080)} <= set(box.fold.state.proxies)
        finally:
            await other.stop()
