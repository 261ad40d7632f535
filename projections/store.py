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
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from projections.core.digest import DigestKeeper, meta_digest
from projections.foreground import Foreground, give_way
from reducers.indexes import reindex
from reducers.rows import decode_column, encode_column
from reducers.state import KEPT, TABLES, ProxyKey, ProxyRow, State

__all__ = [
    "DDL",
    "Checkpoint",
    "Store",
    "StoreError",
    "array_header",
    "collect",
    "collect_async",
    "keep_digest",
    "put_rows",
    "restore_meta",
    "state_meta",
]

SCHEMA_VERSION = "1"

DDL = """\
CREATE TABLE IF NOT EXISTS proxies (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, proto VARCHAR, last_seen BIGINT,
    row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS sources (
    url_id VARCHAR PRIMARY KEY, url VARCHAR, check_time BIGINT, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    target VARCHAR PRIMARY KEY, kind VARCHAR, status VARCHAR, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS agents (name VARCHAR PRIMARY KEY, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS deposits (
    key VARCHAR PRIMARY KEY, status VARCHAR, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sites (
    site VARCHAR NOT NULL, chunk BIGINT NOT NULL, row BLOB NOT NULL,
    PRIMARY KEY (site, chunk));
CREATE TABLE IF NOT EXISTS site_proxies (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS quality (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS meta (k VARCHAR PRIMARY KEY, v VARCHAR NOT NULL);
"""

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
        state.dirty_proxies |= dirty
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
        state.dirty_proxies |= {(r.ip, r.port) for r in cp.pending["proxies"]}
        state.dirty_proxies |= {tuple(k) for k in cp.deletes["proxies"]}
        state.dirty_sources |= {r.url_id for r in cp.pending["sources"]}
        state.dirty_sources |= {k[0] for k in cp.deletes["sources"]}
        state.dirty_leases |= {r.target for r in cp.pending["leases"]}
        state.dirty_deposits |= {r.key for r in cp.pending["deposits"]}
        state.dirty_sites |= {(r.site, r.chunk) for r in cp.pending["sites"]}
        state.dirty_sites |= {tuple(k) for k in cp.deletes["sites"]}
        state.dirty_site_proxies |= {(r.ip, r.port) for r in cp.pending["site_proxies"]}
        state.dirty_site_proxies |= {tuple(k) for k in cp.deletes["site_proxies"]}
        state.dirty_quality |= {(r.ip, r.port) for r in cp.pending["quality"]}
        state.dirty_quality |= {tuple(k) for k in cp.deletes["quality"]}
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


def collect(
    state: State,
    *,
    encode: bool = True,
    proxies: tuple[list[ProxyRow], list[ProxyKey]] | None = None,
) -> Checkpoint:
    """Take the changed rows out of ``state`` and clear its dirt. ``proxies``: the
    changed proxy rows and the deleted keys, when the caller found them already."""
    found, gone_p = proxies or _changed(state.proxies, state.take_unwritten())
    sources, gone_uids = _changed(state.sources, state.dirty_sources)
    gone_s = [(uid,) for uid in gone_uids]
    leases = [state.leases[t] for t in state.dirty_leases]
    deposits = [state.deposits[k] for k in state.dirty_deposits]
    sites, gone_c = _changed(state.sites, state.dirty_sites)
    numbered, gone_n = _changed(state.site_proxies, state.dirty_site_proxies)
    quality, gone_q = _changed(state.quality, state.dirty_quality)
    agents = list(state.agents.values())
    meta = state_meta(state)
    cp = Checkpoint(
        meta_digest=meta["meta_digest"],
        last_seq=state.last_seq,
        meta=meta,
        tables={},
        pending={
            "proxies": found,
            "sources": sources,
            "leases": leases,
            "agents": agents,
            "deposits": deposits,
            "sites": sites,
            "site_proxies": numbered,
            "quality": quality,
        },
        deletes={
            "proxies": list(gone_p),
            "sources": gone_s,
            "sites": gone_c,
            "site_proxies": gone_n,
            "quality": gone_q,
        },
        rows=len(found)
        + len(sources)
        + len(leases)
        + len(agents)
        + len(deposits)
        + len(sites)
        + len(gone_p)
        + len(gone_s)
        + len(gone_c)
        + len(numbered)
        + len(gone_n)
        + len(quality)
        + len(gone_q),
    )
    state.clear_dirty()
    if encode:
        cp.tables = {name: _encode(rows) for name, rows in cp.pending.items()}
        cp.pending = {}
    return cp


class _ProxyCols(msgspec.Struct):
    ip: str
    port: int
    proto: str
    last_seen: int


class _SourceCols(msgspec.Struct):
    url_id: str
    url: str
    check_time: int


class _LeaseCols(msgspec.Struct):
    target: str
    kind: str
    status: str


class _AgentCols(msgspec.Struct):
    name: str


class _DepositCols(msgspec.Struct):
    key: str
    status: str


class _SiteCols(msgspec.Struct):
    site: str
    chunk: int


class _AddressCols(msgspec.Struct):
    ip: str
    port: int


# Each table blob is decoded twice, both in C: once into its plain columns (a view that
# skips every other field), once into each row's own bytes (msgspec.Raw), which are
# stored as they are, with no decode and re-encode of whole rows.
_COLUMNS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "proxies": msgspec.msgpack.Decoder(list[_ProxyCols]),
    "sources": msgspec.msgpack.Decoder(list[_SourceCols]),
    "leases": msgspec.msgpack.Decoder(list[_LeaseCols]),
    "agents": msgspec.msgpack.Decoder(list[_AgentCols]),
    "deposits": msgspec.msgpack.Decoder(list[_DepositCols]),
    "sites": msgspec.msgpack.Decoder(list[_SiteCols]),
    "site_proxies": msgspec.msgpack.Decoder(list[_AddressCols]),
    "quality": msgspec.msgpack.Decoder(list[_AddressCols]),
}
_raw_rows = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode


def _tuples(table: str, blob: bytes) -> list[tuple[Any, ...]]:
    """One table of a checkpoint as appender rows: its plain columns, then the row bytes."""
    columns = _COLUMNS[table].decode(blob)
    raws = _raw_rows(blob)
    return [(*msgspec.structs.astuple(c), bytes(r)) for c, r in zip(columns, raws, strict=True)]


def _key(table: str, values: tuple[Any, ...]) -> Any:
    """A row's key for the digest keeper: (ip, port) for proxies, else the one column."""
    width = len(TABLES[table].key)
    return values[:width] if width > 1 else values[0]


def keep_digest(keeper: DigestKeeper, cp: Checkpoint) -> None:
    """Move the keeper's sums by the rows of one checkpoint."""
    for table, blob in cp.tables.items():
        for values in _tuples(table, blob):
            keeper.put(table, _key(table, values), values[-1])
    for table, keys in cp.deletes.items():
        for key in keys:
            keeper.delete(table, _key(table, tuple(key)))


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
                    keeper.put(table, _key(table, values), values[-1])
        return keeper, meta

    def close(self) -> None:
        with self._lock:
            self._con.close()
