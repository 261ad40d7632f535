"""State snapshots: taken in steps, loaded back to the digest a full fold gives, refused
when damaged, forged or of another format."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

import events as ev
from eventlog.protocol import Span
from projections import Folder, digest, row_strings
from projections.rowsums import Counted
from projections.snapshot import (
    FORMAT,
    SnapshotError,
    StateSnapshot,
    load,
    peek,
    take,
)
from projections.snapshot_policy import Snapshots
from reducers import State
from reducers.state import ProxyRow
from tests.folded import FoldedLog
from tests.helpers import eid


def _log() -> FoldedLog:
    log = FoldedLog()
    for i in range(3_000):  # more than a step of rows
        log.report("w-own", f"45.{i // 250}.{i % 250}.7", at_s=i)
    for i in range(0, 3_000, 3):
        log.check(f"45.{i // 250}.{i % 250}.7", ok=i % 2 == 0, at_s=3_100 + i)
    src = ev.SourceAdded(id=eid(), agent="admin", at=0, url="http://198.51.100.7/l", url_id="u1")
    log.service(src, at_s=6_500)
    return log


def test_a_snapshot_loads_back_to_the_state_and_digest_a_fold_gives() -> None:
    """Every table, the meta (settings, marks, trust) and the digest come back; the
    loaded state folds on exactly as the original does."""
    log = _log()
    blob = take(log.state)
    fmt, seq, recorded = peek(blob)
    assert (fmt, seq, recorded) == (FORMAT, log.state.last_seq, digest(log.state))
    loaded = load(blob)
    assert digest(loaded) == digest(log.state)
    assert len(loaded.proxies) == len(log.state.proxies) == 3_000
    assert loaded.settings == log.state.settings and loaded.marks == log.state.marks
    # The derived counts, counted by the loader's child process: as the fold kept them.
    assert loaded.failing.buckets and loaded.composition.buckets == log.state.composition.buckets
    assert loaded.failing.buckets == log.state.failing.buckets
    assert loaded.by_ip == log.state.by_ip
    log.report("w-own", "45.99.0.7", at_s=7_000)  # one more observation, on both
    Folder(loaded).apply([log.messages[-1]])
    assert digest(loaded) == digest(log.state)


def test_loaded_rows_share_their_repeated_strings_and_are_the_folds_rows() -> None:
    """The loader makes each string of the rows' repeated fields once: two rows' agent
    and protocol are one object each, as in the fold that built them, and the rows are
    ``ProxyRow``s equal to the fold's, taken again to the same bytes. A snapshot whose
    list lacks a value, or that has none (written before the list), loads the same
    state plainly, each row with strings of its own."""
    log = _log()
    blob = take(log.state)
    loaded = load(blob)
    first, second = loaded.proxies[("45.0.0.7", 8080)], loaded.proxies[("45.0.1.7", 8080)]
    assert first.agents[0] == second.agents[0] == "w-own" and first.agents[0] is second.agents[0]
    assert first.proto is second.proto and first.protos[0] is second.proto
    assert {type(row) for row in loaded.proxies.values()} == {ProxyRow}
    assert loaded.proxies == log.state.proxies
    assert take(loaded) == blob
    snap = msgspec.msgpack.decode(blob, type=StateSnapshot)
    assert snap.strings == ["", "c-own", "http", "w-own"]
    # The summing child's columns of the composition share them as well.
    columns, shared = row_strings.decode_as(Counted, snap.tables["proxies"], snap.strings)
    assert shared and len(columns) == 3_000 and columns[0].proto is columns[1].proto
    for strings in ([], ["", "c-own", "http"]):
        plain = load(msgspec.msgpack.encode(msgspec.structs.replace(snap, strings=strings)))
        assert digest(plain) == digest(log.state) and plain.proxies == log.state.proxies
        first, second = plain.proxies[("45.0.0.7", 8080)], plain.proxies[("45.0.1.7", 8080)]
        assert first.agents[0] == second.agents[0] and first.agents[0] is not second.agents[0]


def test_a_damaged_or_forged_snapshot_is_refused() -> None:
    """A row changed under the recorded digest, a digest that is not the state's, a
    format this ppf does not read, and bytes that are not a snapshot: each refused."""
    log = _log()
    snap = msgspec.msgpack.decode(take(log.state), type=StateSnapshot)
    rows = msgspec.msgpack.decode(snap.tables["proxies"])
    rows[0]["latency_ema"] = 1.0  # one proxy's latency, changed
    tampered = msgspec.structs.replace(
        snap, tables={**snap.tables, "proxies": msgspec.Raw(msgspec.msgpack.encode(rows))}
    )
    with pytest.raises(SnapshotError, match="gives digest"):
        load(msgspec.msgpack.encode(tampered))
    forged = msgspec.structs.replace(snap, digest="0" * 64)
    with pytest.raises(SnapshotError, match="gives digest"):
        load(msgspec.msgpack.encode(forged))
    newer = msgspec.structs.replace(snap, format=FORMAT + 1)
    with pytest.raises(SnapshotError, match="format"):
        load(msgspec.msgpack.encode(newer))
    with pytest.raises(SnapshotError, match="not a snapshot"):
        load(b"\x92\x01\x02")


class _Store:
    """A snapshot store in memory: ``blobs`` by sequence; a blob that is an exception
    is raised by ``get`` (a fetch that failed)."""

    def __init__(self, blobs: dict[int, bytes | Exception]) -> None:
        self.blobs = blobs

    async def seqs(self) -> list[int]:
        return sorted(self.blobs)

    async def get(self, seq: int) -> bytes:
        blob = self.blobs[seq]
        if isinstance(blob, Exception):
            raise blob
        return blob

    async def span(self) -> Span:
        return Span(first_seq=1, last_seq=10_000, bytes=0, first_ts=0)


async def test_a_fold_starts_from_the_newest_snapshot_it_can_read_and_leaves_no_child() -> None:
    """The newest snapshot's fetch fails, the next is damaged: the third is loaded.
    Each try started a child to sum with (ahead of its fetch); none is left running."""
    log = _log()
    good = take(log.state)
    store = _Store({3: good, 5: b"\x92\x01\x02", 9: OSError("connection reset")})
    before = set(_children())
    loaded = await Snapshots(store).start_from(State())  # type: ignore[arg-type]
    assert loaded is not None and digest(loaded.state) == digest(log.state)
    assert set(_children()) == before
    store.blobs = {5: b"\x92\x01\x02", 9: OSError("connection reset")}
    assert await Snapshots(store).start_from(State()) is None  # type: ignore[arg-type]
    assert set(_children()) == before


def _children() -> list[str]:
    """This process's child processes, by pid, as the kernel lists them."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    return [pid for t in tasks.iterdir() for pid in (t / "children").read_text().split()]
