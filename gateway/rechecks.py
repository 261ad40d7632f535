"""The checkers' work as this gateway hands it out: which recheck shards are work now,
what a granted shard carries, and which networks' outages wait for a second vantage
(projections/core/recheck.py holds the rules; this keeps their costly inputs a moment)."""

from __future__ import annotations

import time

from events.mint import now_ms
from events.wire import RecheckPayload
from gateway.budget import CheckBudget
from projections.core.recheck import (
    RecheckPolicy,
    due_in_shard,
    for_another_vantage,
    has_due,
    network_outages,
    shards,
    spot_checks,
)
from projections.live import FoldService
from reducers import ProxyRow
from reducers.state import ProxyKey

__all__ = ["RecheckWork"]


class RecheckWork:
    """The shards and outages of one gateway's fold, each recomputed at most so often
    (a pool scan), and the hourly budget of checks it hands out."""

    def __init__(self, fold: FoldService, policy: RecheckPolicy | None = None) -> None:
        self.fold = fold
        self.batch = 500  # proxies a shard's lease carries at most
        self.budget = CheckBudget()
        self.shards_refresh_s = 5.0
        self._policy = policy
        self._rows: dict[str, list[ProxyRow]] = {}
        self._spot: set[ProxyKey] = set()  # spot-checks to take first (projections/recheck)
        self._shards_at = -1e9
        self._outages: list[dict[str, object]] = []
        self._outages_at = -1e9

    @property
    def policy(self) -> RecheckPolicy:
        """The intervals: the log's settings, unless this gateway was given its own."""
        return self._policy or RecheckPolicy.of(self.fold.state.settings)

    def due_shards(self, now: int) -> list[str]:
        """Shards with a proxy due now (an empty shard is no work: leasing it would have
        checkers spin); none while the budget's checks are handed out."""
        per_hour = self.fold.state.settings.recheck_budget_per_hour
        if per_hour and self.budget.available(per_hour, time.monotonic()) < 1:
            return []
        policy = self.policy
        return [s for s, rows in self._shards().items() if has_due(rows, now, policy, self._spot)]

    def payload(self, shard: str, agent: str, aside: set[str]) -> RecheckPayload:
        """The due proxies of ``shard`` for ``agent``, within the budget; ``aside``:
        networks whose failing proxies ``agent`` leaves to another checker."""
        rows = self._shards().get(shard, [])
        if aside:
            rows = [r for r in rows if not for_another_vantage(r, agent, aside)]
        per_hour = self.fold.state.settings.recheck_budget_per_hour
        room = self.budget.take(self.batch, per_hour, time.monotonic())
        due = due_in_shard(rows, now_ms(), room, self.policy, self._spot) if room else []
        self.budget.give_back(room - len(due), per_hour)
        return RecheckPayload(
            shard=shard,
            proxies=[(p.ip, p.port, p.proto) for p in due],
            latency_ms=[round(p.latency_ema) for p in due],
        )

    def network_outages(self, now: int, max_age_s: float = 30.0) -> list[dict[str, object]]:
        """``projections.core.recheck.network_outages``, computed at most every ``max_age_s``
        (a pool scan): ``GET /v1/outages`` serves it."""
        if time.monotonic() - self._outages_at > max_age_s:
            self._outages = network_outages(self.fold.state, now)
            self._outages_at = time.monotonic()
        return self._outages

    def left_to_others(self, agent: str, now: int) -> set[str]:
        """Networks in an outage only ``agent`` has seen, while another checker has been
        active in the last two minutes: their failing proxies wait for that one (a second
        vantage). With no other checker, nothing waits."""
        since = now - 120_000
        others = any(
            a.role == "checker" and a.name != agent and a.last_seen >= since
            for a in self.fold.state.agents.values()
        )
        if not others:
            return set()
        return {str(o["network"]) for o in self.network_outages(now) if not o["confirmed"]}

    def _shards(self) -> dict[str, list[ProxyRow]]:
        """Proxies by shard, recomputed at most every ``shards_refresh_s``."""
        if time.monotonic() - self._shards_at > self.shards_refresh_s:
            self._rows = shards(self.fold.state)
            self._spot = spot_checks(self.fold.state)
            self._shards_at = time.monotonic()
        return self._rows
