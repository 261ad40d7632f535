"""The checkers' work as this gateway hands it out: which recheck shards are work now,
what a granted shard carries (its due proxies, and the TARGET probes due in it), and
which networks' outages wait for a second vantage (projections/core/recheck.py and
projections/core/probes.py hold the rules; this keeps their costly inputs a moment)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from events.mint import now_ms
from events.sites import path_of
from events.wire import RecheckPayload
from gateway.budget import CheckBudget
from projections.core.probes import PROBE_GAP_MS, targets, wanted
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

__all__ = ["Probing", "RecheckWork"]


@dataclass(frozen=True, slots=True)
class Probing:
    """How this gateway hands out TARGET probes (projections/core/probes.py): the sites
    never probed, and how many probes of one site it hands out a minute (the fleet's
    rate per site, per gateway)."""

    never: tuple[str, ...] = ()
    per_site_per_minute: int = 30
    per_payload: int = 200  # probes a shard's lease carries at most
    scan: int = 50_000  # (proxy, site) pairs looked at a refresh for shards due a probe


class RecheckWork:
    """The shards and outages of one gateway's fold, each recomputed at most so often
    (a pool scan), the hourly budget of checks it hands out, and the probes it handed
    out lately (this gateway's memory)."""

    def __init__(
        self, fold: FoldService, policy: RecheckPolicy | None = None, probing: Probing | None = None
    ) -> None:
        self.fold = fold
        self.batch = 500  # proxies a shard's lease carries at most
        self.budget = CheckBudget()
        self.shards_refresh_s = 5.0
        self.probing = probing or Probing()
        self._handed: dict[tuple[str, int, str], int] = {}  # probe -> log time handed out
        self._site_minute: dict[str, tuple[int, int]] = {}  # site -> (minute, probes)
        self._probe_due: set[str] = set()  # shards with a probe due, as the last scan saw
        self._scan_from = 0
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
        return [
            s
            for s, rows in self._shards().items()
            if s in self._probe_due or has_due(rows, now, policy, self._spot)
        ]

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
            probes=(probes := self._probes(shard, agent)),
            paths=self._paths({site for _, _, _, site in probes}),
        )

    def _paths(self, sites: set[str]) -> dict[str, str]:
        """Where the probes of ``sites`` ask: the path and query of the operator's URL of
        each target that has one (the root for the others, left out)."""
        urls = self.fold.state.site_urls
        return {site: path_of(urls[site]) for site in sites if site in urls}

    def _probes(self, shard: str, agent: str) -> list[tuple[str, int, str, str]]:
        """The probes due in ``shard`` for ``agent``, within each site's rate; each one
        handed out is remembered for ``PROBE_GAP_MS``."""
        self._probe_due.discard(shard)
        now, probing = now_ms(), self.probing
        state = self.fold.state
        own = agent in state.settings.trusted_agents  # the operator's own (reducers/trust.py)
        minute = now // 60_000
        # Only the sites with probes left this minute are looked at (a lease's payload
        # must not walk its shard for sites it may not probe).
        sites = [
            site
            for site in targets(state, own=own, never=probing.never, now=now)
            if self._used(site, minute) < probing.per_site_per_minute
        ]
        out: list[tuple[str, int, str, str]] = []
        rows = self._shards().get(shard, []) if sites else []
        for row, site in wanted(rows, sites, state, self._handed, now):
            used = self._used(site, minute)
            if used >= probing.per_site_per_minute:
                continue
            self._site_minute[site] = (minute, used + 1)
            self._handed[(row.ip, row.port, site)] = now
            out.append((row.ip, row.port, row.proto, site))
            if len(out) >= probing.per_payload:
                break
        return out

    def _used(self, site: str, minute: int) -> int:
        """Probes of ``site`` handed out in ``minute``."""
        at, used = self._site_minute.get(site, (minute, 0))
        return used if at == minute else 0

    def _scan_probes(self, rows_by_shard: dict[str, list[ProxyRow]]) -> None:
        """Shards with a probe due for the operator's own checkers, looking at no more
        than ``Probing.scan`` (proxy, site) pairs a refresh, from where the last scan
        stopped; and the probes handed out more than ``PROBE_GAP_MS`` ago let go."""
        now, probing, state = now_ms(), self.probing, self.fold.state
        self._handed = {k: t for k, t in self._handed.items() if t >= now - PROBE_GAP_MS}
        sites = targets(state, own=True, never=probing.never, now=now)
        if not sites:
            self._probe_due.clear()
            return
        names = sorted(rows_by_shard)
        budget = probing.scan
        for step in range(len(names)):
            shard = names[(self._scan_from + step) % len(names)]
            rows = rows_by_shard[shard]
            budget -= len(rows) * len(sites)
            if next(wanted(rows, sites, state, self._handed, now), None) is not None:
                self._probe_due.add(shard)
            if budget <= 0:
                self._scan_from = (self._scan_from + step + 1) % len(names)
                return

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
            self._scan_probes(self._rows)
            self._shards_at = time.monotonic()
        return self._rows
