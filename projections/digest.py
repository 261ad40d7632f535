"""Canonical digests of the projections: two builds are equal iff their digests are.

Each projection is hashed over its rows in key order, each row in its canonical
msgpack (msgspec encodes Struct fields in declaration order; collections inside rows
are tuples or dicts in log order), so the digest depends on nothing but the folded log.
"""

from __future__ import annotations

import hashlib

import msgspec

from reducers.state import State

__all__ = ["digest", "digests"]

_encode = msgspec.msgpack.Encoder().encode


def _table(rows: dict) -> str:  # type: ignore[type-arg]
    h = hashlib.sha256()
    for key in sorted(rows):
        h.update(_encode(rows[key]))
        h.update(b"\n")
    return h.hexdigest()


def digests(state: State) -> dict[str, str]:
    """One digest per projection, plus the settings and sweep point reducers depend on."""
    meta = _encode({"settings": state.settings, "sweep_bucket": state.sweep_bucket})
    return {
        "proxies": _table(state.proxies),
        "sources": _table(state.sources),
        "leases": _table(state.leases),
        "agents": _table(state.agents),
        "meta": hashlib.sha256(meta).hexdigest(),
    }


def digest(state: State) -> str:
    """The digest of all projections together."""
    parts = digests(state)
    return hashlib.sha256(_encode(parts)).hexdigest()
