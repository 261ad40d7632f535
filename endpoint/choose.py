"""Which upstream proxy carries the next request: the endpoint's pool in memory.

The pool is what the gateways serve (``replace`` with each refresh of the feed), plus
what this endpoint saw itself, which acts at once, before any log round trip:

- a proxy that failed real traffic is **avoided** for a while, 10 s after a first
  failure and doubling with each one in a row, up to ``AVOID_S`` (the log hears of it
  too, and its checkers judge it for everyone); a proxy that fails under a burst of
  load is back soon, a dead one stays out. When every proxy that matches is avoided, the
  one whose avoidance ends first is tried rather than none;
- every outcome moves the proxy's **success** score (an EMA), and the default strategy
  weighs proxies by it over their latency.

Strategies: ``weighted`` (random, weight success / latency), ``roundrobin`` (in turn
over the proxies that match, per filter), ``lru`` (the least recently used); weighted
and lru weigh a random sample of ``SAMPLE`` of the matching proxies, so a pick costs the
same whatever the pool's size (lru is then the least recently used of the sample). A
``session`` keeps its upstream while it works (``session_min`` minutes since last use).
Tunnels (CONNECT, SOCKS) only go through proxies that can tunnel: SOCKS, or HTTP proxies
that carried a tunnel to a real HTTPS site (``https`` yes). Proxies seen tampering
(``mitm``) only when asked. Time is the caller's (``now``, seconds); randomness is the
``random.Random`` given, so tests can pin it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from endpoint.login import Want

__all__ = ["AVOID_S", "Pool", "Upstream"]

AVOID_S = 300.0  # at most this long does a proxy that failed real traffic sit out, here
AVOID_FIRST_S = 10.0
SAMPLE = 8  # upstreams a weighted or least-recently-used pick weighs
_ALPHA = 0.3  # the success EMA's weight of the latest outcome


class Facts(Protocol):
    """What the gateway says of a proxy (an ``Upstream`` says it too)."""

    ip: str
    port: int
    proto: str
    country: str
    asn: int
    anonymity: str
    https: str
    mitm: bool
    latency_ms: float


@dataclass(slots=True)
class Upstream:
    ip: str
    port: int
    proto: str  # how we speak to it: http, https (an HTTP proxy), socks4, socks5
    country: str = ""
    asn: int = 0
    anonymity: str = ""
    https: str = ""
    mitm: bool = False
    latency_ms: float = 0.0
    # What this endpoint saw of it: the success EMA, when it was last used, until when
    # it is avoided.
    success: float = 1.0
    used_at: float = 0.0
    avoid_until: float = 0.0
    strikes: int = 0  # failures in a row

    @property
    def key(self) -> tuple[str, int]:
        return (self.ip, self.port)

    @property
    def tunnels(self) -> bool:
        return self.proto.startswith("socks") or self.https == "yes"

    def url(self) -> str:
        scheme = "http" if self.proto in ("http", "https") else self.proto
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{scheme}://{host}:{self.port}"


@dataclass
class Pool:
    rng: random.Random = field(default_factory=random.Random)
    upstreams: dict[tuple[str, int], Upstream] = field(default_factory=dict)
    # (consumer, session) -> (upstream key, last used); a round robin's cursor per filter.
    sessions: dict[tuple[str, str], tuple[tuple[str, int], float]] = field(default_factory=dict)
    cursors: dict[tuple[object, ...], int] = field(default_factory=dict)
    _lists: dict[tuple[object, ...], list[Upstream]] = field(default_factory=dict)

    def replace(self, fresh: Iterable[Facts]) -> None:
        """The feed's new pool; what we learned of proxies still in it is kept."""
        for _ in self.replacing(fresh, 0):
            pass

    def replacing(self, fresh: Iterable[Facts], piece: int) -> Iterator[None]:
        """``replace`` in steps of ``piece`` proxies (0: one step): the pool stays the old
        one until the last step swaps the new one in. A proxy still in the pool keeps
        its ``Upstream``, its facts brought up to date: a big pool made anew every
        refresh keeps the collector busy (docs/decisions.md, The endpoint)."""
        old = self.upstreams
        new = {}
        for n, f in enumerate(fresh, start=1):
            if piece and not n % piece:
                yield
            key = (f.ip, f.port)
            up = old.get(key)
            if up is None:
                up = Upstream(
                    f.ip, f.port, f.proto, f.country, f.asn, f.anonymity, f.https, f.mitm,
                    f.latency_ms,
                )  # fmt: skip
            else:
                up.proto, up.country, up.asn, up.anonymity = f.proto, f.country, f.asn, f.anonymity
                up.https, up.mitm, up.latency_ms = f.https, f.mitm, f.latency_ms
            new[key] = up
        self.upstreams = new
        self._lists = {}

    def _matches(self, up: Upstream, want: Want, tunnel: bool) -> bool:
        if tunnel and not up.tunnels:
            return False
        if up.mitm and not want.mitm:
            return False
        if want.proto and up.proto != want.proto:
            return False
        if want.country and up.country not in want.country:
            return False
        if want.anonymity and up.anonymity != want.anonymity:
            return False
        if want.https and up.https != "yes":
            return False
        if want.max_latency_ms and up.latency_ms > want.max_latency_ms:
            return False
        return not (want.asn and up.asn != want.asn)

    def pick(
        self,
        want: Want,
        *,
        tunnel: bool,
        now: float,
        exclude: frozenset[tuple[str, int]] = frozenset(),
    ) -> Upstream | None:
        """The upstream for the next attempt, or None when nothing matches."""
        if want.session:
            sticky = self.sessions.get((want.consumer, want.session))
            if sticky is not None and now - sticky[1] <= want.session_min * 60:
                up = self.upstreams.get(sticky[0])
                if (
                    up is not None
                    and up.key not in exclude
                    and up.avoid_until <= now
                    and self._matches(up, want, tunnel)
                ):
                    return self._use(up, want, now)
        listed = self._matching(want, tunnel)
        if not listed:
            return None
        ready = [u for u in self._sample(listed) if u.key not in exclude and u.avoid_until <= now]
        if not ready:  # the sample was unlucky, or most are out: look at all of them
            ready = [u for u in listed if u.key not in exclude and u.avoid_until <= now]
        if not ready:  # every one avoided or tried: the soonest back rather than none
            left = [u for u in listed if u.key not in exclude]
            if not left:
                return None
            return self._use(min(left, key=lambda u: (u.avoid_until, u.key)), want, now)
        if want.strategy == "roundrobin":
            cursor = (*want.filters(), tunnel)
            i = self.cursors.get(cursor, 0)
            for step in range(len(listed)):  # the next in turn that may go now
                up = listed[(i + step) % len(listed)]
                if up.key not in exclude and up.avoid_until <= now:
                    self.cursors[cursor] = i + step + 1
                    return self._use(up, want, now)
        if want.strategy == "lru":
            up = min(ready, key=lambda u: (u.used_at, u.key))
        else:
            weights = [u.success / max(u.latency_ms, 50.0) for u in ready]
            up = self.rng.choices(ready, weights=weights)[0]
        return self._use(up, want, now)

    def _matching(self, want: Want, tunnel: bool) -> list[Upstream]:
        """The upstreams a login's filters allow, in key order, kept until the next
        ``replace``: a pick looks at a few of them, not at the whole pool."""
        key = (*want.filters(), tunnel)
        found = self._lists.get(key)
        if found is None:
            if len(self._lists) > 10_000:
                self._lists.clear()
            found = sorted(
                (u for u in self.upstreams.values() if self._matches(u, want, tunnel)),
                key=lambda u: u.key,
            )
            self._lists[key] = found
        return found

    def _sample(self, listed: list[Upstream]) -> list[Upstream]:
        """``SAMPLE`` of them at random (all, when that many or fewer): the strategies
        weigh a sample (the power of a few choices), so a pick costs the same at 10 or
        100,000 proxies."""
        if len(listed) <= SAMPLE:
            return listed
        return self.rng.sample(listed, SAMPLE)

    def _use(self, up: Upstream, want: Want, now: float) -> Upstream:
        up.used_at = now
        if want.session:
            self.sessions[(want.consumer, want.session)] = (up.key, now)
            if len(self.sessions) > 100_000:  # forget the oldest: sessions are cheap to remake
                for k, _ in sorted(self.sessions.items(), key=lambda kv: kv[1][1])[:10_000]:
                    del self.sessions[k]
        return up

    def worked(self, up: Upstream, latency_ms: float) -> None:
        up.success = (1 - _ALPHA) * up.success + _ALPHA
        up.strikes = 0
        if latency_ms > 0:
            up.latency_ms = (1 - _ALPHA) * up.latency_ms + _ALPHA * latency_ms

    def failed(self, up: Upstream, now: float) -> None:
        """The proxy's own failure (connect, handshake, no answer): avoided at once."""
        up.success = (1 - _ALPHA) * up.success
        up.strikes += 1
        up.avoid_until = now + min(AVOID_S, AVOID_FIRST_S * 2 ** (up.strikes - 1))
