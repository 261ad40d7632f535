"""What one actor may take of this gateway, decided before the cost is paid.

Each bound is a figure here (docs/architecture.md §5, Bounds per actor), checked before
the bytes are written to the log, sent, or the proxy handed out; each refusal is
counted per actor and bound (``Refusals``: ``/v1/agents`` shows the counts to the
admin only, since who is active is nobody else's business) and logged, at most once a
minute per actor and bound, with the count since. Every gateway keeps its own
buckets: with G gateways an actor may take G times a figure, never more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog
from aiohttp import web

__all__ = [
    "ANONYMOUS_POOL_SHARE",
    "CONSUMER_LOG_BURST",
    "CONSUMER_LOG_BYTES_PER_HOUR",
    "JUDGE_BYTES_BURST",
    "JUDGE_BYTES_PER_HOUR",
    "REFUSALS",
    "REPORTS_BURST",
    "REPORTS_PER_HOUR",
    "UNTESTED_LOG_BURST",
    "UNTESTED_LOG_BYTES_PER_HOUR",
    "RateLimiter",
    "Refusals",
]

log = structlog.get_logger("ppf.bounds")

MIB = 1024 * 1024
# An untested agent's observations reach the log only through a gateway (its NATS login
# is refused: gateway/natsauth.py), as message bytes from a bucket of its own: 4 MiB at
# once, 16 MiB an hour. Five times what the fold's own quota of 20,000 proxies an hour
# takes as rounds; what passes is what the fold's quotas then judge.
UNTESTED_LOG_BURST = 4 * MIB
UNTESTED_LOG_BYTES_PER_HOUR = 16 * MIB
# A consumer's traffic rounds (what the rotating endpoint saw of its requests, sent
# under its token a round a second): 8 MiB at once, 256 MiB an hour, about 500 outcomes
# a second held up for the hour.
CONSUMER_LOG_BURST = 8 * MIB
CONSUMER_LOG_BYTES_PER_HOUR = 256 * MIB
# ``/judge/bytes`` per agent: twice what a checker's own speed budget spends an hour
# (agents/speed.py, 32 MiB), an hour's worth at once. Consumers none: nothing of theirs
# downloads from the judge.
JUDGE_BYTES_PER_HOUR = 64 * MIB
JUDGE_BYTES_BURST = JUDGE_BYTES_PER_HOUR
# Callers without a token hold together at most this share of the served pool through
# the drop-in ``/pop/`` (at least one proxy), whatever addresses they call from.
ANONYMOUS_POOL_SHARE = 0.05
# A consumer's ``blocked`` and ``worked`` reports (its ``failed`` ones have the fold's
# ``report_budget_per_hour``): a burst, then this many an hour.
REPORTS_BURST = 100
REPORTS_PER_HOUR = 600
_ACTORS = 10_000  # actors counted per bound; past it, the fewest refused are let go
_LOG_EVERY_S = 60.0


@dataclass(slots=True)
class RateLimiter:
    """A token bucket per key (a caller's token, a peer address)."""

    rate: float
    burst: float
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    max_keys: int = 100_000  # past it, full buckets are forgotten (they hold no state)

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self.buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def take(self, key: str, cost: float = 1.0) -> float:
        """0 when allowed (``cost`` taken), else the seconds to wait (nothing taken)."""
        now = time.monotonic()
        tokens = self._tokens(key, now)
        if tokens < cost:
            self.buckets[key] = (tokens, now)
            return (min(cost, self.burst) - tokens) / self.rate
        if len(self.buckets) >= self.max_keys and key not in self.buckets:
            self.buckets = {
                k: v for k, v in self.buckets.items() if self._tokens(k, now) < self.burst
            }
        self.buckets[key] = (tokens - cost, now)
        return 0.0

    def wait(self, key: str) -> float:
        """The seconds until ``key`` may take again (0: now), taking nothing."""
        tokens = self._tokens(key, time.monotonic())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate


class Refusals:
    """How often each actor met each bound, and one log line a minute per pair."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}  # bound -> actor -> refusals
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

    def refused(self, bound: str, actor: str, why: str, **detail: object) -> None:
        counts = self.counts.setdefault(bound, {})
        counts[actor] = counts.get(actor, 0) + 1
        if len(counts) > _ACTORS:
            del counts[min(counts, key=counts.__getitem__)]
        now = time.monotonic()
        at, count = self._logged.get((bound, actor), (-_LOG_EVERY_S, 0))
        if now - at >= _LOG_EVERY_S:
            if len(self._logged) > _ACTORS:
                self._logged.clear()
            self._logged[(bound, actor)] = (now, counts[actor])
            log.warning(
                "bound_refused",
                bound=bound,
                actor=actor[:64],
                why=why,
                since_last=counts[actor] - count,
                **detail,
            )

    def of(self, actor: str) -> dict[str, int]:
        """``actor``'s refusals by bound (none: empty)."""
        return {b: c[actor] for b, c in sorted(self.counts.items()) if actor in c}


REFUSALS = web.AppKey("refusals", Refusals)
