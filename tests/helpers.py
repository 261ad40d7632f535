"""Builders of events for tests: fixed ids and times, so failures are reproducible."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

from events import (
    Event,
    Leased,
    ProxyWorked,
    Released,
    encode,
    subject_for,
)

_ids = itertools.count(1)


def eid() -> str:
    return f"00000000-0000-7000-8000-{next(_ids):012d}"


def worked(ip: str = "8.8.8.8", port: int = 8080, **kw: Any) -> ProxyWorked:
    fields: dict[str, Any] = {"agent": "w1", "at": 0, "proto": "http", "latency_ms": 100}
    fields.update(kw)
    fields.setdefault("id", eid())
    return ProxyWorked(ip=ip, port=port, **fields)


def leased(target: str, agent: str = "w1", ttl_s: int = 60, kind: str = "source") -> Leased:
    lid = eid()
    return Leased(id=lid, agent=agent, at=0, lease=lid, kind=kind, target=target, ttl_s=ttl_s)  # type: ignore[arg-type]


def released(lease: Leased, outcome: str = "done", counted: bool = True) -> Released:
    return Released(
        id=eid(),
        agent=lease.agent,
        at=0,
        lease=lease.lease,
        target=lease.target,
        outcome=outcome,
        counted=counted,
        kind=lease.kind,  # type: ignore[arg-type]
    )


def message(seq: int, ts: int, event: Event) -> tuple[int, int, bytes, bytes]:
    """A raw log message as the firehose hands it out."""
    return (seq, ts, subject_for(event).encode(), encode(event))


def process_gone(pid: str) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie waiting for its parent)."""
    path = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return " Z " in path.read_text()
    return True


def ppf_judge_app(key_file: Path) -> tuple[Any, tuple[str, bytes]]:
    """ppf's judge as an aiohttp app answering the operator's nonces (gateway/judge.py),
    with the signer that mints them: what ``ppf check`` beside a data dir uses."""
    from aiohttp import web

    from gateway.judge import JUDGE_DOOR, JudgeDoor, JudgeKeys, judge

    keys = JudgeKeys.load(key_file)
    app = web.Application()
    app[JUDGE_DOOR] = JudgeDoor(keys)
    app.router.add_get("/judge", judge)
    return app, keys.operator()


async def dlq_messages(lg: Any) -> list[Any]:
    """Every entry the DLQ's stream holds, oldest first (``ev.DLQ_STREAM``)."""
    from events import DLQ_STREAM

    last = (await lg.js.stream_info(DLQ_STREAM)).state.last_seq
    return [await lg.js.get_msg(DLQ_STREAM, seq) for seq in range(1, last + 1)]
