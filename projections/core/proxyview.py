"""One proxy as a pool view holds it: a copy of its row, made once a build, shared by
every order and index of the view (and by the next view while the row stays as it was)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from projections.core.chunks import Chunks
from projections.core.quality import datacenter
from reducers.rows import ProxyQuality
from reducers.state import ProxyKey, ProxyRow

__all__ = ["ProxyView", "Views", "view_of"]


class ProxyView(msgspec.Struct, gc=False):
    """One row as a query reads it, copied whole. Untracked by the collector (``gc=False``:
    it holds no container that could hold it back), so a view's hundred thousand views
    cost no collection a walk; built by msgspec in C, not by a Python ``__new__``."""

    latency: float
    ip: str
    port: int
    proto: str
    protos: tuple[str, ...]
    anonymity: str
    country: str
    asn: int
    as_org: str
    mitm: bool
    https: str
    last_seen: int
    first_seen: int
    exit_ip: str
    confirmations: int
    fail_streak: int
    agents: int
    sources: tuple[str, ...]
    samples: bytes
    line: str  # "proto://ip:port\n"
    confirmed: bool  # an agent trusted now confirmed it (reducers/trust.py)
    datacenter: str  # "yes", "no", "" (no AS known): projections/core/quality.py
    # Its figures over time (reducers/quality.py): the fold's own row, read only where a
    # filter or an answer asks (as of the read, not the build). Working them out for
    # every row made a build of 100,000 proxies 0.50 s (0.34 without figures; 0.375
    # reading them so).
    quality: ProxyQuality | None = None


Views = Chunks[ProxyView]


def view_of(
    r: ProxyRow,
    vouched: Callable[[tuple[str, ...]], bool],
    quality: dict[ProxyKey, ProxyQuality],
) -> ProxyView:
    return ProxyView(
        r.latency_ema,
        r.ip,
        r.port,
        r.proto,
        r.protos,
        r.anonymity,
        r.country,
        r.asn,
        r.as_org,
        r.mitm,
        r.https,
        r.last_seen,
        r.first_seen,
        r.exit_ip,
        r.confirmations,
        r.fail_streak,
        len(r.agents),
        r.sources,
        r.samples,
        f"{r.proto}://{r.ip}:{r.port}\n",
        vouched(r.agents),
        datacenter(r.as_org),
        quality.get((r.ip, r.port)) if quality else None,
    )
