"""A check round as one message: ``ProxiesChecked`` to and from the single events it stands for.

Two thirds of a log of single events are ``ProxyWorked``, each paying its own transport,
envelope, decode and admission. From the ``batches`` setting, producers group a round's
results (``group``) and the fold expands each back (``expand``) into the very
``ProxyWorked`` and ``ProxyFailed`` it folds today, so every rule (validation, roles,
quotas, trust, provenance, counts by type) is the one it was, applied per result. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from events.catalogue import CheckResult, Event, ProxiesChecked, ProxyFailed, ProxyWorked
from events.subjects import shard_of

__all__ = ["MAX_RESULTS", "MAX_RESULTS_BYTES", "TRAFFIC_KEY", "expand", "group", "observation"]

MAX_RESULTS = 500  # results one ProxiesChecked may carry
# Of a message's encoded results: well under the stream's 256 KiB message limit, with
# room for the envelope and the agent's subject.
MAX_RESULTS_BYTES = 128 * 1024
# The one key of a consumer's rounds (its traffic through the rotating endpoint).
TRAFFIC_KEY = "traffic"

_encode = msgspec.json.Encoder().encode


def _copier(cls: type[msgspec.Struct], taken: tuple[str, ...]) -> Callable[..., Any]:
    """``make(found, **given)``: a ``cls`` with each field of ``taken`` read from
    ``found``, the rest given by keyword (with the class's defaults). Generated from the
    names, as dataclasses generates an ``__init__``: a loop of getattr and a ``**``
    cost five times the plain call, and the fold expands every result of every round."""
    ns: dict[str, Any] = {"cls": cls}
    params, fields = [], []
    for f in msgspec.structs.fields(cls):
        if f.name in taken:
            fields.append(f"{f.name}=found.{f.name}")
            continue
        if f.default_factory is not msgspec.NODEFAULT:
            raise TypeError(f"{cls.__name__}.{f.name}: a given field needs a plain default")
        if f.default is msgspec.NODEFAULT:
            params.append(f.name)
        else:
            ns[f"_{f.name}"] = f.default
            params.append(f"{f.name}=_{f.name}")
        fields.append(f"{f.name}={f.name}")
    exec(f"def make(found, *, {', '.join(params)}):\n    return cls({', '.join(fields)})", ns)
    made: Callable[..., Any] = ns["make"]
    return made


def _shared(a: type[msgspec.Struct], b: type[msgspec.Struct], *but: str) -> tuple[str, ...]:
    """The fields of ``a`` that ``b`` has too, in ``a``'s order, but ``but``."""
    return tuple(f for f in a.__struct_fields__ if f in b.__struct_fields__ and f not in but)


# A check's result to the single event it stands for and back, each from the two types'
# own fields: what a check found is carried, the envelope and the address are given (an
# agent's own check, ``agents/check.py``, has what it found but not the address).
_worked = _copier(ProxyWorked, _shared(ProxyWorked, CheckResult, "ip", "port"))
_failed = _copier(ProxyFailed, _shared(ProxyFailed, CheckResult, "ip", "port"))
_from_worked = _copier(CheckResult, _shared(CheckResult, ProxyWorked))
_from_failed = _copier(CheckResult, _shared(CheckResult, ProxyFailed))


def observation(ok: bool, found: Any, **envelope: Any) -> ProxyWorked | ProxyFailed:
    """The single event a check stands for: ``ProxyWorked`` when ``ok``, else
    ``ProxyFailed``, with what it found read from ``found`` (a ``CheckResult``, or an
    agent's own check), under ``envelope`` (id, agent, clock, the proxy's ip and port,
    its lease, and a worked one's source)."""
    made: ProxyWorked | ProxyFailed = (_worked if ok else _failed)(found, **envelope)
    return made


def expand(batch: ProxiesChecked) -> list[ProxyWorked | ProxyFailed]:
    """The single events the round's results stand for, under the round's envelope."""
    eid, agent, at, v, lease, source = (
        batch.id, batch.agent, batch.at, batch.v, batch.lease, batch.source,
    )  # fmt: skip
    return [
        _worked(r, id=eid, agent=agent, at=at, v=v, ip=r.ip, port=r.port, lease=lease,
                source=source)
        if r.ok
        else _failed(r, id=eid, agent=agent, at=at, v=v, ip=r.ip, port=r.port, lease=lease)
        for r in batch.results
    ]  # fmt: skip


def _result(e: ProxyWorked | ProxyFailed) -> CheckResult:
    made: CheckResult
    if isinstance(e, ProxyWorked):
        made = _from_worked(e, ok=True)
    else:
        made = _from_failed(e, ok=False)
    return made


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
