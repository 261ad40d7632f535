"""Which upstream proxy carries the next request: the endpoint's pool in memory.

The pool is what the gateways serve (``replace`` with each refresh of the feed), plus
what this endpoint saw itself, which acts at once, before any log round trip:

- a proxy that failed real traffic is **avoided** for a while, 10 s after a first
  failure and doubling with each one in a row, up to ``AVOID_S`` (the log hears of it
  too, and its checkers judge it for everyone); a proxy that fails under a burst of
  load is back soon, a dead one stays out. When every proxy that matches is avoided, the
  one whose avoidance ends first is tried rather than none;
- every outcome moves the proxy's **success** score (an EMA), and the default strategy
  weighs proxies by it over their latency;
- **by site** (``site``, events/sites.py): a request goes through a proxy known to get
  through to its site when one may take it (at most ``SITE_BUDGET`` requests a minute
  each, so the working few are not burnt; ``roundrobin`` goes in turn over all of them
  instead), else through one not known either way, never
  through one the site turned away in the last ``SITE_BLOCK_S``; a turned-away proxy
  is not the proxy's failure and stays in for every other site.

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
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from endpoint.link.upstream import Facts, Upstream
from endpoint.router.login import Want
from endpoint.router.pages import Pages
from endpoint.router.standing import EXPLORE, SITE_BLOCK_S, Standing
from endpoint.router.tally import Tally
from events.sites import BLOCKED, THROUGH, SiteRule

__all__ = ["AVOID_S", "PACE_S", "SITE_BLOCK_S", "SITE_BUDGET", "Pool", "pace"]

AVOID_S = 300.0  # at most this long does a proxy that failed real traffic sit out, here
AVOID_FIRST_S = 10.0
# The doublings past which AVOID_S is reached: the strikes of a proxy that fails on and on
# (the only one left, tried as the soonest back) are counted, not raised to a power.
_DOUBLINGS = int(AVOID_S / AVOID_FIRST_S).bit_length()
SAMPLE = 8  # upstreams a weighted or least-recently-used pick weighs
_ALPHA = 0.3  # the success EMA's weight of the latest outcome
SITE_BUDGET = 120  # requests a minute to one site through one proxy
_PER_UPSTREAM = 64  # sites an upstream's marks hold before those run out are let go
_SPENT_LISTS = 64  # lists a pool remembers as spent at sites (``_Spent``)


@dataclass
class Pool:
    """The upstreams the gateways serve, and what this endpoint saw of them."""

    rng: random.Random = field(default_factory=random.Random)
    upstreams: dict[tuple[str, int], Upstream] = field(default_factory=dict)
    # (consumer, session) -> (upstream key, last used); a round robin's cursor per filter.
    sessions: dict[tuple[str, str], tuple[tuple[str, int], float]] = field(default_factory=dict)
    cursors: dict[tuple[object, ...], int] = field(default_factory=dict)
    # Which upstreams get through to which site, as this endpoint learned it.
    standing: Standing = field(default_factory=Standing)
    pages: Pages = field(default_factory=Pages)  # answers to a URL by class (router/pages.py)
    # What this endpoint's own traffic said of each (proxy, site), for the log.
    tally: Tally = field(default_factory=lambda: Tally())
    # The operator's rules for reading sites' answers (events/sites.py), from the feed.
    rules: tuple[SiteRule, ...] = ()
    _lists: dict[tuple[object, ...], list[Upstream]] = field(default_factory=dict)
    _spent: _Spent = field(default_factory=lambda: _Spent())

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
                    f.latency_ms, f.exit_ip, f.last_seen,
                )  # fmt: skip
            else:
                up.proto, up.country, up.asn, up.anonymity = f.proto, f.country, f.asn, f.anonymity
                up.https, up.mitm, up.latency_ms = f.https, f.mitm, f.latency_ms
                up.exit_ip, up.last_seen = f.exit_ip, f.last_seen
            new[key] = up
        self.upstreams = new
        self._lists, self._spent = {}, _Spent()
        self.standing.let_go(old.keys() - new.keys())

    def pick(
        self,
        want: Want,
        *,
        tunnel: bool,
        now: float,
        exclude: frozenset[tuple[str, int]] = frozenset(),
        site: str = "",
    ) -> Upstream | None:
        """The upstream for the next attempt to ``site``, or None when nothing matches."""
        closed = self._spent.closed.get(site) if site else None
        if closed is not None and now < closed[0] and closed[1] is self._matching(want, tunnel):
            return None  # the site closed every one this login may take (``_Spent``)
        if want.session:
            sticky = self.sessions.get((want.consumer, want.session))
            if sticky is not None and now - sticky[1] <= want.session_min * 60:
                up = self.upstreams.get(sticky[0])
                if (
                    up is not None
                    and up.key not in exclude
                    and up.avoid_until <= now
                    and _open(up, site, now)
                    and want.fits(up, tunnel)
                ):
                    return self._use(up, want, now, site)
            # A new session's upstream by its name, in key order from there: the same on
            # every worker of the endpoint with the same pool (ops/cli/workers.py).
            listed = self._matching(want, tunnel)
            start = zlib.crc32(f"{want.consumer}\0{want.session}".encode())
            for step in range(len(listed)):
                up = listed[(start + step) % len(listed)]
                if up.key not in exclude and up.avoid_until <= now and _open(up, site, now):
                    return self._use(up, want, now, site)
        # Known to get through first, for the strategies that choose, but for a share of
        # plain HTTP that explores (router/standing.py); a round robin goes in turn over
        # every proxy the site has not turned away.
        if (
            site
            and want.strategy != "roundrobin"
            and (known := self._known(site, want, tunnel, now, exclude))
        ):
            # A request's first attempt only: a miss is tried again through a known one.
            if not tunnel and not exclude and EXPLORE and self.rng.random() < EXPLORE:
                sample = _sample(self._matching(want, False), self.rng)
                if ready := _unknown(sample, self.standing.through[site], site, now):
                    return self._use(_chosen(ready, want, self.rng), want, now, site)
            return self._use(_weighted(_least_used(known, site, now), self.rng), want, now, site)
        return self._any(want, tunnel, now, exclude, site)

    def _any(
        self, want: Want, tunnel: bool, now: float, exclude: frozenset[tuple[str, int]], site: str
    ) -> Upstream | None:
        """An upstream of the login's by its strategy, whatever its standing with ``site``
        but a block."""
        listed = self._matching(want, tunnel)
        if not listed:
            return None

        minute = int(now // 60)

        def may(u: Upstream) -> bool:
            return u.key not in exclude and u.avoid_until <= now and _open(u, site, now)

        def within(u: Upstream) -> bool:
            return may(u) and _within_budget(u, site, minute)

        # One sample for both: once every proxy has spent its budget at a busy site,
        # a pick drew a second sample for those past it; one past its budget goes only
        # once none within it may.
        sample = _sample(listed, self.rng)
        ready = self._spent.ready(listed, within, site, minute, self.rng, sample) if site else []
        ready = ready or _ready(listed, may, self.rng, sample)
        if not ready:  # every one avoided or tried: the soonest back rather than none
            left = [u for u in listed if u.key not in exclude and _open(u, site, now)]
            if not left:
                if site:
                    self._spent.close(listed, site, now)
                return None
            return self._use(min(left, key=lambda u: (u.avoid_until, u.key)), want, now, site)
        if want.strategy == "roundrobin":
            cursor = (*want.filters(), tunnel)
            i = self.cursors.get(cursor, 0)
            for step in range(len(listed)):  # the next in turn that may go now
                up = listed[(i + step) % len(listed)]
                if may(up):
                    self.cursors[cursor] = i + step + 1
                    return self._use(up, want, now, site)
        return self._use(_chosen(ready, want, self.rng), want, now, site)

    def _known(
        self, site: str, want: Want, tunnel: bool, now: float, exclude: frozenset[tuple[str, int]]
    ) -> list[Upstream]:
        """Upstreams known to get through to ``site`` that may take this request: a sample,
        then as far as it takes to find some when the sample has none (``_walk``)."""
        ups = self.standing.known(site)
        if not ups:
            return []
        minute = int(now // 60)

        def within(u: Upstream) -> bool:
            return (
                u.key not in exclude
                and u.avoid_until <= now
                and u.paced.get(site, 0.0) <= now
                and _within_budget(u, site, minute)
                and want.fits(u, tunnel)
            )

        return self._spent.ready(ups, within, site, minute, self.rng)

    def got_through(self, up: Upstream, site: str, alike_at: float = 0.0) -> None:
        """An answer through ``up`` was ``site``'s own page; ``alike_at`` (loop time):
        read so only because answers to its URL were alike, on a site not seen telling a
        page from its block, so held from the log a while (router/tally.py)."""
        if alike_at:
            self.tally.hold(up, site, alike_at)
        else:
            self.tally.count(up, site, 0)
        if self.upstreams.get(up.key) is up:  # not one that left the pool meanwhile
            self.standing.got_through(up, site)
            self._spent.reopened(site)

    def turned_away(self, up: Upstream, site: str, now: float) -> None:
        """``site`` turned a request through ``up`` away: not for that site a while."""
        self.tally.count(up, site, 1)
        self._turn_away(up, site, now)

    def _turn_away(self, up: Upstream, site: str, now: float) -> None:
        if len(up.turned_away) >= _PER_UPSTREAM:  # what has run out goes first
            up.turned_away = {s: t for s, t in up.turned_away.items() if t > now}
        up.turned_away[site] = now + SITE_BLOCK_S
        self.standing.lost(up, site)

    def heard(self, cells: Iterable[tuple[str, int, str, str]], now: float) -> int:
        """The fleet's word on proxies and sites (``ip, port, site, standing``; the feed
        brings what moved, endpoint/feed.py): through, or turned away for
        ``SITE_BLOCK_S``, as if seen here, without counting it as this endpoint's own
        verdict; proxies not in the pool are left out. How many were taken."""
        taken = 0
        for ip, port, site, standing in cells:
            up = self.upstreams.get((ip, port))
            if up is None:
                continue
            taken += 1
            if standing == THROUGH:
                self.standing.got_through(up, site)
                self._spent.reopened(site)
            elif standing == BLOCKED:
                self._turn_away(up, site, now)
        return taken

    def _matching(self, want: Want, tunnel: bool) -> list[Upstream]:
        """The upstreams a login's filters allow, in key order, kept until the next
        ``replace``: a pick looks at a few of them, not at the whole pool."""
        key = (*want.filters(), tunnel)
        found = self._lists.get(key)
        if found is None:
            if len(self._lists) > 10_000:
                self._lists.clear()
            found = sorted(
                (u for u in self.upstreams.values() if want.fits(u, tunnel)),
                key=lambda u: u.key,
            )
            self._lists[key] = found
        return found

    def _use(self, up: Upstream, want: Want, now: float, site: str = "") -> Upstream:
        up.used_at = now
        if site:
            minute = int(now // 60)
            used = up.site_uses.get(site)
            if used is None and len(up.site_uses) >= _PER_UPSTREAM:  # past minutes go
                up.site_uses = {s: u for s, u in up.site_uses.items() if u[0] == minute}
            up.site_uses[site] = (minute, used[1] + 1 if used and used[0] == minute else 1)
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
        doublings = min(up.strikes - 1, _DOUBLINGS)
        up.avoid_until = now + min(AVOID_S, AVOID_FIRST_S * 2**doublings)


@dataclass
class _Spent:
    """Where a pick's list has nothing for a site, remembered for as long as that holds,
    so the picks meanwhile do not walk the whole list again to find so (each entry holds
    its list, so no other list has its id while it stands; docs/decisions.md, The
    endpoint):

    - ``budgets``: every upstream of the list had spent its budget at the site this
      minute, which holds to the minute's end (its uses only grow, and a site's pace
      never sets a budget above the uses);
    - ``closed``: every upstream of the list was turned away or paced at the site, which
      holds until the soonest of them is back (a block and a pace only ever lengthen),
      unless one gets through there meanwhile (``reopened``).
    """

    budgets: dict[tuple[str, int], tuple[int, list[Upstream]]] = field(default_factory=dict)
    # site -> (until, the list), for the login's list whose picks found it so
    closed: dict[str, tuple[float, list[Upstream]]] = field(default_factory=dict)

    def ready(
        self,
        listed: list[Upstream],
        within: Callable[[Upstream], bool],
        site: str,
        minute: int,
        rng: random.Random,
        sample: list[Upstream] | None = None,
    ) -> list[Upstream]:
        """``_ready`` for those of ``listed`` that are ``within`` (one that may go and
        has not spent its budget at ``site`` this ``minute``); none at once where every
        one of them had spent it earlier in the minute."""
        if len(listed) <= SAMPLE:  # the sample is all of them: no walk to spare
            return _ready(listed, within, rng, sample)
        key = (site, id(listed))
        spent = self.budgets.get(key)
        if spent is not None and spent[0] == minute:
            return []
        found = _ready(listed, within, rng, sample)
        if not found and not any(_within_budget(u, site, minute) for u in listed):
            if len(self.budgets) >= _SPENT_LISTS:  # past minutes' go, or all
                this_minute = {k: v for k, v in self.budgets.items() if v[0] == minute}
                self.budgets = this_minute if len(this_minute) < _SPENT_LISTS else {}
            self.budgets[key] = (minute, listed)
        return found

    def close(self, listed: list[Upstream], site: str, now: float) -> None:
        """A pick found none of ``listed`` to take to ``site``: where the site closed
        every one of them (not only where the pick left some out or they are avoided),
        remembered until the soonest is back."""
        until = float("inf")
        for u in listed:
            back = max(u.turned_away.get(site, 0.0), u.paced.get(site, 0.0))
            if back <= now:  # open to it: what the pick left out, or avoided
                return
            until = min(until, back)
        if len(self.closed) >= _SPENT_LISTS:  # those back go, or all
            still = {s: c for s, c in self.closed.items() if c[0] > now}
            self.closed = still if len(still) < _SPENT_LISTS else {}
        self.closed[site] = (until, listed)

    def reopened(self, site: str) -> None:
        """An upstream got through to ``site`` (the block it had there is gone)."""
        self.closed.pop(site, None)


def _chosen(ready: list[Upstream], want: Want, rng: random.Random) -> Upstream:
    """Of ``ready``, the one the login's strategy takes (``lru``, else ``weighted``)."""
    if want.strategy == "lru":
        return min(ready, key=lambda u: (u.used_at, u.key))
    return _weighted(ready, rng)


def _weighted(ready: list[Upstream], rng: random.Random) -> Upstream:
    if len(ready) == 1:  # no weighing, no draw
        return ready[0]
    weights = [u.success / max(u.latency_ms, 50.0) for u in ready]
    return rng.choices(ready, weights=weights)[0]


def _least_used(known: list[Upstream], site: str, now: float) -> list[Upstream]:
    """Of ``known``, those that sent ``site`` the fewest requests this minute: a site's
    requests spread over the proxies known to get through, never piled on the fastest
    few until the site rate-limits them."""
    minute = int(now // 60)

    def used(u: Upstream) -> int:
        uses = u.site_uses.get(site)
        return uses[1] if uses is not None and uses[0] == minute else 0

    fewest = min(used(u) for u in known)
    return [u for u in known if used(u) == fewest]


def _sample(listed: list[Upstream], rng: random.Random) -> list[Upstream]:
    """``SAMPLE`` of them at random (all, when that many or fewer): the strategies weigh
    a sample (the power of a few choices), so a pick costs the same at 10 or 100,000
    proxies."""
    return listed if len(listed) <= SAMPLE else rng.sample(listed, SAMPLE)


def _ready(
    listed: list[Upstream],
    may: Callable[[Upstream], bool],
    rng: random.Random,
    sample: list[Upstream] | None = None,
) -> list[Upstream]:
    """Those of a sample of ``listed`` (``sample``, else one drawn) that ``may`` go; when
    there are none, as many as a walk finds (``_walk``), unless the sample was all of
    them: the walk would look at the same proxies again."""
    if sample is None:
        sample = _sample(listed, rng)
    found = [u for u in sample if may(u)]
    if found or len(sample) == len(listed):
        return found
    return _walk(listed, may, rng)


def _walk(
    listed: list[Upstream], may: Callable[[Upstream], bool], rng: random.Random
) -> list[Upstream]:
    """Where a pick's sample was unlucky or most are out (a site that turned most away):
    up to ``SAMPLE`` of ``listed`` that may go, in order from a random one on, so a pick
    looks as far as it takes to find them; at all of them only when fewer may go."""
    found, n = [], len(listed)
    start = rng.randrange(n)
    for step in range(n):
        if may(up := listed[(start + step) % n]):
            found.append(up)
            if len(found) == SAMPLE:
                break
    return found


def _unknown(
    sample: list[Upstream], known: Mapping[tuple[str, int], Upstream], site: str, now: float
) -> list[Upstream]:
    """Of ``sample``, those with no standing at ``site`` (not in ``known``) that may go
    now and have not spent their budget there, for a request that explores; none, and the
    known one goes. A sample, never a walk of the pool: at a busy site nearly every proxy
    has a standing, and each exploring request looked at all of them (docs/decisions.md,
    The endpoint)."""
    minute = int(now // 60)
    return [u for u in sample if u.key not in known and _free(u, site, now, minute)]


def _free(up: Upstream, site: str, now: float, minute: int) -> bool:
    """Whether ``up`` may take a request to ``site`` now: not avoided, not turned away
    or paced there, and with its budget there not spent (for no site: not avoided)."""
    return (
        up.avoid_until <= now
        and _open(up, site, now)
        and (not site or _within_budget(up, site, minute))
    )


def _within_budget(up: Upstream, site: str, minute: int) -> bool:
    """Whether ``up`` sent ``site`` fewer requests this ``minute`` than it takes there:
    ``SITE_BUDGET``, or what the site let through before it rate-limited it (``pace``)."""
    used = up.site_uses.get(site)
    return used is None or used[0] != minute or used[1] < up.tolerated.get(site, SITE_BUDGET)


def _open(up: Upstream, site: str, now: float) -> bool:
    """Whether ``site`` has neither turned ``up`` away lately nor paces it now (any
    upstream, for no site)."""
    return not site or (up.turned_away.get(site, 0.0) <= now and up.paced.get(site, 0.0) <= now)


PACE_S = 60.0  # a rate limit without a Retry-After the endpoint can read paces this long
MAX_PACE_S = SITE_BLOCK_S


def pace(up: Upstream, site: str, now: float, after_s: float | None) -> None:
    """``site`` rate-limited a request through ``up``: not there for the time it asked
    (``PACE_S`` when unsaid, at most ``MAX_PACE_S``), and from then on at most the
    requests a minute it let through before (at least one). Never a block: the proxy
    gets through, the site wants it slower."""
    if len(up.paced) >= _PER_UPSTREAM:  # what has run out goes first
        up.paced = {s: t for s, t in up.paced.items() if t > now}
    wait = PACE_S if after_s is None else min(max(after_s, 1.0), MAX_PACE_S)
    # Never shortened: of two requests under way through it, the longer wait holds.
    up.paced[site] = max(up.paced.get(site, 0.0), now + wait)
    minute, used = up.site_uses.get(site, (0, 0))
    if minute == int(now // 60) and len(up.tolerated) < _PER_UPSTREAM:
        up.tolerated[site] = max(1, used - 1)
