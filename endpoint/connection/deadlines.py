"""How long a client connection of the endpoint may take, checked on a timer (not at
every byte): its first byte, a request head whole within ``head_s`` of its first byte
however slowly it comes, a body that keeps ``MIN_BODY_RATE`` once the head's time is
spent, and an idle keep-alive connection. What runs out is counted (``slow_head``,
``slow_body``) and the connection closed."""

from __future__ import annotations

import asyncio
import time

from endpoint.router.forwarding import Forwarding
from endpoint.router.router import Router

__all__ = ["FIRST_BYTE_S", "IDLE_S", "MIN_BODY_RATE", "Deadlines"]

FIRST_BYTE_S = 10.0
IDLE_S = 30.0  # a client connection with no request in flight for this long is closed
MIN_BODY_RATE = 65_536  # bytes a second a request's body keeps, after the head's time


class Deadlines:
    """The timer of a client connection (``ClientSide``, connection/client.py), which
    keeps the state read here."""

    router: Router
    fw: Forwarding  # its request in flight, if any
    closing: bool
    seen: bool  # a first byte came
    last: float  # when a byte last came
    head_since: float | None
    body_since: float | None
    timer: asyncio.TimerHandle | None
    _body_size: int

    def close(self) -> None:
        raise NotImplementedError

    def _arm(self, after_s: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(after_s, self._idle_check)

    def _idle_check(self) -> None:
        """Closes a connection silent for ``IDLE_S`` with nothing in flight (the first
        byte: ``FIRST_BYTE_S``), or whose request head is not whole ``head_s`` after it
        began; checked on a timer, not re-armed at every byte."""
        if self.closing:
            return
        now = time.monotonic()
        head_s = self.router.head_s
        idle = self.fw.current is None
        if idle and self.head_since is not None and now - self.head_since >= head_s:
            self.router.outcomes.count("slow_head")
            self.close()
            return
        body_until = self._body_until()
        if idle and body_until is not None and now >= body_until:
            self.router.outcomes.count("slow_body")
            self.close()
            return
        limit = IDLE_S if self.seen else FIRST_BYTE_S
        quiet = now - self.last
        if idle and quiet >= limit:
            self.close()
            return
        wait = limit - quiet
        if idle and self.head_since is not None:
            wait = min(wait, self.head_since + head_s - now)
        if idle and body_until is not None:
            wait = min(wait, body_until - now)
        self._arm(max(wait, 0.05 if idle else 0.5))

    def _body_until(self) -> float | None:
        """When the body being read must be whole by, at the pace it has kept: the head's
        time, and a second more for each ``MIN_BODY_RATE`` bytes come (a drip is cut as a
        slow head is; an honest upload at that pace or faster never is)."""
        if self.body_since is None:
            return None
        return self.body_since + self.router.head_s + self._body_size / MIN_BODY_RATE
