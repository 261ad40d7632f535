"""Synthetic but realistic event streams, for benchmarks and load tests.

The mix follows a working fleet: mostly proxy confirmations, then fetch/extract cycles
of sources under leases, rechecks that fail, heartbeats and releases. Deterministic
for a seed, which is printed by every caller.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from events import (
    AgentEnrolled,
    Configured,
    Event,
    Extracted,
    Fetched,
    Heartbeat,
    Leased,
    Located,
    Outcome,
    ProxyFailed,
    ProxyWorked,
    Released,
    Role,
    Settings,
    SourceAdded,
    agent_msg_id,
    agent_subject,
    subject_for,
    uuid7,
)

__all__ = ["events", "route"]

PROTOS = ("http", "https", "socks4", "socks5")
ANON = ("transparent", "anonymous", "elite")


def _ip(n: int) -> str:
    # Spread over public /8s (1-99 skip 10), never a reserved range.
    a = 1 + (n >> 16) % 98
    a = a + 1 if a >= 10 else a
    return f"{a}.{(n >> 8) & 255}.{n & 255}.{1 + n % 250}"


def events(
    n: int,
    *,
    proxies: int = 100_000,
    sources: int = 10_000,
    agents: int = 20,
    seed: int = 1,
    located: bool = False,
) -> Iterator[Event]:
    """``n`` events; with ``located``, also one ``Located`` after the first confirmation
    of each distinct proxy, as the service publishes them (not counted in ``n``, so the
    two streams differ by exactly those)."""
    rng = random.Random(seed)
    ms = 1_790_000_000_000
    counter = 0

    def eid() -> str:
        nonlocal counter
        counter += 1
        return uuid7(ms + counter, counter.to_bytes(10, "big"))

    names = [f"w{i:03d}" for i in range(agents)]
    checkers = [f"c{i:03d}" for i in range(max(agents // 4, 1))]
    emitted = 0
    for name in [*names, *checkers]:
        role: Role = "worker" if name[0] == "w" else "checker"
        yield AgentEnrolled(
            id=eid(), agent="admin", at=ms, name=name, role=role, token_sha256="0" * 64
        )
        emitted += 1
    # As `ppf up` runs: agents on their own subjects, which the fold checks (issue 11),
    # and trust: the checkers and half the workers the operator's, the other half
    # earning it. Quotas counted and checked, but too high to refuse anything: the
    # bench sends a fleet's day in a minute.
    settings = Settings(
        agent_subjects=True,
        trust=True,
        trusted_agents=(*checkers, *names[: agents // 2]),
        quota_events_per_min=1 << 40,
        quota_proxies_per_hour=1 << 40,
        quota_sources_per_hour=1 << 40,
    )
    yield Configured(id=eid(), agent="admin", at=ms, settings=settings)
    emitted += 1
    urls = [f"https://lists.example.net/{i}/proxies.txt" for i in range(sources)]
    from events import url_id

    uids = [url_id(u) for u in urls]
    for u, uid in zip(urls, uids, strict=True):
        if emitted >= n:
            return
        yield SourceAdded(
            id=eid(),
            agent="admin",
            at=ms,
            url=u,
            url_id=uid,
            proto_hint=PROTOS[rng.randrange(4)],
            origin="seed",
        )
        emitted += 1
    # Fetch cycles, as a worker runs them: lease a source, fetch it, extract, report
    # the proxies of its list that work, heartbeat, release; checkers report failures
    # in between. Sources are visited in a fixed rotation and each lists its own slice
    # of the proxies, so N events reach min(N, proxies) distinct proxies.
    per_source = max(proxies // sources, 1)
    cursor = [0] * sources
    seen: set[int] = set()
    cycle = 0
    while True:
        s = (cycle * 7919) % sources
        cycle += 1
        agent = names[rng.randrange(agents)]
        uid = uids[s]
        lease = eid()
        working = per_source if per_source <= 50 else rng.randrange(per_source // 2, per_source)
        cycle_events: list[Event] = [
            Leased(id=lease, agent=agent, at=ms, lease=lease, kind="source", target=uid, ttl_s=300),
            Fetched(
                id=eid(),
                agent=agent,
                at=ms,
                url_id=uid,
                lease=lease,
                ok=rng.random() > 0.1,
                http_status=200,
                content_hash=f"{rng.getrandbits(64):016x}",
                bytes=rng.randrange(1 << 20),
                fetch_ms=rng.randrange(50, 5000),
                changed=rng.random() > 0.5,
            ),
            Extracted(
                id=eid(),
                agent=agent,
                at=ms,
                url_id=uid,
                count=working + rng.randrange(per_source + 1),
                extractor="bench",
                lease=lease,
            ),
        ]
        for i in range(working):
            p = (s + sources * (cursor[s] % per_source)) % proxies
            cursor[s] += 1
            cycle_events.append(
                ProxyWorked(
                    id=eid(),
                    agent=agent,
                    at=ms,
                    ip=_ip(p),
                    port=1024 + p % 50000,
                    proto=PROTOS[p % 4],
                    latency_ms=rng.randrange(20, 3000),
                    exit_ip=_ip(p),
                    anonymity=ANON[p % 3],  # type: ignore[arg-type]
                    source=uid,
                    lease=lease,
                )
            )
            if located and p not in seen:
                seen.add(p)
                cycle_events.append(
                    Located(id=eid(), agent="fold", at=ms, ip=_ip(p), country="DE", geo="bench")
                )
            if i % 25 == 24:
                cycle_events.append(Heartbeat(id=eid(), agent=agent, at=ms, leases=[lease]))
            if rng.random() < 0.08:
                q = rng.randrange(proxies)
                checker = checkers[rng.randrange(len(checkers))]
                cycle_events.append(
                    ProxyFailed(
                        id=eid(),
                        agent=checker,
                        at=ms,
                        ip=_ip(q),
                        port=1024 + q % 50000,
                        proto=PROTOS[q % 4],
                        error="timeout",
                    )
                )
        outcome: Outcome = "done" if rng.random() > 0.1 else "failed"
        cycle_events.append(
            Released(id=eid(), agent=agent, at=ms, lease=lease, target=uid, outcome=outcome)
        )
        for ev in cycle_events:
            if emitted >= n:
                return
            yield ev
            emitted += not isinstance(ev, Located)


_OBSERVATIONS = (Fetched, Extracted, ProxyWorked, ProxyFailed)


def route(event: Event) -> tuple[str, str]:
    """(subject, Nats-Msg-Id) as the fleet publishes it: an agent's observations on its
    own subjects under its scoped id, the rest on the service's subjects."""
    if isinstance(event, _OBSERVATIONS):
        return agent_subject(event), agent_msg_id(event)
    return subject_for(event), event.id
