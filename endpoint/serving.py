"""What a client connection (``ClientSide``, endpoint/forward.py) asks of the endpoint
that serves it (``Endpoint``, endpoint/relay.py), and the outcomes it counts there."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

from endpoint.choose import Pool, Upstream
from endpoint.login import Want
from endpoint.uplink import Idle, Request, UpLink

__all__ = ["Closable", "Outcomes", "Serving"]


@dataclass
class Outcomes:
    """What the endpoint did, by outcome: for ``/metrics`` and ``ppf bench serve``."""

    counts: dict[str, int] = field(default_factory=dict)
    # Our own time from a request read to its sending upstream, the latest 1,000.
    added_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1_000))

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1


class Closable(Protocol):
    """An open connection of a consumer's, closed when its login no longer holds."""

    def close(self) -> None: ...


class Serving(Protocol):
    """The endpoint as a client connection sees it."""

    pool: Pool
    idle: Idle
    outcomes: Outcomes
    tasks: set[asyncio.Task[None]]
    attempts: int
    head_s: float
    login_recheck_s: float

    def http_login(
        self, authorization: bytes, peer: str
    ) -> Awaitable[tuple[Want | None, str, str]]:
        """Who a request's Proxy-Authorization says it is (None: refused), its token, and
        why it was refused."""

    def site_of(self, host: str) -> str:
        """The site of a request to ``host`` (events/sites.py)."""

    def enter(self, want: Want) -> bool: ...
    def leave(self, want: Want | None) -> None: ...
    def hold(self, login: tuple[str, str], conn: Closable) -> None: ...
    def release(self, conn: Closable) -> None: ...
    def refused_destination(self, host: str) -> str: ...
    def first_link(
        self, want: Want, password: str, req: Request, up: Upstream, key: tuple[object, ...]
    ) -> Awaitable[UpLink | None]: ...
    def failed(self, want: Want, password: str, up: Upstream, why: str) -> None: ...
    def worked(self, want: Want, password: str, up: Upstream, started: float) -> None: ...
    def socks(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Awaitable[None]: ...
    def tunnel_http(
        self,
        target: bytes,
        authorization: bytes,
        held: Want | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> Awaitable[None]: ...
