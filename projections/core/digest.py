"""Canonical digests of the projections: two builds are equal iff their digests are.

Each row is hashed over its canonical msgpack (msgspec encodes Struct fields in
declaration order; collections inside rows are tuples or dicts in log order); a table's
digest is the sum of its rows' 128-bit BLAKE2b hashes modulo 2**128. A sum does not
depend on row order and moves by one row's difference when a row changes, so the
checkpoint writer keeps it up to date from the rows it writes (``DigestKeeper``), and
``/v1/stats`` reports it without hashing a million rows per call. ``digest(state)``
computes the same value from scratch, for replay and tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable

import msgspec

from reducers.kept import ALWAYS
from reducers.rows import encode_column
from reducers.state import KEPT, TABLES, State

__all__ = [
    "MOD",
    "TABLES",
    "DigestKeeper",
    "combine",
    "digest",
    "digests",
    "meta_digest",
    "row_hash",
    "table_sum",
]

MOD = 1 << 128
_encode = msgspec.msgpack.Encoder(enc_hook=encode_column).encode


def row_hash(encoded: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=16).digest(), "big")


def table_sum(encoded_rows: Iterable[bytes]) -> int:
    """A table's part of the digest: the sum of its rows' hashes, mod 2**128."""
    return sum(map(row_hash, encoded_rows)) % MOD


def meta_digest(state: State) -> str:
    """The meta's part of the digest: each piece ``KEPT`` counts now, in its canonical
    form, in declaration order (reducers/state.py)."""
    parts = {p.name: p.canonical(getattr(state, p.name)) for p in KEPT if p.counts(state)}
    return hashlib.sha256(_encode(parts)).hexdigest()


def combine(sums: dict[str, int], meta: str) -> str:
    """The digest of the tables' sums (each the sum of its rows' ``row_hash`` mod 2**128)
    and the meta part."""
    parts = {name: f"{sums[name]:032x}" for name in TABLES if _counted(name, sums[name])}
    parts["meta"] = meta
    return hashlib.sha256(_encode(parts)).hexdigest()


def digests(state: State) -> dict[str, str]:
    """One digest per projection (a later table's only once it has rows, as ``combine``
    counts it), plus the meta part."""
    sums = {name: table_sum(map(_encode, getattr(state, name).values())) for name in TABLES}
    out = {name: f"{sum_:032x}" for name, sum_ in sums.items() if _counted(name, sum_)}
    out["meta"] = meta_digest(state)
    return out


def _counted(table: str, sum_: int) -> bool:
    """Whether a table's sum is part of the digest: always, or for a table added after
    the first logs, once it has rows."""
    return TABLES[table].digest == ALWAYS or sum_ != 0


def digest(state: State) -> str:
    """The digest of all projections together."""
    parts = digests(state)
    sums = {name: int(parts.get(name, "0"), 16) for name in TABLES}
    return combine(sums, parts["meta"])


class DigestKeeper:
    """Keeps ``digest`` from the rows a checkpoint carries (in the writer's process):
    each key's last row hash, each table's sum."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[Hashable, int]] = {name: {} for name in TABLES}
        self.sums = dict.fromkeys(TABLES, 0)

    def put(self, table: str, key: Hashable, encoded: bytes) -> None:
        hashes = self.hashes[table]
        new = row_hash(encoded)
        self.sums[table] = (self.sums[table] - hashes.get(key, 0) + new) % MOD
        hashes[key] = new

    def delete(self, table: str, key: Hashable) -> None:
        old = self.hashes[table].pop(key, None)
        if old is not None:
            self.sums[table] = (self.sums[table] - old) % MOD

    def value(self, meta: str) -> str:
        return combine(self.sums, meta)

    def parts(self, meta: str) -> bytes:
        """Each table's sum (16 bytes, in ``TABLES`` order), then the meta part's 32:
        what ``digests`` says, as the writer sends it (``parts_of`` reads it)."""
        return b"".join(self.sums[name].to_bytes(16, "big") for name in TABLES) + bytes.fromhex(
            meta
        )


PARTS_BYTES = 16 * len(TABLES) + 32


def parts_of(raw: bytes) -> dict[str, str]:
    """``DigestKeeper.parts`` as ``digests`` gives them: hex per table, and the meta."""
    sums = {name: int.from_bytes(raw[16 * i : 16 * i + 16], "big") for i, name in enumerate(TABLES)}
    out = {name: f"{sum_:032x}" for name, sum_ in sums.items() if _counted(name, sum_)}
    out["meta"] = raw[16 * len(TABLES) :].hex()
    return out
