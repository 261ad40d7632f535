"""Snapshots on a real nats-server: a fold takes them as it goes and trims the log behind
the oldest kept; a new fold starts from the newest and reaches the live digest; a fold
that would start on a gap refuses."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import objects
from eventlog.client import Log
from eventlog.protocol import GapError, SnapshotError
from ops.nats.server import NatsServer
from projections import digest
from projections.live import FoldService
from projections.snapshot import take
from projections.snapshot_policy import SnapshotPolicy, Snapshots
from reducers import State
from tests.folded import FoldedLog
from tests.helpers import worked


async def _publish(lg: Log, first: int, count: int) -> None:
    for i in range(first, first + count):
        await lg.publish(worked(f"45.1.{i // 200}.{i % 200 + 1}", latency_ms=10 + i % 50))


async def test_a_new_fold_starts_from_the_newest_snapshot_of_a_trimmed_log(
    log_client: Log,
) -> None:
    """Snapshots every 100 messages, two kept, the log trimmed behind the older: the
    stream then starts right after it. A new fold loads the newest, tails the rest and
    has the digest of the fold that saw every message from sequence 1, before and after
    more messages come; a fold with no snapshot to start from refuses the gap."""
    await _publish(log_client, 0, 450)
    policy = SnapshotPolicy(every_messages=100, every_s=3600, keep=2, trim=True)
    first = FoldService(log_client, snapshots=Snapshots(log_client.snapshots, policy))
    await first.start()
    try:
        assert await first.wait_for(450, 20)
        for _ in range(50):
            if first.snapshots is not None and first.snapshots.taken >= 3:
                break
            await asyncio.sleep(0.1)
        assert first.snapshots is not None
        assert await first.snapshot_now() == 450
        kept = await log_client.snapshots.seqs()
        assert len(kept) == 2 and kept[-1] == 450
        span = await log_client.snapshots.span()
        assert span.first_seq == kept[0] + 1 and span.last_seq == 450
        assert span.bytes > 0 and span.first_ts > 0

        await _publish(log_client, 450, 30)
        second = FoldService(log_client, snapshots=Snapshots(log_client.snapshots))
        await second.start()
        try:
            assert await second.wait_for(480, 20) and await first.wait_for(480, 20)
            assert second.folder.applied == 30  # the tail only: 451-480
            assert digest(second.state) == digest(first.state)
            assert (await second.checkpoint_now())[1] == (await first.checkpoint_now())[1]
        finally:
            await second.stop()

        lost = FoldService(log_client, snapshots=Snapshots(log_client.snapshots))
        for seq in await log_client.snapshots.seqs():
            await log_client.snapshots.drop(seq)
        with pytest.raises(GapError, match=r"the log starts at seq \d+, after this fold's seq 0"):
            await lost.start()
        blind = FoldService(log_client)  # no store to look in: the reader's gap stops it
        await blind.start()
        try:
            for _ in range(100):
                if not blind.running:
                    break
                await asyncio.sleep(0.05)
            assert not blind.running and blind.state.last_seq == 0
        finally:
            await blind.stop()
    finally:
        await first.stop()


async def test_a_fold_from_a_snapshot_writes_its_rows_as_stored_once_caught_up(
    log_client: Log, tmp_path: Path
) -> None:
    """Adopted from a snapshot, the first checkpoint writes the snapshot's rows as it
    stores them (no row is dirty, none cut again), then the tail's. With a checkpoint
    due after every message, it still waits until the tail the log held at the start
    is folded (a gateway is ready first), then has the live digest; and a fold that
    starts from that file alone, with no snapshot, has it too."""
    await _publish(log_client, 0, 3_000)
    first = FoldService(log_client, snapshots=Snapshots(log_client.snapshots))
    await first.start()
    try:
        assert await first.wait_for(3_000, 30)
        assert await first.snapshot_now() == 3_000
        await _publish(log_client, 3_000, 6_000)  # a tail the reader hands out in batches
        db = tmp_path / "second.duckdb"
        second = FoldService(
            log_client, db=db, every_events=1, snapshots=Snapshots(log_client.snapshots)
        )
        await second.start()
        try:
            assert not second.state.dirty["proxies"]  # the snapshot's rows go as stored
            assert await second.wait_for(9_000, 30) and second.folder.applied == 6_000
            assert second.checkpointer.written <= 2  # the snapshot's, the first cut
            assert await first.wait_for(9_000, 30)
            live = (await first.checkpoint_now())[1]
            assert (await second.checkpoint_now())[1] == live
        finally:
            await second.stop()
        third = FoldService(log_client, db=db)  # the file alone, restored, not started
        assert third.state.last_seq == 9_000
        assert digest(third.state) == digest(first.state)
    finally:
        await first.stop()


async def test_ppf_replay_from_a_snapshot_checks_itself_against_a_full_replay(
    log_client: Log, nats_server: NatsServer, tmp_path: Path
) -> None:
    """``ppf replay --from-snapshot``: the newest snapshot plus its tail gives the digest
    a replay from sequence 1 gives, checked in the same run while the log still starts
    at 1; ``ppf snapshot`` takes one at the head; once the log is trimmed there is no
    full replay to check against, and the digest is still the live fold's."""
    await _publish(log_client, 0, 250)
    policy = SnapshotPolicy(every_messages=100, every_s=3600, keep=2, trim=False)
    fold = FoldService(log_client, snapshots=Snapshots(log_client.snapshots, policy))
    await fold.start()
    try:
        assert await fold.wait_for(250, 20)
        await _publish(log_client, 250, 20)
        assert await fold.wait_for(270, 20)
        live = digest(fold.state)
    finally:
        await fold.stop()
    kept = await log_client.snapshots.seqs()
    assert kept and kept[-1] < 270

    def ppf(*argv: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv, "--nats", nats_server.url],
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return dict(json.loads(done.stdout.splitlines()[-1]))

    out = ppf("replay", "--db", str(tmp_path / "a.duckdb"), "--from-snapshot")
    assert out == {"seq": 270, "digest": live, "from_snapshot": kept[-1], "full_replay": live}
    taken = ppf("snapshot", "--keep-snapshots", "1", "--trim-log")
    assert taken == {"seq": 270, "digest": live, "kept": [270]}
    assert (await log_client.snapshots.span()).first_seq == 271
    out = ppf("replay", "--db", str(tmp_path / "b.duckdb"), "--from-snapshot")
    assert out == {"seq": 270, "digest": live, "from_snapshot": 270, "full_replay": None}
    for seq in await log_client.snapshots.seqs():  # an empty, trimmed log and no snapshot
        await log_client.snapshots.drop(seq)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ops.cli", "replay", "--db", str(tmp_path / "c.duckdb"),
         "--from-snapshot", "--nats", nats_server.url],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and b"the log starts at seq 271" in done.stderr


async def test_the_bucket_hands_back_what_it_was_given(log_client: Log) -> None:
    """Through the lean reader: a snapshot of several chunks, one of none, each checked
    against the object's own digest."""
    big = bytes(range(256)) * 12_000  # 3 MB: four 768 KiB chunks
    await log_client.snapshots.put(7, big)
    await log_client.snapshots.put(8, b"")
    assert await log_client.snapshots.get(7) == big
    assert await log_client.snapshots.get(8) == b""
    assert await log_client.snapshots.seqs() == [7, 8]


async def _lie_about(lg: Log, seq: int, lie: str) -> None:
    """Rewrite a kept snapshot's object meta (as anyone who can write the bucket could):
    another digest, or a size a byte short or long of its chunks."""
    name = f"{seq:012d}"
    store = await lg.js.object_store("ppf-snapshots")
    info = (await store.get_info(name)).as_dict()
    if lie == "digest":
        info["digest"] = "SHA-256=" + base64.urlsafe_b64encode(bytes(32)).decode()
    else:
        info["size"] += -1 if lie == "size_short" else 1
    subject = "$O.ppf-snapshots.M." + base64.urlsafe_b64encode(name.encode()).decode()
    await lg.js.publish(subject, json.dumps(info).encode(), headers={"Nats-Rollup": "sub"})


@pytest.mark.parametrize("lie", ["digest", "size_short", "size_long"])
async def test_the_bucket_refuses_an_object_that_is_not_what_its_meta_says(
    log_client: Log, lie: str
) -> None:
    """The read is refused as an unusable snapshot, never handed on as one."""
    await log_client.snapshots.put(9, bytes(range(256)) * 12_000)
    await _lie_about(log_client, 9, lie)
    with pytest.raises(SnapshotError, match=f"snapshot {9:012d}"):
        await log_client.snapshots.get(9)


async def test_a_fold_passes_over_a_snapshot_whose_object_lies_to_the_one_before(
    log_client: Log,
) -> None:
    """The newest snapshot's object is not what its meta says: the fold starts from the
    one before it, as from any unreadable snapshot, and does not fail to start."""
    log = FoldedLog()
    for i in range(50):
        log.report("w-own", f"45.7.0.{i + 1}", at_s=i)
    blob = take(log.state)
    await log_client.snapshots.put(1001, blob)
    await log_client.snapshots.put(1002, blob)
    await _lie_about(log_client, 1002, "digest")
    loaded = await Snapshots(log_client.snapshots).start_from(State())
    assert loaded is not None and digest(loaded.state) == digest(log.state)


async def test_an_object_missing_a_chunk_is_refused_not_waited_for(
    log_client: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bucket lost the last chunk of a snapshot's object: the read gives up once no
    chunk has come for ``CHUNK_WAIT_S`` and says how many came, and a fold starting from
    the snapshots passes over it, rather than waiting for the chunk for ever."""
    monkeypatch.setattr(objects, "CHUNK_WAIT_S", 0.5)
    blob = bytes(range(256)) * 12_000  # four chunks
    await log_client.snapshots.put(2001, blob)
    store = await log_client.js.object_store("ppf-snapshots")
    info = await store.get_info(f"{2001:012d}")
    last = await log_client.js.get_last_msg("OBJ_ppf-snapshots", f"$O.ppf-snapshots.C.{info.nuid}")
    await log_client.js.delete_msg("OBJ_ppf-snapshots", last.seq)
    t = asyncio.get_running_loop().time()
    with pytest.raises(SnapshotError, match=r"3 of its 4 chunks, then none for 0\.5 s"):
        await log_client.snapshots.get(2001)
    assert asyncio.get_running_loop().time() - t < 5
    log = FoldedLog()
    log.report("w-own", "45.7.1.1", at_s=1)
    await log_client.snapshots.put(2000, take(log.state))
    loaded = await asyncio.wait_for(Snapshots(log_client.snapshots).start_from(State()), 10)
    assert loaded is not None and digest(loaded.state) == digest(log.state)
