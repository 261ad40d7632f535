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
from typing import Any

import msgspec

from events.catalogue import Settings
from reducers.state import State

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

TABLES = ("proxies", "sources", "leases", "agents", "deposits")
MOD = 1 << 128
_encode = msgspec.msgpack.Encoder().encode


def row_hash(encoded: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=16).digest(), "big")


def table_sum(encoded_rows: Iterable[bytes]) -> int:
    """A table's part of the digest: the sum of its rows' hashes, mod 2**128."""
    return sum(map(row_hash, encoded_rows)) % MOD


def meta_digest(state: State) -> str:
    """The settings and sweep point reducers depend on, and the agents' high-water marks."""
    settings = msgspec.structs.asdict(state.settings)
    for name in _LATER:
        if settings[name] == _DEFAULTS[name]:
            # A setting added later, left out while at its default: a log written
            # before it existed keeps the digest it always had.
            del settings[name]
    parts: dict[str, Any] = {"settings": settings, "sweep_bucket": state.sweep_bucket}
    if state.high_water:  # likewise: only logs with per-agent subjects have marks
        parts["high_water"] = sorted(state.high_water.items())
    if state.marks:  # and only logs with the re-send window have windows
        parts["marks"] = sorted((a, m.floor, m.ids) for a, m in state.marks.items())
    if state.recent:  # and only logs with the window in log time have these
        parts["recent"] = sorted((a, list(r.until.items())) for a, r in state.recent.items())
    if state.settings.trust:  # and only logs with trust have a baseline
        parts["trust_base"] = state.trust_base
    if state.doubted:  # and only guarded logs have consumers' doubts and takes
        parts["doubted"] = sorted((list(k), list(v)) for k, v in state.doubted.items())
    if state.takes:
        parts["takes"] = sorted((k, v) for k, v in state.takes.items())
    if state.checkouts:  # and only logs with checkouts have them
        parts["checkouts"] = sorted((k, v) for k, v in state.checkouts.items())
    return hashlib.sha256(_encode(parts)).hexdigest()


# Settings added after the first logs were written (in the order they came).
_LATER = (
    "agent_subjects",
    "trust",
    "trusted_agents",
    "spot_window_s",
    "spot_share",
    "trust_after",
    "trust_margin",
    "quota_events_per_min",
    "quota_proxies_per_hour",
    "quota_sources_per_hour",
    "report_budget_per_hour",
    "recheck_failing_s",
    "recheck_fresh_s",
    "recheck_settled_s",
    "recheck_veteran_s",
    "recheck_dead_s",
    "recheck_budget_per_hour",
    "resend_window",
    "batches",
    "guarded",
    "id_skew_s",
    "report_share",
    "address_rule",
    "resend_window_s",
)
_DEFAULTS = msgspec.structs.asdict(Settings())


def combine(sums: dict[str, int], meta: str) -> str:
    """The digest of the tables' sums (each the sum of its rows' ``row_hash`` mod 2**128)
    and the meta part."""
    parts = {name: f"{sums[name]:032x}" for name in TABLES}
    parts["meta"] = meta
    return hashlib.sha256(_encode(parts)).hexdigest()


def digests(state: State) -> dict[str, str]:
    """One digest per projection, plus the meta part."""
    tables: dict[str, dict[Any, Any]] = {
        "proxies": state.proxies,
        "sources": state.sources,
        "leases": state.leases,
        "deposits": state.deposits,
        "agents": state.agents,
    }
    out = {name: f"{table_sum(map(_encode, rows.values())):032x}" for name, rows in tables.items()}
    out["meta"] = meta_digest(state)
    return out


def digest(state: State) -> str:
    """The digest of all projections together."""
    parts = digests(state)
    sums = {name: int(parts[name], 16) for name in TABLES}
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
    out = {name: raw[16 * i : 16 * i + 16].hex() for i, name in enumerate(TABLES)}
    out["meta"] = raw[16 * len(TABLES) :].hex()
    return out
