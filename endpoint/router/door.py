"""Who may use the rotating endpoint, and for how long: logins checked with the gateways
(one ask at a time for one login, failed logins limited per client address), each
consumer's connections counted against its limit, and the connections open under each
login closed once it no longer holds (a revoked or replaced token): keep-alive
connections and tunnels alike, within ``login_recheck_s``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from endpoint.router.login import (
    LOGIN_NEEDED,
    LoginError,
    Want,
    basic_login,
    parse_login,
    wrong_login,
)
from endpoint.router.outcomes import Outcomes
from events.wire import MAX_TOKEN

__all__ = ["Closable", "Door", "Refused"]

log = structlog.get_logger("ppf.serve")


class Closable(Protocol):
    """An open connection of a consumer's, closed when its login no longer holds."""

    def close(self) -> None: ...


class Refused(Exception):
    """The client's request cannot be carried: (HTTP status, SOCKS reply code, why)."""

    def __init__(self, status: int, socks: int, why: str) -> None:
        super().__init__(why)
        self.status, self.socks = status, socks


@dataclass
class Door:
    login_ok: Callable[[str, str], Awaitable[bool]]
    # Whether a login worked lately (asking nobody): such a login passes an address's
    # limit of failed logins, so a flood from one address refuses no consumer known there.
    login_known: Callable[[str, str], bool]
    # Whether a login still holds, asked of the gateways once its answer is old (the
    # feed's ``login_still``); None: ``login_ok``.
    login_still: Callable[[str, str], Awaitable[bool]] | None
    outcomes: Outcomes
    tasks: set[asyncio.Task[object]]  # the endpoint's slow paths, the watch among them
    # A login with connections open is asked again when it is this old.
    login_recheck_s: float = 5.0
    # Failed logins per client address: a burst, then one per period; past them a login
    # is refused without asking the gateway (as the gateway limits its own callers).
    login_failures_burst: int = 20
    login_failures_per_s: float = 1.0
    max_per_consumer: int = 64
    active: dict[str, int] = field(default_factory=dict)
    _failures: dict[str, tuple[float, float]] = field(default_factory=dict)  # tokens, when
    _asking: dict[tuple[str, str], asyncio.Future[bool]] = field(default_factory=dict)
    _conns: dict[tuple[str, str], set[Closable]] = field(default_factory=dict)
    _logins_of: dict[Closable, tuple[str, str]] = field(default_factory=dict)
    _watching: asyncio.Task[None] | None = None

    async def login(self, user: str, password: str, peer: str) -> tuple[Want | None, str]:
        """The login checked: (what it wants, "") or (None, why it was refused, as its
        client may be told: never its token)."""
        if len(password) > MAX_TOKEN:  # no token of ppf's is longer: refused unasked
            self._failed(peer)
            return None, LOGIN_NEEDED
        try:
            want = parse_login(user)
        except LoginError as exc:
            log.info("serve_login_refused", why=str(exc))
            self._failed(peer)
            return None, f"{exc}: NAME[-options]:TOKEN"
        key = (want.consumer, password)
        asking = self._asking.get(key)
        if asking is not None:  # the same login asked already: its answer, uncharged
            return (want, "") if await asyncio.shield(asking) else (None, wrong_login(user))
        # An unknown login is charged to its address before it is asked (logins asked at
        # once would all pass a count made after), and given back when it works.
        charged = not self.login_known(want.consumer, password)
        if charged:
            if self._failures_left(peer, time.monotonic()) < 1:
                self.outcomes.count("login_limited")
                return None, "too many failed logins from this address: try again in a second"
            self._failed(peer)
        asking = self._asking[key] = asyncio.ensure_future(self.login_ok(*key))
        asking.add_done_callback(lambda _: self._asking.pop(key, None))
        ok = await asyncio.shield(asking)
        if ok and charged:
            self._failed(peer, -1)
        return (want, "") if ok else (None, wrong_login(user))

    def _failures_left(self, peer: str, now: float) -> float:
        tokens, at = self._failures.get(peer, (float(self.login_failures_burst), now))
        burst = float(self.login_failures_burst)
        return min(burst, tokens + (now - at) * self.login_failures_per_s)

    def _failed(self, peer: str, count: int = 1) -> None:
        now = time.monotonic()
        self._failures[peer] = (self._failures_left(peer, now) - count, now)
        if len(self._failures) > 10_000:  # a bound: addresses refilled whole are dropped
            burst = self.login_failures_burst
            for key in [k for k in self._failures if self._failures_left(k, now) >= burst]:
                del self._failures[key]

    async def http_login(self, authorization: bytes, peer: str) -> tuple[Want | None, str, str]:
        """The login a ``Proxy-Authorization`` header carries, checked: (what it wants,
        its token, why it was refused)."""
        basic = basic_login(authorization)
        if basic is None:
            return None, "", LOGIN_NEEDED
        want, why = await self.login(*basic, peer)
        return want, basic[1], why

    def enter(self, want: Want) -> bool:
        """One more connection of ``want``'s consumer, unless it has its fill."""
        if self.active.get(want.consumer, 0) >= self.max_per_consumer:
            return False
        self.active[want.consumer] = self.active.get(want.consumer, 0) + 1
        return True

    def leave(self, want: Want | None) -> None:
        if want is not None:
            self.active[want.consumer] -= 1

    def hold(self, login: tuple[str, str], conn: Closable) -> None:
        """``conn`` is open under ``login`` (consumer, token) until ``release``d: it is
        closed once the login no longer holds (``_watch_logins``)."""
        self._conns.setdefault(login, set()).add(conn)
        self._logins_of[conn] = login
        if self._watching is None or self._watching.done():
            self._watching = asyncio.ensure_future(self._watch_logins())
            self.tasks.add(self._watching)
            self._watching.add_done_callback(self.tasks.discard)

    def release(self, conn: Closable) -> None:
        login = self._logins_of.pop(conn, None)
        if login is not None:
            held = self._conns[login]
            held.discard(conn)
            if not held:
                del self._conns[login]

    async def _watch_logins(self) -> None:
        """Every half ``login_recheck_s``, ask whether each login with connections open
        still holds; close them all when it does not (a revoked or replaced token)."""
        still = self.login_still or self.login_ok
        while self._conns:
            await asyncio.sleep(self.login_recheck_s / 2)
            logins = list(self._conns)
            said = await asyncio.gather(
                *(still(*login) for login in logins), return_exceptions=True
            )
            for login, holds in zip(logins, said, strict=True):
                if isinstance(holds, BaseException):  # unanswered: it holds until answered
                    log.warning("serve_login_recheck_failed", error=repr(holds)[:200])
                    continue
                if holds:
                    continue
                conns = self._conns.pop(login, set())
                for conn in conns:
                    self._logins_of.pop(conn, None)
                    conn.close()
                self.outcomes.count("login_revoked")
                log.info("serve_login_revoked", consumer=login[0][:64], closed=len(conns))

    @contextlib.asynccontextmanager
    async def slot(self, want: Want):  # type: ignore[no-untyped-def]
        if not self.enter(want):
            self.outcomes.count("over_limit")
            raise Refused(429, 2, f"{want.consumer} has {self.max_per_consumer} connections open")
        try:
            yield
        finally:
            self.leave(want)
