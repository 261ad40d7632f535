"""A check round as one message: ``ProxiesChecked`` to and from the single events it stands for.

Two thirds of a log of single events are ``ProxyWorked``, each paying its own transport,
envelope, decode and admission. From the ``batches`` setting, producers group a round's
results (``group``) and the fold expands each back (``expand``) into the very
``ProxyWorked`` and ``ProxyFailed`` it folds today, so every rule (validation, roles,
quotas, trust, provenance, counts by type) is the one it was, applied per result. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from events.catalogue import CheckResult, Event, ProxiesChecked, ProxyFailed, ProxyWorked
from events.subjects import shard_of

__all__ = ["MAX_RESULTS", "MAX_RESULTS_BYTES", "TRAFFIC_KEY", "expand", "group"]

MAX_RESULTS = 500  # results one ProxiesChecked may carry
# Of a message's encoded results: well under the stream's 256 KiB message limit, with
# room for the envelope and the agent's subject.
MAX_RESULTS_BYTES = 128 * 1024
# The one key of a consumer's rounds (its traffic through the rotating endpoint).
TRAFFIC_KEY = "traffic"

_encode = msgspec.json.Encoder().encode


def expand(batch: ProxiesChecked) -> list[ProxyWorked | ProxyFailed]:
    """The single events the round's results stand for, under the round's envelope."""
    out: list[ProxyWorked | ProxyFailed] = []
    eid, agent, at, v, lease, source = (
        batch.id,
        batch.agent,
        batch.at,
        batch.v,
        batch.lease,
        batch.source,
    )
    for r in batch.results:
        if r.ok:
            out.append(
                ProxyWorked(
                    id=eid,
                    agent=agent,
                    at=at,
                    v=v,
                    ip=r.ip,
                    port=r.port,
                    proto=r.proto,
                    latency_ms=r.latency_ms,
                    exit_ip=r.exit_ip,
                    anonymity=r.anonymity,
                    mitm=r.mitm,
                    source=source,
                    judge=r.judge,
                    lease=lease,
                    https=r.https,
                )
            )
        else:
            out.append(
                ProxyFailed(
                    id=eid,
                    agent=agent,
                    at=at,
                    v=v,
                    ip=r.ip,
                    port=r.port,
                    proto=r.proto,
                    error=r.error,
                    lease=lease,
                )
            )
    return out


def _result(e: ProxyWorked | ProxyFailed) -> CheckResult:
    if isinstance(e, ProxyWorked):
        return CheckResult(
            ip=e.ip,
            port=e.port,
            proto=e.proto,
            latency_ms=e.latency_ms,
            exit_ip=e.exit_ip,
            anonymity=e.anonymity,
            mitm=e.mitm,
            https=e.https,
            judge=e.judge,
        )
    return CheckResult(ip=e.ip, port=e.port, proto=e.proto, ok=False, error=e.error)


def group(events: Iterable[Event], key: str = "") -> list[Event]:
    """``events`` with their ``ProxyWorked`` and ``ProxyFailed`` gathered into one
    ``ProxiesChecked`` per lease and source (in the order each group first appears),
    at most ``MAX_RESULTS`` results and ``MAX_RESULTS_BYTES`` each; other events keep
    their places. A group's id, agent and clock are its first event's. Its partition key
    is ``key`` when given (a deposit's), else its source's url_id, else the recheck
    shard of its first proxy (a checker's round is one shard a lease)."""
    out: list[Event] = []
    open_: dict[tuple[str, str, str], tuple[int, list[CheckResult], int]] = {}
    for event in events:
        if not isinstance(event, ProxyWorked | ProxyFailed):
            out.append(event)
            continue
        source = event.source if isinstance(event, ProxyWorked) else ""
        where = (event.agent, event.lease, source)
        result = _result(event)
        size = len(_encode(result)) + 1
        slot = open_.get(where)
        if slot is not None:
            at, results, used = slot
            if len(results) < MAX_RESULTS and used + size <= MAX_RESULTS_BYTES:
                results.append(result)
                open_[where] = (at, results, used + size)
                continue
        results = [result]
        open_[where] = (len(out), results, size)
        out.append(
            ProxiesChecked(
                id=event.id,
                agent=event.agent,
                at=event.at,
                key=key or source or shard_of(event.ip, event.port),
                results=results,
                lease=event.lease,
                source=source,
            )
        )
    return out
