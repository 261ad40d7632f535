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
the other core while this one decodes the rows and files them (``RowSums``): at a
million proxies they are 1.7 s and 0.85 s of the load. The child is started before the
snapshot is fetched, so its interpreter's start (0.3 s) is not on the way, and nothing
waits for it until the rows are decoded and filed by address.

Encoding is in steps (``taking``), as a checkpoint's cut is: the caller keeps the fold
from running until it is done, and the loop goes on between steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Generator
from typing import Any

import msgspec
import structlog

from projections import row_strings
from projections.core.digest import MOD, combine, meta_digest, row_hash, table_sum
from projections.log import SnapshotError
from projections.store import array_header, put_rows, restore_meta, state_meta
from projections.writer import read_frame
from reducers.indexes import reindex
from reducers.kept import ALWAYS
from reducers.pool import Composition, counted
from reducers.rows import decode_column, encode_column
from reducers.state import KEPT, TABLES, State
from reducers.steps import at_once

__all__ = [
    "FORMAT",
    "RowSums",
    "SnapshotError",
    "StateSnapshot",
    "load",
    "peek",
    "serve_sums",
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


class _Head(msgspec.Struct, kw_only=True):
    format: int
    seq: int
    digest: str


def taking(state: State) -> Generator[None, None, bytes]:
    """The snapshot of ``state`` as it is now, ``_STEP`` rows a step. Each row is encoded
    once: its bytes go into the table's array and its hash into the digest."""
    tables, sums, strings = {}, {}, set[str]()
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
            array = bytearray(packing.compress(array))
        for i in range(0, len(rows), _STEP):
            step = rows[i : i + _STEP]
            encoded = [_encode(r) for r in step]
            total += sum(map(row_hash, encoded))
            joined = b"".join(encoded)
            array += joined if packing is None else packing.compress(joined)
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


def load(blob: bytes | bytearray, sums: RowSums | None = None) -> State:
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
        state = _load(blob, sums)
        # What was made here is the state, which lives as long as the process: frozen
        # out of the collector's reach before it is let back (re-enabled with millions
        # of new tracked tuples, it ran a full collection of them at once, ~0.7 s).
        gc.freeze()
        return state
    finally:
        sums.close()
        if enabled:
            gc.enable()


def _load(blob: bytes | bytearray, sums: RowSums) -> State:
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
    sums.send(tables, snap.strings)  # the child unpacks what is packed on its side
    try:
        state = State()
        restore_meta(state, snap.meta)
        for table, raw in tables.items():
            if table == "proxies":  # the big one: its strings shared, no call a row
                proxies, shared = row_strings.decode(raw, snap.strings)
                if snap.strings and not shared:
                    log.warning("snapshot_strings_incomplete", seq=seq, rows=len(proxies))
                state.proxies = {(r.ip, r.port): r for r in proxies}
            else:
                put_rows(state, table, _rows(table, unpacked(raw)))
        if state.last_seq != seq:
            raise SnapshotError(f"snapshot of seq {seq} holds a state at {state.last_seq}")
        # Filed while the child may still be summing (at a million rows it is as slow
        # as the decode); the pool's composition is its count, set once it answered.
        reindex(state, counted=(Composition(), Composition()))
        summed, (state.composition, state.failing) = sums.result()
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"damaged snapshot: {exc}") from exc
    except zlib.error as exc:
        raise SnapshotError(f"damaged snapshot: a packed table: {exc}") from exc
    found = combine(summed, meta_digest(state))
    if found != snap.digest:
        raise SnapshotError(
            f"snapshot of seq {seq} gives digest {found[:12]}, not {snap.digest[:12]}"
        )
    return state


def _rows(table: str, raw: bytes | msgspec.Raw) -> list[Any]:
    try:
        return _DECODERS[table].decode(raw)
    except msgspec.DecodeError as exc:
        if table == "sites":  # SiteCells came after snapshots of a row per proxy and site
            raise SnapshotError(
                f"its sites are a row per proxy and site, as an earlier build kept them: {exc}"
            ) from exc
        raise


# Tables a snapshot keeps packed: a msgpack bin holding the zlib of the table's array,
# not the array. The site cells' columns (96 MB at 2,000,000 cells, reducers/rows.py
# SiteCells) pack to about a seventh, and a gateway fetches a snapshot through the object
# store at about 110 MB/s. The digest hashes the rows as ever, never the packing; a table
# with no rows is left out of a snapshot as before, so older snapshots keep their bytes.
PACKED = frozenset({"sites"})
_BIN = frozenset({0xC4, 0xC5, 0xC6})
_bin = msgspec.msgpack.Decoder(bytes).decode


def unpacked(raw: bytes | msgspec.Raw) -> bytes | msgspec.Raw:
    """A table's array, from how a snapshot keeps it (packed, or as it is)."""
    if len(raw) and memoryview(raw)[0] in _BIN:
        return zlib.decompress(_bin(raw))
    return raw


_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])
# The other tables' (the proxies' are row_strings.decode's).
_DECODERS = {
    table: msgspec.msgpack.Decoder(
        list[declared.row],  # type: ignore[name-defined]
        dec_hook=decode_column,
    )
    for table, declared in TABLES.items()
    if table != "proxies"
}
_FRAME = struct.Struct(">Q")
_SUMS_CHILD = "from projections.snapshot import serve_sums; serve_sums()"
_F_SETPIPE_SZ = 1031  # Linux's fcntl: a larger pipe, fewer wake-ups of the child


class _Counted(msgspec.Struct):
    """What ``reducers.pool.counted`` reads of a proxy row."""

    last_seen: int
    proto: str
    anonymity: str = ""
    country: str = ""
    fail_streak: int = 0


_STRINGS = msgspec.msgpack.Decoder(list[str])
_COUNTS = msgspec.msgpack.Decoder(tuple[list[Any], list[Any]])


class RowSums:
    """Each table's sum of row hashes (``projections/core/digest.py``) and the pool's
    composition, computed by a child process from the snapshot's own bytes while the
    caller decodes the rows. Started (``RowSums()``) before the snapshot is at hand, so
    the child's interpreter is up by then; ``send`` hands it the tables. A blocking
    write of a whole table holds no GIL (one ``os.write``, which releases it), so the
    child reads at memory speed while the decoding thread runs."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SUMS_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._sender: threading.Thread | None = None

    def send(self, tables: dict[str, msgspec.Raw], strings: list[str]) -> None:
        """Hand the child the tables and the snapshot's list of the rows' strings."""
        self._sender = threading.Thread(
            target=self._send, args=(tables, strings), name="ppf-snapshot-sums", daemon=True
        )
        self._sender.start()

    def _send(self, tables: dict[str, msgspec.Raw], strings: list[str]) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        fd = stdin.fileno()
        with contextlib.suppress(OSError):  # not Linux, or a lower limit: the default
            fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
        try:
            for frame in [msgspec.msgpack.encode(strings), *(tables[t] for t in TABLES)]:
                view = memoryview(frame)
                os.write(fd, _FRAME.pack(len(view)))
                while view:
                    view = view[os.write(fd, view) :]
        except OSError:
            pass  # the child is gone: result() says so
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def result(self) -> tuple[dict[str, int], tuple[Composition, Composition]]:
        """(each table's sum, the pool's (composition, failing))."""
        stdout = self._proc.stdout
        assert stdout is not None
        out = stdout.read()  # until the child ends
        if self._sender is not None:
            self._sender.join()
        code = self._proc.wait()
        head = 16 * len(TABLES)
        if code != 0 or len(out) <= head:
            raise SnapshotError(f"the snapshot's row sums were not computed (child exit {code})")
        sums = {t: int.from_bytes(out[16 * i : 16 * i + 16], "big") for i, t in enumerate(TABLES)}
        composition, failing = _COUNTS.decode(out[head:])
        return sums, (Composition.from_counts(composition), Composition.from_counts(failing))

    def close(self) -> None:
        """End the child, whatever happened (a decode failed before its result)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._sender is not None:
            self._sender.join()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def serve_sums() -> None:
    """The child of ``RowSums``: the snapshot's list of the rows' strings in, then a
    table's length and bytes in and its sum out, in ``TABLES`` order; then the proxies'
    composition and failing part as msgpack. The composition's columns share the
    list's strings as the loader's rows do, which saves 0.2 s of decoding and 0.15 s of
    counting at a million rows."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    pool: tuple[Composition, Composition] = (Composition(), Composition())
    head = read_frame(inp)
    if head is None:
        sys.exit(1)  # a short frame: the loader is gone, or gave up on us
    strings = _STRINGS.decode(head)
    for table in TABLES:
        blob = read_frame(inp)
        if blob is None:
            sys.exit(1)
        out.write(table_sum(_RAWS.decode(unpacked(blob))).to_bytes(16, "big"))
        if table == "proxies":
            pool = counted(row_strings.decode_as(_Counted, blob, strings)[0])
    out.write(msgspec.msgpack.encode((pool[0].counts(), pool[1].counts())))
    out.flush()
