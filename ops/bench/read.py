"""``ppf bench read``: how fast the fold's reader takes the log, in plain and over TLS.

The fold reads through the lean reader (``eventlog/stream.py``: its own socket, frames
parsed straight from it) where it can, and over TLS through nats-py's ordered consumer
(``eventlog/ordered.py``: the lean reader speaks no TLS). Two nats-servers on loopback,
one plain and one with TLS (a CA of the bench's own), hold the same ``messages`` single
observations; each run reads all of them from sequence 1 three ways, in turns (A B C):
the lean reader in plain, nats-py's ordered consumer in plain, and the fold's reader
over TLS (``Log.read``, which hands over to nats-py there). Rates are messages over each
read's own time.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from eventlog.client import Log, NatsTls
from eventlog.ordered import ordered_batches
from events import ProxyWorked
from events.mint import fresh_id, now_ms
from ops.bench.harness import nats_servers
from ops.bench.options import Read
from ops.lab.tls import nats_certs
from ops.nats.server import ServerTls

__all__ = ["bench_read"]


def _worked(i: int) -> ProxyWorked:
    ip = f"8.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
    return ProxyWorked(
        id=fresh_id(), agent="bench", at=now_ms(), ip=ip, port=8080, proto="http",
        latency_ms=100, exit_ip=ip,
    )  # fmt: skip


async def _rate(batches: Callable[[], AsyncIterator[list[Any]]], expected: int) -> float:
    started = time.perf_counter()
    got = 0
    async for batch in batches():
        got += len(batch)
    if got != expected:
        raise RuntimeError(f"read {got} messages of {expected}")
    return expected / (time.perf_counter() - started)


async def bench_read(read: Read) -> dict[str, Any]:
    messages, runs = read.messages, read.runs
    with tempfile.TemporaryDirectory(prefix="ppf-bench-read-") as tmp:
        root = Path(tmp)
        certs = nats_certs(root / "certs")
        tls = ServerTls(cert=certs["cert"], key=certs["key"], ca=certs["ca"])
        with (
            nats_servers(root, "plain") as (plain,),
            nats_servers(root, "tls", tls=tls) as (secure,),
        ):
            a = await Log.connect(plain.url)
            mine = NatsTls(ca=certs["ca"], cert=certs["client"], key=certs["client_key"])
            b = await Log.connect(secure.url, tls=mine)
            try:
                for lg in (a, b):
                    await lg.ensure_stream()
                events = [_worked(i) for i in range(messages)]
                for i in range(0, messages, 10_000):
                    chunk = events[i : i + 10_000]
                    await asyncio.gather(a.publish_many(chunk), b.publish_many(chunk))
                head = await a.head_seq()
                ways: dict[str, Callable[[], AsyncIterator[list[Any]]]] = {
                    "lean_plain": lambda: a.read(1, until=head),
                    "nats_py_plain": lambda: ordered_batches(a.js, 1, head),
                    "fold_reader_tls": lambda: b.read(1, until=head),
                }
                rates: dict[str, list[float]] = {name: [] for name in ways}
                for _ in range(runs):  # A B C A B C
                    for name, way in ways.items():
                        rates[name].append(await _rate(way, head))
            finally:
                await a.close()
                await b.close()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    return {
        "messages": head,
        "runs": runs,
        **{f"{name}_per_s": round(m) for name, m in medians.items()},
        "spread": {name: [round(r) for r in rs] for name, rs in rates.items()},
        "tls_vs_lean_plain": round(medians["fold_reader_tls"] / medians["lean_plain"], 3),
        "tls_vs_nats_py_plain": round(medians["fold_reader_tls"] / medians["nats_py_plain"], 3),
    }
