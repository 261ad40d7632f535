"""The router: who may ask (its door), which upstream carries a request (its pool), an
upstream connection opened hedged and retried, and what each outcome teaches.

Every client logs in (HTTP ``Proxy-Authorization: Basic``, SOCKS5 user/password) with its
consumer name, options (``router/login.py``) and token. A request goes only through a
proxy of the live pool, a tunnel only through one that can tunnel; when nothing matches,
503, never a direct connection. An upstream that refuses a connection or fails its
handshake is the proxy's failure: avoided here at once, reported under the consumer's
token, and the next upstream tried, at most ``attempts`` times within ``connect_s``
each. One that took the request and failed on its way to the site is the proxy's
failure only within the consumer's share (router/charges.py): the consumer names the
site. A target's own answer (a 404, a 500) is the proxy working. Each consumer has at
most ``max_per_consumer`` connections open. Plain HTTP is routed per client connection
(``router/forwarding.py``), tunnels by ``router/tunnels.py``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from endpoint.link.request import Request
from endpoint.link.tunnel import open_link
from endpoint.link.uplink import Idle, UpLink, idle_key
from endpoint.link.upstream import Upstream
from endpoint.router.charges import Charges, Record
from endpoint.router.choose import Pool
from endpoint.router.door import Door
from endpoint.router.handshakes import Handshakes
from endpoint.router.hedge import Hedged, Hedging
from endpoint.router.login import Want
from endpoint.router.outcomes import Outcomes
from endpoint.router.shares import Shares
from endpoint.router.verdicts import keep_block, read_answer, rule_of, site_of
from events.address import ADDRESS_RULE
from events.hosts import rules_host
from events.sites import COULD_NOT_GET, Answer
from events.validate import host_can_be_public

__all__ = ["Router"]

log = structlog.get_logger("ppf.serve")

T = TypeVar("T")

_CLOSED = Answer(status=0, closed=True)  # a connection the site closed before any answer


@dataclass
class Router:
    """The endpoint's routing, one per process: its settings, door, pool, hedges, idle
    links and counts, shared by every client connection."""

    pool: Pool
    login_ok: Callable[[str, str], Awaitable[bool]]
    # Whether a login worked lately (asking nobody): such a login passes an address's
    # limit of failed logins, so a flood from one address refuses no consumer known there.
    login_known: Callable[[str, str], bool] = lambda name, token: False
    # Each outcome of a consumer's traffic, the log's evidence (router/charges.py).
    record: Record | None = None
    attempts: int = 3
    connect_s: float = 5.0
    answer_s: float = 30.0
    head_s: float = 10.0  # a client's request head is read whole within this, or closed
    # A connection's login is asked again (of the feed's cache) when it is this old.
    login_recheck_s: float = 5.0
    # Failed logins per client address: a burst, then one per period; past them a login
    # is refused without asking the gateway (as the gateway limits its own callers).
    login_failures_burst: int = 20
    login_failures_per_s: float = 1.0
    max_per_consumer: int = 64
    # Loopback, private and internal destinations carried (a lab's own origins); never
    # otherwise: through a proxy they reach that proxy host's metadata service or admin.
    lab: bool = False
    outcomes: Outcomes = field(default_factory=Outcomes)
    # Second upstreams started beside slow connects, at most this many at once (0: none).
    hedges: int = 64
    idle: Idle = field(default_factory=Idle)
    # Sites whose TLS handshakes got through lately: what a TLS alert is read against.
    handshakes: Handshakes = field(default_factory=Handshakes)
    # What one consumer's refusals and failures may teach for everyone (router/shares.py).
    shares: Shares = field(default_factory=Shares)
    tasks: set[asyncio.Task[object]] = field(default_factory=set)  # the slow paths running
    # Whether a login still holds, asked of the gateways once its answer is old (the
    # feed's ``login_still``); None: ``login_ok``. The connections open under each login
    # (keep-alive and tunnels) are closed within ``login_recheck_s`` of its revocation.
    login_still: Callable[[str, str], Awaitable[bool]] | None = None

    def __post_init__(self) -> None:
        self.hedging = Hedging(self.outcomes.count, self.hedges)
        self.charges = Charges(self.pool, self.shares, self.outcomes, self.record)
        self.door = Door(
            self.login_ok,
            self.login_known,
            self.login_still,
            self.outcomes,
            self.tasks,
            login_recheck_s=self.login_recheck_s,
            login_failures_burst=self.login_failures_burst,
            login_failures_per_s=self.login_failures_per_s,
            max_per_consumer=self.max_per_consumer,
        )

    def close(self) -> None:
        """Close the idle upstream links and end the slow paths (the server itself is
        its caller's to close)."""
        self.idle.close()
        for task in self.tasks:
            task.cancel()

    def spawn(self, work: Coroutine[object, object, T]) -> asyncio.Task[T]:
        """A slow path run as a task, kept until it ends (``close`` ends it)."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def place(self, req: Request, name: str = "") -> None:
        """Where ``req`` goes, as far as routing asks: its site (of its host, or of the
        ``name`` a tunnel's ClientHello gave), and how that site's answers read
        (events/sites.py)."""
        req.site = site_of(name or req.host)
        req.rule = rule_of(self.pool, req.site)

    def refused_destination(self, host: str) -> str:
        """Why ``host`` may not be a destination ("" when it may): the address rule
        (events/address.py) for an address in any notation, and internal names or names
        that spell a non-public address; other names are resolved by the upstream."""
        if self.lab or _may_reach(host):
            return ""
        self.outcomes.count("destination_refused")
        return f"destination {host[:100]!r} is not on the public internet"

    def first_link(
        self,
        want: Want,
        password: str,
        req: Request,
        up: Upstream,
        key: tuple[object, ...],
        then: Callable[[UpLink | None], None],
    ) -> None:
        """A new link for ``req`` through ``up``, or through another upstream started
        beside it when its connect is slow (router/hedge.py), to ``then``; None: none
        got through. Its connects are the router's slow paths (``close`` ends them)."""
        first, picked = [up], set[tuple[str, int]]()

        def pick() -> Upstream | None:
            exclude, now = req.tried | picked, time.monotonic()
            nxt = first.pop() if first else self.pool.pick(
                want, tunnel=False, now=now, exclude=exclude, site=req.site
            )  # fmt: skip
            picked.update([nxt.key] if nxt is not None else [])
            return nxt

        def connect(u: Upstream) -> Coroutine[object, object, UpLink]:
            linked = key if u is up else idle_key(u, req.host, req.port)
            return open_link(u, req.host, req.port, linked, self.connect_s, self.answer_s)

        def failed(u: Upstream, exc: BaseException) -> None:
            req.tried |= {u.key}
            self.charges.not_opened(want, password, u, req.site, exc)

        def through(found: tuple[Upstream, UpLink] | None) -> None:
            then(None if found is None else found[1])

        Hedged(
            pick, connect, failed, UpLink.close, through, attempts=self.attempts - len(req.tried),
            connect_s=self.connect_s, hedging=self.hedging, spawn=self.spawn,
        ).start()  # fmt: skip

    def read(self, consumer: str, req: Request, link: UpLink, url: bytes) -> str:
        """What a whole answer of ``req``'s site through ``link`` says (router/verdicts.py
        ``read_answer``); the proxies its page told as the block are turned away, within
        ``consumer``'s share. At a site's first split, what answers alike said, held from
        the log, is unsaid, and how many is logged (router/tally.py)."""
        first = not self.pool.pages.splits(req.site)
        said, told = read_answer(self.pool, req.site, req.rule, link, url)
        self._told(consumer, req.site, first, told)
        return said

    def _told(self, consumer: str, site: str, first: bool, told: set[tuple[str, int]]) -> None:
        """After a reading: at ``site``'s ``first`` split, what answers alike said, held
        from the log, is unsaid; the proxies ``told`` as its block are turned away, within
        ``consumer``'s share."""
        if first and self.pool.pages.splits(site):
            unsaid = self.pool.tally.unsay_alike(site)
            log.info("site_splits", site=site, unsaid=unsaid)
        now = time.monotonic()
        for key in told:
            if (up := self.pool.upstreams.get(key)) is not None:
                self.charges.turned_away(consumer, up, site, now)

    def refused(
        self, want: Want, password: str, up: Upstream, req: Request, url: bytes, status: int,
        location: str,
    ) -> None:  # fmt: skip
        """``req``'s site turned it away through ``up`` by its answer's head (a 403, a
        redirect to a block page, the proxy's 502-504): turned away, and, for a site
        without a rule, kept as a class of ``url``, so the pages beside it read as the
        site's own (router/pages.py) and not as answers alike, held from the log; a
        redirect told as the block beside a page there splits the site, as a page read
        beside the block does (router/verdicts.py ``keep_block``)."""
        said = f"refused: {status}" if status in COULD_NOT_GET else ""
        self.charges.refused_through(want, password, up, req.site, said)
        if req.rule is None:
            first = not self.pool.pages.splits(req.site)
            answer = Answer(status=status, location=location)
            told = keep_block(self.pool, req.site, url, up.key, answer)
            self._told(want.consumer, req.site, first, told)

    def site_closed(
        self, want: Want, password: str, link: UpLink, req: Request, url: bytes
    ) -> bool:
        """A fresh connection ``link`` for ``req`` ended before any answer: whether
        it was the site's refusal (router/standing.py ``closed_on``), then turned away
        (not the proxy's failure) and kept as a refusal's class of ``url``."""
        if not self.pool.standing.closed_on(link.up, req.site, time.monotonic()):
            return False
        self.charges.refused_through(want, password, link.up, req.site, "closed")
        self.pool.pages.add(url, link.up.key, _CLOSED)
        return True


@functools.lru_cache(maxsize=8_192)
def _may_reach(host: str) -> bool:
    """Whether ``host`` could be on the public internet, read as an upstream reads it
    (percent-decoded, IDNA), as the fold reads hosts; the same few hosts come again and
    again, so each is read once (its address parsed, its spelling looked at)."""
    read, unreadable = rules_host(host)
    return not unreadable and host_can_be_public(read, rule=ADDRESS_RULE)
