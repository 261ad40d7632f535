"""DuckDB checkpoints through the writer process: committed, restorable, errors typed."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from eventlog.protocol import Message
from projections import Checkpointer, Folder, Store, StoreError, digest
from projections.store import Checkpoint
from projections.writer import NICE, ProcessWriter
from reducers import State
from reducers.state import TABLES
from tests.helpers import message, worked

T0 = 1_800_000_000_000


async def test_checkpointer_commits_through_the_child(tmp_path: Path) -> None:
    """Checkpoints commit through the writer child and restore to the same digest."""
    db = tmp_path / "p.duckdb"
    state = State()
    folder = Folder(state)
    cp = Checkpointer(db, every_events=10, every_ms=60_000)
    assert await cp.start() == 0
    for seq in range(1, 101):
        folder.apply([message(seq, T0 + seq, worked(f"8.8.8.{seq % 7 + 1}", latency_ms=seq))])
        await cp.maybe(state)
    await cp.flush(state)
    assert cp.last_written_seq == 100
    assert cp.written >= 10
    await cp.close()
    store = Store(db)
    restored = store.restore()
    store.close()
    assert restored.last_seq == 100
    assert digest(restored) == digest(state)
    again = Checkpointer(db)
    assert await again.start() == 100
    await again.close()


async def test_the_writer_child_runs_below_the_fold(tmp_path: Path) -> None:
    """The checkpoint writer is background work: its child runs ``NICE`` steps nicer
    than the process that folds, so where cores are few the fold and its requests go
    first."""
    writer = ProcessWriter(tmp_path / "p.duckdb")
    await writer.start()
    try:
        assert writer._proc is not None
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, writer._proc.pid) == min(19, mine + NICE)
    finally:
        await writer.close()


async def test_a_fold_stopped_while_a_checkpoint_waits_loses_no_row(tmp_path: Path) -> None:
    """A checkpoint that waits for the one in flight is cancelled (a fold stopped mid-
    wait): the write in flight goes on, the rows the cancelled one cut are still
    written, and the stop's flush commits the state with its digest."""
    import asyncio

    db = tmp_path / "p.duckdb"
    state = State()
    folder = Folder(state)
    cp = Checkpointer(db, every_events=1, every_ms=60_000)
    await cp.start()
    for seq in range(1, 20_001):  # a first write the child takes a while to commit
        folder.apply([message(seq, T0 + seq, worked(f"8.{seq // 250}.{seq % 250}.1"))])
    await cp.checkpoint(state)
    folder.apply([message(20_001, T0 + 20_001, worked("9.9.9.9"))])
    waiting = asyncio.create_task(cp.checkpoint(state))  # cuts 9.9.9.9, waits for the first
    for _ in range(100):  # until it has cut its rows and waits
        if not state.dirty["proxies"] and cp.written == 2:
            break
        await asyncio.sleep(0)
    assert cp.written == 2 and not state.dirty["proxies"]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await cp.flush(state)  # raised CancelledError when the wait cancelled the write
    assert cp.last_written_seq == 20_001
    await cp.close()
    store = Store(db)
    restored = store.restore()
    store.close()
    assert digest(restored) == digest(state)


async def test_a_replay_written_once_equals_one_checkpointed_on_the_way(tmp_path: Path) -> None:
    """A replay writes its file once, at the end, unless asked for checkpoints on the way;
    both files restore to the digest of the folded state, evictions included."""
    from projections.replay import replay
    from reducers.proxies import SWEEP_MS

    later = T0 + 3 * State().settings.proxy_ttl_s * 1000 + SWEEP_MS + 1
    msgs = [message(seq, T0 + seq, worked(f"8.8.{seq % 5}.{seq % 7 + 1}")) for seq in range(1, 90)]
    msgs += [message(90 + i, later + i, worked(f"9.9.9.{i + 1}")) for i in range(10)]

    async def batches() -> AsyncIterator[list[Message]]:
        for start in range(0, len(msgs), 9):
            yield msgs[start : start + 9]

    digests = []
    for name, every in (("once", None), ("on-the-way", 10)):
        folder = await replay(batches(), tmp_path / f"{name}.duckdb", every_events=every)
        store = Store(tmp_path / f"{name}.duckdb")
        restored = store.restore()
        store.close()
        assert restored.last_seq == 99
        assert len(restored.proxies) == 10  # the first 89 reports' proxies were evicted
        assert digest(restored) == digest(folder.state)
        digests.append(digest(restored))
    assert digests[0] == digests[1]


async def test_writer_that_cannot_open_its_file_fails_loudly(tmp_path: Path) -> None:
    """A writer that cannot open its file raises StoreError at start."""
    (tmp_path / "taken").write_text("not a duckdb file")
    cp = Checkpointer(tmp_path / "taken")
    with pytest.raises(StoreError, match="checkpoint writer"):
        await cp.start()
    await cp.close()


def test_evicted_proxies_are_deleted_from_the_file(tmp_path: Path) -> None:
    """A proxy dead for 3 TTLs leaves memory, and the next checkpoint deletes its row."""
    from projections.store import collect
    from reducers.proxies import SWEEP_MS

    state = State()
    folder = Folder(state)
    folder.apply([message(1, T0, worked("8.8.8.8")), message(2, T0, worked("8.8.4.4"))])
    store = Store(tmp_path / "p.duckdb")
    store.write(collect(state))
    later = T0 + 3 * state.settings.proxy_ttl_s * 1000 + SWEEP_MS + 1
    folder.apply([message(3, later, worked("8.8.4.4"))])
    assert ("8.8.8.8", 8080) not in state.proxies
    store.write(collect(state))
    restored = store.restore()
    store.close()
    assert set(restored.proxies) == {("8.8.4.4", 8080)}
    assert digest(restored) == digest(state)


@pytest.mark.parametrize("path", ["file", ":memory:"])
async def test_the_writer_keeps_the_digest_of_each_checkpoint(tmp_path: Path, path: str) -> None:
    """The digest the writer child keeps from the rows it is sent equals the digest
    computed from scratch at every checkpoint, evictions and restarts included (and with
    no database at all, as a gateway replica runs it)."""
    from reducers.proxies import SWEEP_MS

    db = tmp_path / "p.duckdb" if path == "file" else ":memory:"
    state = State()
    folder = Folder(state)
    cp = Checkpointer(db, every_events=1, every_ms=60_000)
    await cp.start()
    assert cp.digest == (0, digest(State()))
    seq = 0
    for step in range(40):
        seq += 1
        ts = T0 + step * 60_000
        if step == 30:  # past 3 TTLs of the first proxies: the sweep evicts them
            ts = T0 + 3 * state.settings.proxy_ttl_s * 1000 + 2 * SWEEP_MS
        folder.apply([message(seq, ts, worked(f"8.8.{step % 3}.{step % 11 + 1}", latency_ms=seq))])
        await cp.flush(state)
        assert cp.digest == (seq, digest(state)), step
    await cp.close()
    if path == "file":  # a new writer on the same file starts from the same digest
        again = Checkpointer(db)
        await again.start()
        assert again.digest == (seq, digest(state))
        await again.close()


@pytest.mark.parametrize("count", [0, 5, 15, 16, 5_001, 70_000])
async def test_a_cut_encoded_in_chunks_is_the_cut_encoded_at_once(count: int) -> None:
    """collect_async yields between chunks but sends exactly what collect would."""
    from projections.store import collect, collect_async

    def fresh() -> State:
        state = State()
        Folder(state).apply(
            [
                message(
                    i + 1,
                    T0 + i,
                    worked(f"8.{i >> 16}.{(i >> 8) & 255}.{i & 255 or 1}", i % 65535 + 1),
                )
                for i in range(count)
            ]
        )
        return state

    at_once, chunked = collect(fresh()), await collect_async(fresh())

    def joined(cp: Checkpoint) -> dict[str, bytes]:
        return {name: b"".join(cp.table(name)) for name in TABLES}

    assert joined(chunked) == joined(at_once) and chunked.rows == at_once.rows
