"""``ppf bench ingest``: what the deposit ingest asks of the store, counted by the server.

A real nats-server, the fold with its DuckDB file and the ingest, its sweep shortened.
Every JetStream API request the server answers is announced on
``$JS.EVENT.ADVISORY.API`` (the server's audit advisory, with the request and the
client's connection name): a subscriber here classifies them, so the figures are the
server's, not ppf's own counters. A *list* of the bucket is a consumer on its metadata
subjects (``$O.ppf-deposits.M.>``: what nats-py's ``list`` and ``watch`` make), from
any client. A *read* by the fold is either a consumer on one object's chunks (a
``get`` that found the object) or a failed lookup of an object's metadata
(``STREAM.MSG.GET`` answered with an error: a missing deposit). The server announces no
advisory for a lookup that succeeds (measured: 20 found, none announced), so a found
object is counted by its chunk consumer.

Phases: the inbox empty for ``sweeps`` sweep periods (lists and reads must be 0);
then ``deposits`` pages stored and announced and ``missing`` announced but never
stored (each read until poisoned, five times), and ``sweeps`` idle periods more.
Expected reads: deposits + 5 x missing. Last, the bench lists the bucket once itself:
the count must see that list, or its zero proves nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eventlog.client import Log
from eventlog.dial import dial
from eventlog.objects import BUCKET
from events import Deposited
from events.keys import page_key
from events.mint import fresh_id, now_ms
from ops.bench.harness import nats_servers
from ops.bench.options import Ingest
from projections.ingest import DepositIngest
from projections.live import FoldService
from reducers.deposits import ATTEMPTS

__all__ = ["bench_ingest"]

FOLD_CLIENT = "ppf-bench-fold"
_STREAM = f"OBJ_{BUCKET}"
_META = f"$O.{BUCKET}.M."
_CHUNKS = f"$O.{BUCKET}.C."


class _Audit:
    """JetStream API requests on the deposit bucket, as the server announced them."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()

    async def heard(self, msg: Any) -> None:
        try:
            said = json.loads(msg.data)
        except ValueError:
            self.by_kind["unreadable advisory"] += 1
            return
        subject = said.get("subject", "")
        if _STREAM not in subject:
            return
        request = said.get("request", "") or ""
        client = (said.get("client") or {}).get("name", "")
        creates = subject.startswith("$JS.API.CONSUMER.CREATE.")
        if creates and _META in request:
            self.by_kind["list"] += 1  # from anyone: nothing may list the bucket
        elif client == FOLD_CLIENT and (
            (creates and _CHUNKS in request) or subject.startswith("$JS.API.STREAM.MSG.GET.")
        ):
            self.by_kind["read"] += 1
        else:
            self.by_kind[f"{client or '?'} {subject.split('.')[3].lower()}"] += 1


async def bench_ingest(options: Ingest) -> dict[str, Any]:
    sweeps, sweep_s = options.sweeps, options.sweep_s
    deposits, missing = options.deposits, options.missing
    with (
        tempfile.TemporaryDirectory(prefix="ppf-bench-ingest-") as tmp,
        nats_servers(Path(tmp), "nats") as (server,),
    ):
        audit = _Audit()
        watch = await dial([server.url], name="ppf-bench-audit")
        lg = await Log.connect(server.url, name="ppf-bench-depositor")
        fold_log = await Log.connect(server.url, name=FOLD_CLIENT)
        fold = FoldService(fold_log, db=Path(tmp) / "ppf.duckdb")
        ingest = DepositIngest(fold, fold_log.deposits, poll_s=sweep_s / 2, sweep_s=sweep_s)
        try:
            await watch.subscribe("$JS.EVENT.ADVISORY.API", cb=audit.heard)
            await watch.flush()
            await lg.ensure_stream()
            await lg.deposits.put("page/" + "0" * 64, b"")  # the bucket exists before
            await lg.deposits.delete("page/" + "0" * 64)
            await fold.start()
            await ingest.start()
            idle_started = time.monotonic()
            await asyncio.sleep(sweeps * sweep_s)
            idle_s = time.monotonic() - idle_started
            await watch.flush()
            await asyncio.sleep(0.5)  # advisories of the last sweeps arrive
            idle = dict(audit.by_kind)
            audit.by_kind.clear()
            keys = []
            for i in range(deposits + missing):
                data = f"<pre>198.51.100.{i % 250}:{1000 + i}</pre>".encode()
                sha = hashlib.sha256(data).hexdigest()
                key = page_key(sha)
                if i < deposits:
                    await lg.deposits.put(key, data)
                keys.append(key)
                await lg.publish(
                    Deposited(
                        id=fresh_id(), agent="admin", at=now_ms(), key=key, sha256=sha,
                        bytes=len(data),
                    )
                )  # fmt: skip
            state = fold.state
            busy_started = time.monotonic()
            deadline = busy_started + 60 + ATTEMPTS * missing * sweep_s
            while time.monotonic() < deadline:
                rows = [state.deposits.get(k) for k in keys]
                if all(r is not None and r.status != "pending" for r in rows):
                    break
                await asyncio.sleep(sweep_s)
            busy_s = time.monotonic() - busy_started
            await asyncio.sleep(sweeps * sweep_s)  # settled: idle again
            await watch.flush()
            await asyncio.sleep(0.5)
            rows = [state.deposits.get(k) for k in keys]
            statuses = Counter(r.status if r is not None else "unknown" for r in rows)
            busy = dict(audit.by_kind)
            # The count's own check: one list of the bucket, which it must see.
            audit.by_kind.clear()
            await (await watch.jetstream().object_store(BUCKET)).list()
            await watch.flush()
            await asyncio.sleep(0.5)
            canary = audit.by_kind.get("list", 0)
        finally:
            await ingest.stop()
            await fold.stop()
            await fold_log.close()
            await lg.close()
            await watch.close()
    return {
        "bench": "ingest",
        "sweep_s": sweep_s,
        "idle_sweeps": round(idle_s / sweep_s),
        "idle": {"lists": idle.get("list", 0), "reads": idle.get("read", 0), "other": idle},
        "deposits": deposits,
        "missing": missing,
        "expected_reads": deposits + ATTEMPTS * missing,
        "busy": {
            "lists": busy.get("list", 0),
            "reads": busy.get("read", 0),
            "seconds": round(busy_s, 2),
            "other": busy,
        },
        "statuses": dict(statuses),
        "ingest": {"folded": ingest.folded, "rejected": ingest.rejected},
        "canary_lists_seen": canary,  # one list made on purpose at the end: must be 1
    }
