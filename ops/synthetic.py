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
    ProxyFailed,
    ProxyWorked,
    Released,
    Settings,
    SourceAdded,
    uuid7,
)

__all__ = ["events"]

PROTOS = ("http", "https", "socks4", "socks5")
ANON = ("transparent", "anonymous", "elite")


def _ip(n: int) -> str:
    # Spread over public /8s (1-99 skip 10), never a reserved range.
    a = 1 + (n >> 16) % 98
    a = a + 1 if a >= 10 else a
    return f"{a}.{(n >> 8) & 255}.{n & 255}.{1 + n % 250}"


def events(
    n: int, *, proxies: int = 100_000, sources: int = 10_000, agents: int = 20, seed: int = 1
) -> Iterator[Event]:
    rng = random.Random(seed)
    ms = 1_790_000_000_000
    counter = 0

    def eid() -> str:
        nonlocal counter
        counter += 1
        return uuid7(ms + counter, counter.to_bytes(10, "big"))

    names = [f"w{i:03d}" for i in range(agents)]
    emitted = 0
    for name in names:
        yield AgentEnrolled(
            id=eid(), agent="admin", at=ms, name=name, role="worker", token_sha256="0" * 64
        )
        emitted += 1
    yield Configured(id=eid(), agent="admin", at=ms, settings=Settings())
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
    held: list[tuple[str, int, str]] = []  # (lease, source index, agent)
    per_source = max(proxies // sources, 1)
    while emitted < n:
        roll = rng.random()
        agent = names[rng.randrange(agents)]
        if roll < 0.72 and held:
            # A worker confirms a proxy listed on the source it holds a lease on; each
            # list holds its own slice of the proxies, as real lists mostly do.
            lease, s, agent = held[rng.randrange(len(held))]
            p = (s + sources * rng.randrange(per_source)) % proxies
            ev: Event = ProxyWorked(
                id=eid(),
                agent=agent,
                at=ms,
                ip=_ip(p),
                port=1024 + p % 50000,
                proto=PROTOS[p % 4],
                latency_ms=rng.randrange(20, 3000),
                exit_ip=_ip(p),
                anonymity=ANON[p % 3],
                source=uids[s],
                lease=lease,
            )
        elif roll < 0.78:
            p = rng.randrange(proxies)
            ev = ProxyFailed(
                id=eid(),
                agent=agent,
                at=ms,
                ip=_ip(p),
                port=1024 + p % 50000,
                proto=PROTOS[p % 4],
                error="timeout",
            )
        elif roll < 0.83 or not held:
            s = rng.randrange(sources)
            lease = eid()
            held.append((lease, s, agent))
            ev = Leased(
                id=lease, agent=agent, at=ms, lease=lease, kind="source", target=uids[s], ttl_s=300
            )
        elif roll < 0.88:
            lease, s, holder = held[rng.randrange(len(held))]
            uid = uids[s]
            ok = rng.random() > 0.1
            ev = Fetched(
                id=eid(),
                agent=holder,
                at=ms,
                url_id=uid,
                lease=lease,
                ok=ok,
                error="" if ok else "timeout",
                http_status=200 if ok else 0,
                content_hash=f"{rng.getrandbits(64):016x}",
                bytes=rng.randrange(1 << 20),
                fetch_ms=rng.randrange(50, 5000),
                changed=rng.random() > 0.5,
            )
        elif roll < 0.92:
            lease, s, holder = held[rng.randrange(len(held))]
            uid = uids[s]
            ev = Extracted(
                id=eid(),
                agent=holder,
                at=ms,
                url_id=uid,
                count=rng.randrange(0, 2000),
                extractor="bench",
                lease=lease,
            )
        elif roll < 0.96:
            ev = Heartbeat(
                id=eid(), agent=agent, at=ms, leases=[h[0] for h in held[-3:] if h[2] == agent]
            )
        else:
            lease, s, holder = held.pop(rng.randrange(len(held)))
            uid = uids[s]
            ev = Released(
                id=eid(),
                agent=holder,
                at=ms,
                lease=lease,
                target=uid,
                outcome="done" if rng.random() > 0.2 else "failed",
            )
        if len(held) > 500:
            held.pop(0)
        yield ev
        emitted += 1
