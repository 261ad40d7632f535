"""Who each outcome of a consumer's traffic is charged to: the proxy (avoided here at
once, and the consumer's report to the log), the site (turned away through that
proxy), or that consumer's own picks alone, past its shares (router/shares.py).

A connection the proxy refuses, or a handshake it breaks, is the proxy's: nothing the
consumer chose can cause it. A refusal in the proxy's own words (a SOCKS reply's code,
an HTTP proxy's status to CONNECT or its 502-504) is the site turning that proxy away.
Silence or nonsense once the proxy took the request is a failure on the way: a dead
proxy, or a site that never answers it, which the consumer named; charged to the proxy
for everyone only within the consumer's share of such failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from endpoint.link.tunnel import UpstreamRefused, UpstreamSilent
from endpoint.link.upstream import Upstream
from endpoint.router.choose import AVOID_S, Pool
from endpoint.router.login import Want
from endpoint.router.outcomes import Outcomes
from endpoint.router.shares import Shares

__all__ = ["Charges", "Record"]

log = structlog.get_logger("ppf.serve")

# Each outcome of a consumer's traffic (its token, its name, the upstream, worked,
# latency ms, why it failed): the log's evidence, sent in rounds (endpoint/feed.py).
Record = Callable[[str, str, Upstream, bool, float, str], None]


@dataclass
class Charges:
    """The endpoint's charges, one per process (the router's): its pool, its consumers'
    shares, its counts and the log's record."""

    pool: Pool
    shares: Shares
    outcomes: Outcomes
    record: Record | None = None

    def turned_away(self, consumer: str, up: Upstream, site: str, now: float) -> None:
        """``site`` turned a request of ``consumer``'s through ``up`` away: for everyone
        (and the log) within the consumer's share of the pool for that site, else for
        that consumer's own picks alone (router/shares.py)."""
        if self.shares.may_share(consumer, site, len(self.pool.upstreams), now):
            self.outcomes.count("turned_away")
            self.pool.turned_away(up, site, now)
        else:
            self.outcomes.count("turned_away_own")
            self.shares.keep_private(consumer, site, up.key, now)

    def refused_through(
        self, want: Want, password: str, up: Upstream, site: str, said: str
    ) -> None:
        """``site`` turned ``up`` away. ``said``: the refusal was the proxy's own word (a
        502-504, a close, a refused tunnel), and where the site let ``up`` through lately,
        that is as likely the proxy's way out gone as the site turning it away now: the
        checkers hear of it (the consumer's report, first in their queue), once until a
        check passed; a dead proxy a site was known for was otherwise never met again
        there, and served dead until its routine recheck."""
        known = up.key in self.pool.standing.through.get(site, ())
        self.turned_away(want.consumer, up, site, time.monotonic())
        if said and known and self._report(want, password, up, said, first=False):
            log.info("serve_upstream_suspect", proxy=up.url(), site=site, why=said)

    def left_out(self, consumer: str, site: str, now: float) -> frozenset[tuple[str, int]]:
        """The proxies ``consumer``'s own refusals and failures at ``site`` past its shares
        keep from its picks."""
        return self.shares.left_out(consumer, site, now) if site else frozenset()

    def not_opened(
        self, want: Want, password: str, up: Upstream, site: str, exc: BaseException
    ) -> None:
        """A new link through ``up`` to ``site`` did not open: refused in the proxy's own
        words (a SOCKS reply's code, an HTTP proxy's status to CONNECT), the site turning
        it away; silent once it took the site, a failure on the way; anything else (the
        OS's, a handshake broken or not SOCKS), the proxy's."""
        code = exc.code if isinstance(exc, UpstreamRefused) else None
        if site and code is not None and code != 407:
            # The proxy could not reach the site (its own words); a 403 or the like is
            # its policy, not its way out.
            said = f"tunnel refused: {code}" if code < 100 or code >= 500 else ""
            self.refused_through(want, password, up, site, said)
        elif isinstance(exc, UpstreamSilent):
            self.failed_on_the_way(want, password, up, site, f"connect: {exc}")
        else:
            self.failed(want, password, up, f"connect: {type(exc).__name__}: {exc}")

    def failed_on_the_way(
        self, want: Want, password: str, up: Upstream, site: str, why: str
    ) -> None:
        """``up`` took a request of ``want``'s consumer for ``site`` and failed on the way:
        a dead proxy, or a site that never answers it, which the consumer chose. The
        proxy's failure for everyone within the consumer's share of them (router/shares.py
        ``may_fail``); past it, left out of that consumer's picks at ``site`` alone for
        ``AVOID_S`` (counted ``upstream_failed_own``), still its report to the log, which
        the fold bounds per consumer."""
        now = time.monotonic()
        if not site or self.shares.may_fail(want.consumer, len(self.pool.upstreams), now):
            self.failed(want, password, up, why)
            return
        self.shares.keep_private(want.consumer, site, up.key, now, AVOID_S)
        self.outcomes.count("upstream_failed_own")
        log.info("serve_upstream_failed_own", proxy=up.url(), site=site, why=why[:200])
        self._report(want, password, up, why, first=False)

    def failed(self, want: Want, password: str, up: Upstream, why: str) -> None:
        self.pool.failed(up, time.monotonic())
        self.outcomes.count("upstream_failed")
        log.info("serve_upstream_failed", proxy=up.url(), why=why[:200])
        self._report(want, password, up, why, first=up.strikes == 1)

    def _report(self, want: Want, password: str, up: Upstream, why: str, first: bool) -> bool:
        """``up``'s failure to the log as the consumer's report (first in the checkers'
        queue), when it is the ``first`` in a row or a check passed since the last one
        said (log time against log time: no clock of ours); whether it went. Another one
        would only spend the consumer's hourly budget of reports on what the checkers
        have first already, but once a check passed they no longer do: a proxy whose
        failure was a burst's and that then died was served 15 minutes dead."""
        if self.record is None or not (first or up.last_seen > up.reported_seen):
            return False
        up.reported_seen = up.last_seen
        self.record(password, want.consumer, up, False, 0.0, why)
        return True

    def worked(self, want: Want, password: str, up: Upstream, started: float) -> None:
        ms = (time.perf_counter() - started) * 1000
        self.pool.worked(up, ms)
        if self.record is not None:
            self.record(password, want.consumer, up, True, ms, "")
