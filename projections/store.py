"""DuckDB checkpoints of the projections: the only module that imports duckdb.

A checkpoint writes the rows changed since the last one and ``last_seq`` in one
transaction (the position is stored with the data), so a crash at any point
leaves the file at some earlier checkpoint, from which the fold resumes at
``last_seq + 1`` and double-counts nothing.

Each row is kept whole as its canonical msgpack (a BLOB) beside a few plain columns
for SQL, so a restore rebuilds exactly the Struct that was written, floats included.
msgpack, not JSON (docs/decisions.md, The fold). ``executemany`` upserts crawl;
appender upserts are fast, and a duplicate key inside one flush silently keeps the
first row, so every batch here carries each key once (the dirty sets guarantee it).
"""

from __future__ import annotations

import threading
import typing
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from projections.core.digest import DigestKeeper, meta_digest
from projections.foreground import Foreground, give_way
from reducers.indexes import reindex
from reducers.kept import Table
from reducers.rows import decode_column, encode_column
from reducers.state import DIRTY, KEPT, TABLES, WHOLE, ProxyKey, ProxyRow, State

__all__ = [
    "DDL",
    "Checkpoint",
    "Store",
    "StoreError",
    "array_header",
    "collect",
    "collect_async",
    "keep_digest",
    "put_back",
    "put_rows",
    "restore_meta",
    "state_meta",
]

SCHEMA_VERSION = "1"

# A column's SQL type by its field's type; a port fits in 32 bits, as the first files
# declared it.
_SQL = {str: "VARCHAR", int: "BIGINT"}
_NARROW = {"port": "INTEGER"}


def _ddl(name: str, declared: Table) -> str:
    """A table's DuckDB declaration: its key, its plain columns, the row's bytes."""
    hints = typing.get_type_hints(declared.row)
    keyed = len(declared.key) == 1
    cols = []
    for col in (*declared.key, *declared.columns):
        sql = _NARROW.get(col) or _SQL[hints[col]]
        if col in declared.key:
            sql += " PRIMARY KEY" if keyed else " NOT NULL"
        cols.append(f"{col} {sql}")
    cols.append("row BLOB NOT NULL")
    if not keyed:
        cols.append(f"PRIMARY KEY ({', '.join(declared.key)})")
    return f"CREATE TABLE IF NOT EXISTS {name} (\n    {', '.join(cols)});\n"


DDL = "".join(_ddl(name, declared) for name, declared in TABLES.items()) + (
    "CREATE TABLE IF NOT EXISTS meta (k VARCHAR PRIMARY KEY, v VARCHAR NOT NULL);\n"
)

_encode = msgspec.msgpack.Encoder(enc_hook=encode_column).encode
_json = msgspec.json.Encoder().encode


class StoreError(RuntimeError):
    """The DuckDB file cannot be used (another schema, another writer, corruption)."""


class Checkpoint(msgspec.Struct):
    """Rows changed since the last checkpoint, encoded at the cut, detached from the state.

    Rows are encoded when collected (on the fold's thread), never later: the fold goes
    on mutating them, and a checkpoint must hold exactly the state at ``last_seq``.
    One msgpack array per table, so the cut costs one C call per table.
    """

    last_seq: int
    meta: dict[str, str]
    tables: dict[str, bytes] = {}
    deletes: dict[str, list[tuple[Any, ...]]] = {}
    rows: int = 0
    meta_digest: str = ""  # the settings' part of the digest (projections/core/digest.py)
    # Rows not encoded yet (collect_async encodes them in chunks); never sent.
    pending: dict[str, list[Any]] = {}
    # A table as collect_async encodes it, in pieces that make its array when sent one
    # after another (``table``): never joined on the loop, where one copy holds it.
    parts: dict[str, list[Any]] = {}  # bytes and memoryviews; never sent as a field

    def table(self, name: str) -> list[Any]:
        """The pieces of table ``name``, in order: its bytes are their concatenation."""
        return self.parts[name] if name in self.parts else [self.tables[name]]


_CUT_YIELD_S = 0.002  # the longest a step of the cut waits for the requests in flight
_CHUNK = 1_000  # rows a step: about 1 ms of the loop to find, 1-2 ms to encode


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _pieces(blobs: list[bytes], count: int) -> list[bytes | memoryview]:
    """msgpack arrays encoded in chunks, as the pieces of one array of ``count`` items:
    each chunk's header is dropped (a view, no copy), one for the whole goes in front."""
    body: list[bytes | memoryview] = [array_header(count)]
    for blob in blobs:
        first = blob[0]
        skip = 1 if first & 0xF0 == 0x90 else 3 if first == 0xDC else 5
        body.append(memoryview(blob)[skip:])
    return body


def state_meta(state: State) -> dict[str, str]:
    """What a checkpoint (and a snapshot) keeps of the state beside its rows: the fold's
    position first, then the rest of ``KEPT`` in its order (reducers/state.py)."""
    ordered = [p for p in KEPT if p.position] + [p for p in KEPT if not p.position]
    meta = {p.name: p.dump(getattr(state, p.name)) for p in ordered}
    meta["schema"] = SCHEMA_VERSION
    meta["meta_digest"] = meta_digest(state)
    return meta


def restore_meta(state: State, meta: dict[str, str]) -> None:
    """Put back what ``state_meta`` kept (pieces a file written before them lacks stay
    as a new state has them)."""
    for piece in KEPT:
        if piece.name in meta:
            setattr(state, piece.name, piece.load(meta[piece.name]))


def put_rows(state: State, table: str, rows: list[Any]) -> None:
    """Decoded rows into their projection, each under its key."""
    getattr(state, table).update(zip(map(TABLES[table].key_of, rows), rows, strict=True))


async def collect_async(state: State, foreground: Foreground | None = None) -> Checkpoint:
    """``collect``, finding and encoding the rows in chunks and yielding to the event loop
    between them (to the requests in flight in ``foreground``, when given): queries go
    on while a checkpoint of a big pool is cut (a single pass over 50,000 changed rows
    held the loop past /v1/stats' p99). The caller keeps the fold from running until it
    returns: the rows must not change mid-cut."""
    dirty = state.take_unwritten()
    try:
        keys = list(dirty)
        found: list[ProxyRow] = []
        gone: list[ProxyKey] = []
        rows = state.proxies
        for start in range(0, len(keys), _CHUNK):
            for key in keys[start : start + _CHUNK]:
                row = rows.get(key)
                if row is None:
                    gone.append(key)
                else:
                    found.append(row)
            await give_way(foreground, _CUT_YIELD_S)
    except BaseException:  # cancelled mid-cut: the rows are still to be written
        state.dirty["proxies"] |= dirty
        raise
    cp = collect(state, encode=False, proxies=(found, gone))
    try:
        for name, pending in list(cp.pending.items()):
            blobs = []
            for start in range(0, len(pending), _CHUNK):
                blobs.append(_encode(pending[start : start + _CHUNK]))
                await give_way(foreground, _CUT_YIELD_S)
            cp.parts[name] = _pieces(blobs, len(pending)) if blobs else [_encode([])]
    except BaseException:  # cancelled mid-cut: the rows are still to be written
        put_back(state, cp)
        raise
    cp.pending = {}
    return cp


def _changed(rows: dict[Any, Any], dirty: set[Any]) -> tuple[list[Any], list[Any]]:
    """The rows of ``dirty`` keys still there, and the keys gone."""
    found, gone = [], []
    for key in dirty:
        row = rows.get(key)
        if row is None:
            gone.append(key)
        else:
            found.append(row)
    return found, gone


def put_back(state: State, cp: Checkpoint) -> None:
    """A checkpoint's rows and deletes marked dirty again (its cut was cancelled)."""
    for name in DIRTY:
        declared = TABLES[name]
        state.dirty[name] |= set(map(declared.key_of, cp.pending[name]))
        state.dirty[name] |= {declared.key_from(key) for key in cp.deletes[name]}


def collect(
    state: State,
    *,
    encode: bool = True,
    proxies: tuple[list[ProxyRow], list[ProxyKey]] | None = None,
) -> Checkpoint:
    """Take the changed rows out of ``state`` and clear its dirt. ``proxies``: the
    changed proxy rows and the deleted keys, when the caller found them already."""
    pending: dict[str, list[Any]] = {}
    deletes: dict[str, list[tuple[Any, ...]]] = {}
    for name, keys in state.take_dirty().items():
        if name == "proxies" and proxies is not None:
            state.unwritten |= keys  # none while the fold stands still: for the next cut
            found, gone = proxies
        else:
            found, gone = _changed(getattr(state, name), keys)
        pending[name] = found
        deletes[name] = [key if isinstance(key, tuple) else (key,) for key in gone]
    for name in WHOLE:
        pending[name] = list(getattr(state, name).values())
    meta = state_meta(state)
    cp = Checkpoint(
        meta_digest=meta["meta_digest"],
        last_seq=state.last_seq,
        meta=meta,
        tables={},
        pending={name: pending[name] for name in TABLES},
        deletes=deletes,
        rows=sum(map(len, pending.values())) + sum(map(len, deletes.values())),
    )
    if encode:
        cp.tables = {name: _encode(rows) for name, rows in cp.pending.items()}
        cp.pending = {}
    return cp


def _plain_columns(name: str, declared: Table) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of a table's rows into its plain columns only (a view that skips every
    other field of the row)."""
    hints = typing.get_type_hints(declared.row)
    names = (*declared.key, *declared.columns)
    cols = msgspec.defstruct(f"{name}_columns", [(col, hints[col]) for col in names])
    return msgspec.msgpack.Decoder(list[cols])  # type: ignore[valid-type]


# Each table blob is decoded twice, both in C: once into its plain columns, once into
# each row's own bytes (msgspec.Raw), which are stored as they are, with no decode and
# re-encode of whole rows.
_COLUMNS = {name: _plain_columns(name, declared) for name, declared in TABLES.items()}
_raw_rows = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode


def _tuples(table: str, blob: bytes) -> list[tuple[Any, ...]]:
    """One table of a checkpoint as appender rows: its plain columns, then the row bytes."""
    columns = _COLUMNS[table].decode(blob)
    raws = _raw_rows(blob)
    return [(*msgspec.structs.astuple(c), bytes(r)) for c, r in zip(columns, raws, strict=True)]


def keep_digest(keeper: DigestKeeper, cp: Checkpoint) -> None:
    """Move the keeper's sums by the rows of one checkpoint."""
    for table, blob in cp.tables.items():
        for values in _tuples(table, blob):
            keeper.put(table, TABLES[table].key_from(values), values[-1])
    for table, keys in cp.deletes.items():
        for key in keys:
            keeper.delete(table, TABLES[table].key_from(key))


_KEYS = {name: list(t.key) for name, t in TABLES.items()}


class Store:
    """One DuckDB file holding the checkpointed projections. Calls block: run off the loop."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._con = duckdb.connect(self.path)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        # DuckDB folds its WAL into the file whenever the WAL passes 16 MB, inside
        # whichever commit crosses it, and the fold waits for it (docs/decisions.md, The
        # fold). The WAL is as durable as the file; it is folded in at close instead.
        self._con.execute("SET checkpoint_threshold = '1GB'")
        self._per_cell_sites()
        self._con.execute(DDL)
        found = self._meta().get("schema", SCHEMA_VERSION)
        if found != SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {found}, this ppf writes {SCHEMA_VERSION}")

    def _per_cell_sites(self) -> None:
        """A file of the build that kept a row per proxy and site (columns ip, port,
        site): an empty such table is made anew; one with rows cannot be read as rows
        of cells, and the log is replayed into a new file instead."""
        found = self._con.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'sites' AND column_name = 'ip'"
        ).fetchone()
        if not found or not found[0]:
            return
        rows = self._con.execute("SELECT count(*) FROM sites").fetchone()
        if rows and rows[0]:
            raise StoreError(
                f"{self.path} keeps a row per proxy and site, as an earlier build did;"
                " this ppf keeps them in columns: replay the log into a new file"
                " (ppf replay --db NEW.duckdb)"
            )
        self._con.execute("DROP TABLE sites")

    def _meta(self) -> dict[str, str]:
        return dict(self._con.execute("SELECT k, v FROM meta").fetchall())

    @property
    def last_seq(self) -> int:
        return int(self._meta().get("last_seq", "0"))

    def write(self, cp: Checkpoint) -> None:
        """Apply one checkpoint in one transaction."""
        with self._lock:
            con = self._con
            con.begin()
            try:
                for table, blob in cp.tables.items():
                    rows = _tuples(table, blob)
                    if rows:
                        app = con.appender(table, action="upsert")
                        app.append_rows(rows)
                        app.flush()
                for table, keys in cp.deletes.items():
                    if keys:
                        app = con.appender(table, action="delete", key=_KEYS[table])
                        app.append_rows(keys)
                        app.flush()
                app = con.appender("meta", action="upsert")
                app.append_rows(list(cp.meta.items()))
                app.flush()
                con.commit()
            except BaseException:
                con.rollback()
                raise

    def restore(self) -> State:
        """The state as of the last committed checkpoint (empty for a new file)."""
        state = State()
        with self._lock:
            restore_meta(state, self._meta())
            for table, declared in TABLES.items():
                decoder = msgspec.msgpack.Decoder(declared.row, dec_hook=decode_column)
                found = self._con.execute(f"SELECT row FROM {table}").fetchall()
                try:
                    put_rows(state, table, [decoder.decode(raw) for (raw,) in found])
                except msgspec.DecodeError as exc:
                    raise StoreError(
                        f"{self.path}: its {table} rows are not this build's ({exc}); replay"
                        " the log into a new file (ppf replay --db NEW.duckdb)"
                    ) from exc
        reindex(state)
        return state

    def digest_keeper(self) -> tuple[DigestKeeper, str]:
        """A keeper holding every committed row's hash, and the committed meta digest."""
        keeper = DigestKeeper()
        with self._lock:
            meta = self._meta().get("meta_digest", "")
            for table, keys in _KEYS.items():
                cols = ", ".join(keys)
                for values in self._con.execute(f"SELECT {cols}, row FROM {table}").fetchall():
                    keeper.put(table, TABLES[table].key_from(values), values[-1])
        return keeper, meta

    def close(self) -> None:
        with self._lock:
            self._con.close()
