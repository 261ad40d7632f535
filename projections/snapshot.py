"""Snapshots of the whole fold state at one sequence: what a new gateway or fold starts
from instead of sequence 1, and what lets the log be trimmed behind it.

Not the query snapshots of ``projections/core/poolview.py`` (copies of the pool for
``/v1/proxies``): a state snapshot is one msgpack document, ``StateSnapshot``, holding
the format version, the sequence, the digest of the state there (``projections/digest``:
the digest a full replay gives at that sequence), the checkpoint's meta
(``store.state_meta``), each table's rows as one msgpack array of their canonical
encodings, the very bytes a DuckDB checkpoint keeps, and the distinct strings the proxy
rows repeat, which the loader makes once (``projections/row_strings.py``). Loading
checks the format and recomputes the digest: a snapshot that does not give back its own
digest is refused.
The rows' hashes are summed, and the pool's composition counted, by a child process on
the other core while this one decodes the rows and files them
(``projections/rowsums.py``); nothing waits for it until the rows are decoded and filed
by address. A packed table (``PACKED``) is unpacked and summed on a thread of the
loader's own instead (``_Packed``).

Encoding is in steps (``taking``), as a checkpoint's cut is: the caller keeps the fold
from running until it is done, and the loop goes on between steps.
"""

from __future__ import annotations

import gc
import threading
import zlib
from collections.abc import Generator
from typing import Any, NamedTuple

import msgspec
import structlog

from eventlog.protocol import SnapshotError
from projections import row_strings
from projections.core.digest import MOD, combine, meta_digest, row_hash
from projections.rowsums import RowSums, array_sum
from projections.store import Checkpoint, array_header, put_rows, restore_meta, state_meta
from reducers.indexes import reindex
from reducers.kept import ALWAYS
from reducers.pool import Composition
from reducers.rows import decode_column, encode_column
from reducers.state import KEPT, TABLES, State
from reducers.steps import at_once

__all__ = [
    "FORMAT",
    "Loaded",
    "SnapshotError",
    "StateSnapshot",
    "load",
    "opened",
    "peek",
    "take",
    "taking",
]

log = structlog.get_logger("ppf.snapshots")

FORMAT = 1
_STEP = 1_000  # rows a step: ~3 ms of this machine to encode, hash and gather strings
_encode = msgspec.msgpack.Encoder(enc_hook=encode_column).encode


class StateSnapshot(msgspec.Struct, kw_only=True):
    format: int
    seq: int
    digest: str
    meta: dict[str, str]
    # Each table as one msgpack array of its rows (reducers/state.py), embedded as it is:
    # decoded, each is a view into the snapshot's bytes, not a copy of 500 MB.
    tables: dict[str, msgspec.Raw]
    # The distinct strings of the proxy rows' repeated fields, sorted: each is made once
    # when the rows are loaded (``projections/row_strings.py``). Not in the digest: a
    # list that lacks a value only costs the loader a plain decode. Older snapshots
    # have none, and older ppf passes over it.
    strings: list[str] = []
    # The bytes of each packed table's array (``PACKED``), unpacked: told the size up
    # front, zlib unpacks into one buffer, not into growing blocks joined at the end
    # (0.13 s against 0.22 s for 2,000,000 cells' 96 MB at 48 bytes a cell). A size
    # that is off only costs the growing; older snapshots have none.
    sizes: dict[str, int] = {}


class _Head(msgspec.Struct, kw_only=True):
    format: int
    seq: int
    digest: str


def taking(state: State) -> Generator[None, None, bytes]:
    """The snapshot of ``state`` as it is now, ``_STEP`` rows a step. Each row is encoded
    once: its bytes go into the table's array and its hash into the digest."""
    tables, sums, sizes, strings = {}, {}, {}, set[str]()
    for table, declared in TABLES.items():
        rows: list[Any] = list(getattr(state, table).values())
        if not rows and declared.digest != ALWAYS:
            sums[table] = 0  # a later table, left out while empty: older snapshots' bytes
            continue
        # Grown a step at a time, not joined at the end: a join and its header's
        # concatenation are two more copies of the whole in one step
        # (docs/decisions.md, Snapshots).
        array, total = bytearray(array_header(len(rows))), 0
        packing = zlib.compressobj(1) if table in PACKED else None
        if packing is not None:
            sizes[table] = len(array)
            array = bytearray(packing.compress(array))
        for i in range(0, len(rows), _STEP):
            step = rows[i : i + _STEP]
            encoded = [_encode(r) for r in step]
            total += sum(map(row_hash, encoded))
            joined = b"".join(encoded)
            if packing is None:
                array += joined
            else:
                array += packing.compress(joined)
                sizes[table] += len(joined)
            if table == "proxies":
                row_strings.gather(strings, step)
            yield
        if packing is not None:
            array = bytearray(_encode(bytes(array + packing.flush())))  # a msgpack bin
        tables[table] = msgspec.Raw(array)
        sums[table] = total % MOD
    meta = state_meta(state)
    for piece in KEPT:  # pieces added later: left out while empty (older snapshots' bytes)
        if piece.later and not getattr(state, piece.name):
            del meta[piece.name]
    snap = StateSnapshot(
        format=FORMAT,
        seq=state.last_seq,
        digest=combine(sums, meta["meta_digest"]),
        meta=meta,
        tables=tables,
        strings=sorted(strings),
        sizes=sizes,
    )
    return _encode(snap)


def take(state: State) -> bytes:
    """``taking`` at once (tests)."""
    return at_once(taking(state))


def peek(blob: bytes | bytearray) -> tuple[int, int, str]:
    """(format, seq, digest) of a snapshot, without decoding its rows."""
    try:
        head = msgspec.msgpack.decode(blob, type=_Head)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"not a snapshot: {exc}") from exc
    return head.format, head.seq, head.digest


class Loaded(NamedTuple):
    """A snapshot opened: its state, and that state as a checkpoint of a fresh file
    whose tables are the snapshot's own arrays of row bytes (``cut``): a fold that
    starts from it writes them as they are, with no cut of every row on its loop
    (encoding what was just decoded held a gateway's loop for a second at 2,000,000
    site cells, in 2 ms steps, its requests answered in 5 ms each meanwhile)."""

    state: State
    cut: Checkpoint


def load(blob: bytes | bytearray, sums: RowSums | None = None) -> State:
    """``opened``'s state."""
    return opened(blob, sums).state


def opened(blob: bytes | bytearray, sums: RowSums | None = None) -> Loaded:
    """The state a snapshot holds, checked: its format is this ppf's, and its rows, as
    the bytes they are stored as (each row's canonical encoding: what the digest hashes),
    sum to the digest it recorded with its meta. Hashing the stored bytes rather than
    encoding the decoded rows again saves a second of a million rows; the bytes are
    the object store's, whose SHA-256 it checks, and only the service's login writes
    the bucket. The collector is held off meanwhile: a million rows' tuples would cost
    it hundreds of young collections, and the serving process freezes them after.
    ``sums``: the child to count with, started ahead (one is started here otherwise);
    it is ended either way."""
    sums = sums if sums is not None else RowSums()
    enabled = gc.isenabled()
    gc.disable()
    try:
        loaded = _load(blob, sums)
        # What was made here is the state, which lives as long as the process: frozen
        # out of the collector's reach before it is let back (re-enabled with millions
        # of new tracked tuples, it ran a full collection of them at once, ~0.7 s).
        gc.freeze()
        return loaded
    finally:
        sums.close()
        if enabled:
            gc.enable()


def _load(blob: bytes | bytearray, sums: RowSums) -> Loaded:
    # One pass over the document, not a peek at its head first: finding the head's
    # fields walks the whole document as surely as decoding it does.
    try:
        snap = msgspec.msgpack.decode(blob, type=StateSnapshot)
    except msgspec.DecodeError as exc:
        fmt, _, _ = peek(blob)  # another format may not decode as this one: say which
        if fmt != FORMAT:
            raise SnapshotError(f"snapshot format {fmt}, this ppf reads {FORMAT}") from exc
        raise SnapshotError(f"damaged snapshot: {exc}") from exc
    if snap.format != FORMAT:
        raise SnapshotError(f"snapshot format {snap.format}, this ppf reads {FORMAT}")
    seq = snap.seq
    tables = {table: snap.tables.get(table, msgspec.Raw(b"\x90")) for table in TABLES}
    packed = _Packed(tables, snap.sizes)
    sums.send({t: raw for t, raw in tables.items() if t not in PACKED}, snap.strings)
    try:
        state = State()
        restore_meta(state, snap.meta)
        for table in TABLES:
            if table == "proxies":  # the big one: its strings shared, no call a row
                proxies, shared = row_strings.decode(tables[table], snap.strings)
                if snap.strings and not shared:
                    log.warning("snapshot_strings_incomplete", seq=seq, rows=len(proxies))
                state.proxies = {(r.ip, r.port): r for r in proxies}
            else:
                raw = packed[table] if table in PACKED else tables[table]
                put_rows(state, table, _rows(table, raw))
        if state.last_seq != seq:
            raise SnapshotError(f"snapshot of seq {seq} holds a state at {state.last_seq}")
        # Filed while the child may still be summing (at a million rows it is as slow
        # as the decode); the pool's composition is its count, set once it answered.
        reindex(state, counted=(Composition(), Composition()))
        summed, (state.composition, state.failing) = sums.result()
        summed |= packed.sums()
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"damaged snapshot: {exc}") from exc
    except zlib.error as exc:
        raise SnapshotError(f"damaged snapshot: a packed table: {exc}") from exc
    found = combine(summed, meta_digest(state))
    if found != snap.digest:
        raise SnapshotError(
            f"snapshot of seq {seq} gives digest {found[:12]}, not {snap.digest[:12]}"
        )
    meta = state_meta(state)
    arrays = {t: [memoryview(packed[t] if t in PACKED else tables[t])] for t in TABLES}
    rows = sum(len(getattr(state, table)) for table in TABLES)
    cut = Checkpoint(seq, meta, rows=rows, meta_digest=meta["meta_digest"], parts=arrays)
    return Loaded(state, cut)


class _Packed:
    """The tables a snapshot keeps packed, unpacked and then summed on a thread of the
    loader's own: zlib and blake2b let go of the GIL over buffers this large, so the
    unpacking runs beside the decoding of the rows before them, and the summing beside
    the decoding of their own; the bytes never cross to the child. Unpacked by both
    sides and piped to the child, 2,000,000 cells' 96 MB (48 bytes a cell) were the
    start's longest path."""

    def __init__(self, raws: dict[str, msgspec.Raw], sizes: dict[str, int]) -> None:
        self._raws = {table: raws[table] for table in TABLES if table in PACKED}
        self._sizes = sizes
        self._unpacked: dict[str, bytes | msgspec.Raw] = {}
        self._sums: dict[str, int] = {}
        self._error: Exception | None = None
        self._ready = threading.Event()  # every packed table unpacked, or an error
        self._thread = threading.Thread(target=self._unpack, name="ppf-snapshot-unpack")
        self._thread.start()

    def _unpack(self) -> None:
        try:
            for table, raw in self._raws.items():
                self._unpacked[table] = unpacked(raw, self._sizes.get(table, 0))
            self._ready.set()
            for table, rows in self._unpacked.items():
                self._sums[table] = array_sum(rows)
        except (zlib.error, msgspec.DecodeError) as exc:
            self._error = exc  # raised where the loader reads it
        finally:
            self._ready.set()

    def __getitem__(self, table: str) -> bytes | msgspec.Raw:
        """A packed table's array, unpacked."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._unpacked[table]

    def sums(self) -> dict[str, int]:
        """Their sums, once computed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sums


def _rows(table: str, raw: bytes | msgspec.Raw) -> list[Any]:
    try:
        return _DECODERS[table].decode(raw)
    except msgspec.DecodeError as exc:
        if table == "sites":  # SiteCells, as they are now, came after other forms
            raise SnapshotError(f"its sites are kept as an earlier build kept them: {exc}") from exc
        raise


# Tables a snapshot keeps packed: a msgpack bin holding the zlib of the table's array,
# not the array. The site cells' columns (66 MB at 2,000,000 cells, reducers/rows.py
# SiteCells) pack to about a seventh, and a gateway fetches a snapshot through the object
# store at about 110 MB/s. The digest hashes the rows as ever, never the packing; a table
# with no rows is left out of a snapshot as before, so older snapshots keep their bytes.
PACKED = frozenset(name for name, declared in TABLES.items() if declared.packed)
_BIN = frozenset({0xC4, 0xC5, 0xC6})
_bin = msgspec.msgpack.Decoder(bytes).decode


def unpacked(raw: bytes | msgspec.Raw, size: int = 0) -> bytes | msgspec.Raw:
    """A table's array, from how a snapshot keeps it (packed, or as it is); ``size``:
    its bytes unpacked, when the snapshot says (``StateSnapshot.sizes``)."""
    if len(raw) and memoryview(raw)[0] in _BIN:
        return zlib.decompress(_bin(raw), bufsize=max(size, zlib.DEF_BUF_SIZE))
    return raw


# The other tables' (the proxies' are row_strings.decode's).
_DECODERS = {
    table: msgspec.msgpack.Decoder(
        list[declared.row],  # type: ignore[name-defined]
        dec_hook=decode_column,
    )
    for table, declared in TABLES.items()
    if table != "proxies"
}
