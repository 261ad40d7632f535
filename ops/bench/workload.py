"""The pinned workload of ``ppf bench fold``: a fleet's observations, as rounds.

A number of observations (proxy checks) over a number of proxies, made the way the
fleet makes them: workers lease a source, fetch it, extract, check what it lists in a
round of 20 to 500 results (uniform) and release it, heartbeating on the way; checkers
lease a recheck shard and report its proxies, worked or failed, in one round. Each step
is one agent's unit of work, as the single events today's agents send
(``singles``), and the same step as the fleet sends it with the ``batches`` setting
(``rounds``: events.batches.group, exactly what ``GatewayClient.publish`` does), so two
streams of the same observations can be published side by side, in lockstep.
Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from events import (
    AgentEnrolled,
    Configured,
    Event,
    Extracted,
    Fetched,
    Heartbeat,
    Leased,
    ProxyFailed,
    ProxyWorked,
    Released,
    Role,
    Settings,
    SourceAdded,
    shard_of,
    url_id,
    uuid7,
)
from events.batches import group
from events.mint import fresh_id, now_ms

__all__ = ["Step", "seen_working", "steps"]

T0 = 1_790_000_000_000
PROTOS = ("http", "https", "socks4", "socks5")
ANON = ("transparent", "anonymous", "elite")


def seen_working(n: int, port: int, **more: Any) -> ProxyWorked:
    """The n-th proxy seen working on ``port``, as the gateway benches publish it (no
    lease, no source): its protocol and latency drawn from ``n``."""
    return ProxyWorked(
        id=fresh_id(),
        agent="bench",
        at=now_ms(),
        ip=_ip(n),
        port=port,
        proto=PROTOS[n % 4],
        latency_ms=20 + (n * 7919) % 3000,
        exit_ip=_ip(n),
        **more,
    )


def _ip(n: int) -> str:
    """The n-th proxy's address: spread over public /8s (1-99 but 10), never reserved."""
    a = 1 + (n >> 16) % 98
    a = a + 1 if a >= 10 else a
    return f"{a}.{(n >> 8) & 255}.{n & 255}.{1 + n % 250}"


class _Ids:
    """Ids in the order they are made, 64 to a millisecond, as agents stamp them."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> str:
        self.made += 1
        return uuid7(T0 + self.made // 64, self.made.to_bytes(10, "big"))


@dataclass(frozen=True, slots=True)
class Step:
    """One unit of work: its single events, the same as rounds, its observations."""

    singles: list[Event]
    rounds: list[Event]
    observations: int


def steps(
    observations: int = 1_000_000,
    *,
    proxies: int = 100_000,
    sources: int = 2_000,
    workers: int = 20,
    checkers: int = 5,
    seed: int = 1,
    first: int = 0,
) -> Iterator[Step]:
    """Steps until ``observations`` proxy checks have been made (the last round cut).
    ``first``: the proxies are the ``first``-th on (a burst of new ones onto a pool made
    by an earlier run), and the ids come after any earlier run's."""
    rng = random.Random(seed)
    eid = _Ids()
    if first:
        eid.made = 1 << 40

    names = [f"w{i:03d}" for i in range(workers)]
    checking = [f"c{i:03d}" for i in range(checkers)]
    setup: list[Event] = []
    for name in [*names, *checking]:
        role: Role = "worker" if name[0] == "w" else "checker"
        setup.append(
            AgentEnrolled(
                id=eid(), agent="admin", at=T0, name=name, role=role, token_sha256="0" * 64
            )
        )
    # As `ppf up` runs, but quotas too high to refuse anything (a fleet's day in a minute).
    settings = Settings(
        agent_subjects=True,
        trust=True,
        trusted_agents=(*checking, *names[: workers // 2]),
        quota_events_per_min=1 << 40,
        quota_proxies_per_hour=1 << 40,
        quota_sources_per_hour=1 << 40,
        resend_window=512,
        batches=True,
    )
    setup.append(Configured(id=eid(), agent="admin", at=T0, settings=settings))
    uids = []
    for i in range(sources):
        url = f"https://lists.example.net/{i}/proxies.txt"
        uids.append(url_id(url))
        setup.append(
            SourceAdded(id=eid(), agent="admin", at=T0, url=url, url_id=uids[-1], origin="seed")
        )
    yield Step(setup, setup, 0)
    # Workers' rounds walk over every proxy in turn (distinct within a round), so the
    # first ``proxies`` observations find them all; a checker's shard holds those seen.
    seen: list[int] = []
    shards: dict[str, list[int]] = {}
    cursor = [first]
    proxies += first
    left = observations
    cycle = 0
    while left > 0:
        cycle += 1
        if cycle % 5 == 0 and seen:
            step = _recheck(rng, eid, checking, shards, seen, min(left, rng.randint(20, 500)))
        else:
            step = _harvest(
                rng,
                eid,
                names,
                uids,
                proxies,
                seen,
                shards,
                cursor,
                min(left, rng.randint(20, 500)),
            )
        left -= step.observations
        yield step


def _worked(
    rng: random.Random, eid: str, agent: str, p: int, lease: str, source: str
) -> ProxyWorked:
    return ProxyWorked(
        id=eid,
        agent=agent,
        at=T0,
        ip=_ip(p),
        port=1024 + p % 50_000,
        proto=PROTOS[p % 4],
        latency_ms=rng.randrange(20, 3_000),
        exit_ip=_ip(p),
        anonymity=ANON[p % 3],  # type: ignore[arg-type]
        source=source,
        judge="ppf",
        lease=lease,
        https="yes" if p % 5 == 0 else "",
    )


def _harvest(
    rng: random.Random,
    eid: _Ids,
    names: list[str],
    uids: list[str],
    proxies: int,
    seen: list[int],
    shards: dict[str, list[int]],
    cursor: list[int],
    count: int,
) -> Step:
    """A worker's cycle: lease, fetch, extract, a round of ``count`` working proxies."""
    agent = names[rng.randrange(len(names))]
    s = rng.randrange(len(uids))
    uid = uids[s]
    lease = eid()
    head: list[Event] = [
        Leased(id=lease, agent=agent, at=T0, lease=lease, kind="source", target=uid, ttl_s=300),
        Fetched(
            id=eid(), agent=agent, at=T0, url_id=uid, lease=lease, ok=True, http_status=200,
            content_hash=f"{rng.getrandbits(64):016x}", bytes=rng.randrange(1 << 20),
            fetch_ms=rng.randrange(50, 5_000), changed=True,
        ),
        Extracted(
            id=eid(), agent=agent, at=T0, url_id=uid, count=count + rng.randrange(count * 10),
            extractor="bench", lease=lease,
        ),
    ]  # fmt: skip
    checks: list[Event] = []
    for i in range(count):
        p = cursor[0] % proxies  # a walk over every proxy: the first pass finds them all
        cursor[0] += 1
        shard = shards.setdefault(shard_of(_ip(p), 1024 + p % 50_000), [])
        if cursor[0] <= proxies:
            shard.append(p)
            seen.append(p)
        checks.append(_worked(rng, eid(), agent, p, lease, uid))
        if i % 100 == 99:  # heartbeats by time: about one a hundred checks
            checks.append(Heartbeat(id=eid(), agent=agent, at=T0, leases=[lease]))
    tail: list[Event] = [
        Released(id=eid(), agent=agent, at=T0, lease=lease, target=uid, outcome="done")
    ]
    return Step([*head, *checks, *tail], [*head, *group(checks), *tail], count)


def _recheck(
    rng: random.Random,
    eid: _Ids,
    checking: list[str],
    shards: dict[str, list[int]],
    seen: list[int],
    count: int,
) -> Step:
    """A checker's round: lease a shard, check its proxies (a fifth fail), release."""
    agent = checking[rng.randrange(len(checking))]
    p0 = seen[rng.randrange(len(seen))]
    shard = shard_of(_ip(p0), 1024 + p0 % 50_000)
    members = shards[shard]
    lease = eid()
    checks: list[Event] = []
    for _ in range(count):
        p = members[rng.randrange(len(members))]
        if rng.random() < 0.2:
            checks.append(
                ProxyFailed(
                    id=eid(), agent=agent, at=T0, ip=_ip(p), port=1024 + p % 50_000,
                    proto=PROTOS[p % 4], error="timeout", lease=lease,
                )
            )  # fmt: skip
        else:
            checks.append(_worked(rng, eid(), agent, p, lease, ""))
    head: list[Event] = [
        Leased(id=lease, agent=agent, at=T0, lease=lease, kind="recheck", target=shard, ttl_s=300)
    ]
    tail: list[Event] = [
        Released(
            id=eid(), agent=agent, at=T0, lease=lease, target=shard, outcome="done", kind="recheck"
        )
    ]
    return Step([*head, *checks, *tail], [*head, *group(checks), *tail], count)
