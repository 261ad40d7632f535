"""Builders of events for tests: fixed ids and times, so failures are reproducible."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

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


async def publish_until(
    url: str, stop: asyncio.Event, net: int, nets: int, pause_s: float = 0.0, **kw: Any
) -> int:
    """``ProxyWorked`` (``kw`` its fields) of addresses ``<net>.<1..nets>.x.y``, 500 a
    publish, ids dated now, until ``stop`` is set or the server goes away: how many went."""
    from eventlog.client import Log, LogError
    from events.mint import fresh_id

    sent = 0
    lg = await Log.connect(url)
    try:
        for i in itertools.count():
            if stop.is_set():
                break
            octet = i % nets + 1
            batch = [
                worked(f"{net}.{octet}.{j // 250}.{j % 250 + 1}", id=fresh_id(), **kw)
                for j in range(500)
            ]
            try:
                await lg.publish_many(batch, timeout=2)
            except LogError:
                break
            sent += len(batch)
            await asyncio.sleep(pause_s)
    finally:
        await lg.close()  # the server may be gone by now: closes without waiting on it
    return sent


async def until(cond: Any, timeout: float) -> bool:
    """Whether ``cond()`` came true within ``timeout`` seconds (asked every 0.1 s)."""
    for _ in range(int(timeout * 10)):
        if cond():
            return True
        await asyncio.sleep(0.1)
    return False


async def clear_of_the_hour(need_s: float) -> None:
    """Waits, when the wall clock's hour ends within ``need_s`` seconds, until the next one
    has begun. Budgets the fold keeps by the hour of the log's time (a consumer's failed
    reports, reducers/reports.py) start again at each clock hour, so a test that counts one
    hour's worth must not straddle two."""
    left_s = 3_600 - time.time() % 3_600
    if left_s < need_s:
        await asyncio.sleep(left_s + 0.1)


async def endpoint_counts(base: str) -> dict[str, float]:
    """The endpoint's ``ppf_endpoint_requests_total`` by outcome, from the /metrics of the
    ``ppf up`` at ``base``, read with the Prometheus parser as a scraper reads it."""
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    )
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "ppf_endpoint_requests"
        for sample in family.samples
        if sample.name == "ppf_endpoint_requests_total"
    }


def check_found_as_made(row: dict[str, Any], proxy: Any) -> None:
    """A served row says what the lab's or the world's ``proxy`` is: its protocol,
    anonymity, exit and whether it tampers (a TLS judge shows an interceptor too)."""
    found = (row["proto"], row["anonymity"], row["exit_ip"], row["mitm"])
    assert found == (proxy.proto, proxy.anonymity, proxy.exit_ip, bool(proxy.mitm)), proxy.name


def stored_and_restored(state: Any, path: Path) -> Any:
    """``state`` checkpointed into a new DuckDB file at ``path``, and restored from it."""
    from projections.store import Store, collect

    store = Store(path)
    try:
        store.write(collect(state))
        return store.restore()
    finally:
        store.close()


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


async def shop_refusing(refused_exit: str, host: str, port: int = 0, delay_s: float = 0.0) -> Any:
    """A site without a rule, started on ``host`` (``port`` 0: a free one): its page for
    every exit but ``refused_exit``, which gets a 403 after ``delay_s``. Its
    ``TestServer``, for the caller to close."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def page(request: web.Request) -> web.Response:
        if request.remote == refused_exit:
            await asyncio.sleep(delay_s)
            return web.Response(status=403, text="<html><title>Forbidden</title></html>")
        filler = "<p>" + "A shop's own page. " * 100 + "</p>"
        return web.Response(
            text=f"<html><title>Shop</title>{filler}</html>", content_type="text/html"
        )

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", page)
    server = TestServer(app, host=host, port=port or None)
    await server.start_server()
    return server


async def dlq_messages(lg: Any) -> list[Any]:
    """Every entry the DLQ's stream holds, oldest first (``ev.DLQ_STREAM``)."""
    from events import DLQ_STREAM

    last = (await lg.js.stream_info(DLQ_STREAM)).state.last_seq
    return [await lg.js.get_msg(DLQ_STREAM, seq) for seq in range(1, last + 1)]
