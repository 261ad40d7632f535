"""The benchmarks' event streams: the pinned workload (ops/bench/workload.py) as one flat
stream of single events, and the subjects the fleet publishes them on.

Deterministic for a seed, which every caller prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from events import OBSERVATIONS, Event, Located, ProxyWorked, uuid7
from events.subjects import agent_msg_id, agent_subject, subject_for
from ops.bench.workload import steps

__all__ = ["events", "route"]


def events(
    n: int,
    *,
    proxies: int = 100_000,
    seed: int = 1,
    located: bool = False,
    rounds: bool = False,
) -> Iterator[Event]:
    """The first ``n`` single events of the workload; with ``located``, also one
    ``Located`` after the first confirmation of each distinct proxy, as the service
    publishes them (not counted in ``n``, so the two streams differ by exactly those).
    With ``rounds``, the workload as the fleet sends it from the ``batches`` setting:
    the steps of ``n`` observations, rounds and all."""
    if rounds:
        for step in steps(n, proxies=proxies, seed=seed):
            yield from step.rounds
        return
    emitted = 0
    seen: set[tuple[str, int]] = set()
    for step in steps(n, proxies=proxies, seed=seed):
        for event in step.singles:
            if emitted >= n:
                return
            yield event
            emitted += 1
            if located and isinstance(event, ProxyWorked) and (event.ip, event.port) not in seen:
                seen.add((event.ip, event.port))
                # Ids of their own (a top bit no workload id has), fixed by the order.
                rand = ((1 << 79) | len(seen)).to_bytes(10, "big")
                yield Located(
                    id=uuid7(event.at, rand), agent="fold", at=event.at, ip=event.ip,
                    country="DE", geo="bench",
                )  # fmt: skip


def route(event: Event) -> tuple[str, str]:
    """(subject, Nats-Msg-Id) as the fleet publishes it: an agent's observations on its
    own subjects under its scoped id, the rest on the service's subjects."""
    if isinstance(event, OBSERVATIONS):
        return agent_subject(event), agent_msg_id(event)
    return subject_for(event), event.id
