"""The churn lab's schedule: which proxy is up when, and how each one dies.

This module is the plan only, pure and seeded: the same seed gives the same schedule,
to the millisecond. The runner that plays it in the world in a box (real proxies on
public-looking addresses, killed and brought back as the plan says) is not built yet.

Profiles, in simulated seconds (``PROFILES``): ``steady`` (up about 10 min, down about
5, exponentially distributed), ``flappy`` (up about 60 s, down about 30 s) and
``outage`` (steady, then half of the proxies die at once at the run's midpoint and stay
down). A proxy dies in one of the three ways the world's do: ``refusing`` (its port
closed: a connect is refused at once), ``silent`` (its address gone: routed into the
box, owned by nobody, the connect times out) and ``tarpit`` (accepts, never answers).

Time is compressed by ``speed`` (1 to 10): a simulated second lasts ``1 / speed`` of a
wall second, and ppf's TTLs and intervals are divided by the same factor through
``Configured`` (``scaled``). Network timeouts are not: a check's timeout is wall time,
so it counts ``speed`` times longer in simulated time (at speed 10, a 5 s timeout is 50
simulated seconds: small against ``steady``'s 5 minutes down, but as long as a
``flappy`` death: run ``flappy`` at speed 2 or less, where it is 10 s).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import msgspec

from events import Settings

__all__ = [
    "DEATHS",
    "MAX_SPEED",
    "PROFILES",
    "RATES_KB_S",
    "Down",
    "Plan",
    "Profile",
    "plan",
    "scaled",
]

DEATHS = ("refusing", "silent", "tarpit")
RATES_KB_S = (40, 1_600)  # a shaped plan's slowest and fastest relays
MAX_SPEED = 10


@dataclass(frozen=True, slots=True)
class Profile:
    up_s: float  # mean time up, simulated seconds
    down_s: float  # mean time down
    mass_death_at: float | None = None  # share of the run at which half die at once


PROFILES = {
    "steady": Profile(up_s=600, down_s=300),
    "flappy": Profile(up_s=60, down_s=30),
    "outage": Profile(up_s=600, down_s=300, mass_death_at=0.5),
}


@dataclass(frozen=True, slots=True)
class Down:
    start_ms: int  # simulated time from the run's start
    end_ms: int  # up again from here (the run's end: still down when it ends)
    how: str  # one of DEATHS


@dataclass(frozen=True, slots=True)
class Plan:
    """One run: for proxy i, its server (``microsocks`` or ``tinyproxy``), its round
    trip, and when it is down and how."""

    profile: str
    seed: int
    duration_ms: int
    servers: tuple[str, ...]
    rtt_ms: tuple[int, ...]
    downs: tuple[tuple[Down, ...], ...]
    # Each relay's answers at most this fast, kilobytes a second (empty: as they come).
    rate_kb_s: tuple[int, ...] = ()

    def up(self, i: int, at_ms: int) -> bool:
        """The lab's truth: whether proxy ``i`` works at simulated time ``at_ms``."""
        return not any(d.start_ms <= at_ms < d.end_ms for d in self.downs[i])

    def up_count(self, at_ms: int) -> int:
        return sum(self.up(i, at_ms) for i in range(len(self.servers)))


def plan(
    profile: str, proxies: int = 200, seed: int = 1, duration_s: int = 3_600, shaped: bool = False
) -> Plan:
    """The schedule of a run of ``duration_s`` simulated seconds. Each proxy starts up
    (what a source page lists at the start works, as a fresh list's best entries do),
    then alternates exponential up and down times of the profile's means; ``outage``
    adds one mass death of half of them (a seeded half) that lasts to the end. With
    ``shaped``, each relay carries answers at its own rate (``RATES_KB_S``' span, evenly
    apart on a log scale, in a seeded order)."""
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r}: one of {', '.join(PROFILES)}")
    if proxies < 1 or duration_s < 1:
        raise ValueError("proxies and duration_s must be positive")
    p = PROFILES[profile]
    rng = random.Random(f"{profile}:{seed}")  # a string seed: stable across runs
    end = duration_s * 1000
    servers = tuple("microsocks" if i % 2 == 0 else "tinyproxy" for i in range(proxies))
    rtt = tuple(rng.randint(100, 400) for _ in range(proxies))
    mass = set(rng.sample(range(proxies), proxies // 2)) if p.mass_death_at is not None else set()
    mass_at = int(end * p.mass_death_at) if p.mass_death_at is not None else end
    downs = []
    for i in range(proxies):
        own: list[Down] = []
        t = int(rng.expovariate(1 / p.up_s) * 1000)
        horizon = mass_at if i in mass else end
        while t < horizon:
            length = max(1_000, int(rng.expovariate(1 / p.down_s) * 1000))
            own.append(Down(t, min(t + length, horizon), rng.choice(DEATHS)))
            t += length + max(1_000, int(rng.expovariate(1 / p.up_s) * 1000))
        if i in mass:
            if own and own[-1].end_ms >= mass_at:  # already down then: it stays down
                own[-1] = Down(own[-1].start_ms, end, own[-1].how)
            else:
                own.append(Down(mass_at, end, rng.choice(DEATHS)))
        downs.append(tuple(own))
    rates: tuple[int, ...] = ()
    if shaped:  # drawn after the schedule: a shaped plan's deaths are the unshaped one's
        low, high = RATES_KB_S
        span = [round(low * (high / low) ** (i / max(1, proxies - 1))) for i in range(proxies)]
        rng.shuffle(span)
        rates = tuple(span)
    return Plan(profile, seed, end, servers, rtt, tuple(downs), rates)


def scaled(settings: Settings, speed: float) -> Settings:
    """ppf's TTLs and intervals divided by ``speed`` (1 to ``MAX_SPEED``), so ppf runs
    on the lab's clock; what is not a duration is left as it is."""
    if not 1 <= speed <= MAX_SPEED:
        raise ValueError(f"speed {speed}: 1 to {MAX_SPEED}")
    durations = (
        "proxy_ttl_s",
        "recheck_failing_s",
        "recheck_fresh_s",
        "recheck_settled_s",
        "recheck_veteran_s",
        "recheck_dead_s",
        "spot_window_s",
        "min_interval_s",
        "max_interval_s",
    )
    values = msgspec.structs.asdict(settings)
    change = {name: max(1, round(values[name] / speed)) for name in durations}
    # Rates per (log-time) minute or hour: the lab's agents do ``speed`` times as much
    # in one.
    per_hour = (
        "recheck_budget_per_hour",
        "report_budget_per_hour",
        "quota_events_per_min",
        "quota_proxies_per_hour",
        "quota_sources_per_hour",
    )
    change |= {name: round(values[name] * speed) for name in per_hour}
    return msgspec.structs.replace(settings, **change)
