"""The Axiom tap: every folded event, and a metrics row every 10 s, to an Axiom dataset.

Fire-and-forget by construction. The fold hands each batch of raw messages to
``Tap.feed``, which writes one msgpack frame to a child process and returns; when the
child falls behind (Axiom slow or down) and the pipe's buffer passes its bound, the
batch is dropped and counted, never waited for. The child turns messages into rows
(``_time`` = the server timestamp, type, subject, seq, the event's own fields; never a
site: site verdicts are left out, and the site of a consumer's report), batches them,
and sends with axiom-py. Nothing ever reads Axiom back.

axiom-py retries 5xx and connection errors itself (about 3 s) and sets no timeout of
its own, so the child gives its session one: a server that accepts and never answers
costs a bounded wait, and the rows behind it are dropped and counted, not queued
without end.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from projections.frames import FRAME, read_frame
from projections.writer import end_child

__all__ = ["Tap", "TapConfig", "TapStats"]

log = structlog.get_logger("ppf.tap")

_HEAD = struct.Struct(">BI")  # kind (0 events, 1 metrics), item count
_encode = msgspec.msgpack.Encoder().encode
_CHILD = "import sys; from ops.telemetry.tap import serve; sys.exit(serve())"


@dataclass(frozen=True, slots=True)
class TapConfig:
    token: str
    dataset: str
    url: str | None = None
    org_id: str | None = None
    batch_rows: int = 1_000
    batch_s: float = 1.0
    timeout_s: float = 5.0
    max_pipe_bytes: int = 4 * 1024 * 1024
    max_rows: int = 10_000

    @classmethod
    def from_env(cls) -> TapConfig | None:
        """AXIOM_TOKEN, AXIOM_DATASET (default ppf), AXIOM_URL, AXIOM_ORG_ID; None: off."""
        token = os.environ.get("AXIOM_TOKEN")
        if not token:
            return None
        return cls(
            token=token,
            dataset=os.environ.get("AXIOM_DATASET", "ppf"),
            url=os.environ.get("AXIOM_URL") or None,
            org_id=os.environ.get("AXIOM_ORG_ID") or None,
        )


@dataclass(slots=True)
class TapStats:
    fed: int = 0
    dropped: int = 0  # by this process: the child was behind
    sent: int = 0  # rows Axiom accepted (reported by the child)
    failed: int = 0  # rows the child dropped: send errors, its own bound
    errors: int = 0
    last_error: str = ""


class Tap:
    """The parent side: non-blocking feed, stats read back from the child."""

    def __init__(self, config: TapConfig) -> None:
        self.config = config
        self.stats = TapStats()
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._behind = False  # the child said Axiom is not keeping up: drop at once

    async def start(self) -> None:
        env = {
            **os.environ,
            "PPF_TAP": json.dumps(
                {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}
            ),
        }
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            stdin=asyncio.subprocess.PIPE,
            # Its own session: a Ctrl-C meant for ppf must not kill it before the last
            # write; it ends when its input does (the parent closing it, or dying).
            start_new_session=True,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        self._reader = asyncio.create_task(self._read_stats(), name="ppf-tap-stats")
        log.info("tap_started", dataset=self.config.dataset, url=self.config.url)

    def _open(self, items: int) -> asyncio.StreamWriter | None:
        """The child's pipe, or None (and the items counted as dropped) when behind."""
        proc = self._proc
        if self._behind or proc is None or proc.stdin is None or proc.stdin.is_closing():
            self.stats.dropped += items
            return None
        if proc.stdin.transport.get_write_buffer_size() > self.config.max_pipe_bytes:
            self.stats.dropped += items  # the child is behind: never wait for it
            return None
        return proc.stdin

    @staticmethod
    def _send(pipe: asyncio.StreamWriter, kind: int, items: int, body: bytes) -> None:
        pipe.write(FRAME.pack(len(body) + 5) + _HEAD.pack(kind, items) + body)

    def feed(self, batch: Sequence[tuple[int, int, bytes, bytes]]) -> None:
        """Hand a batch of folded messages to the tap; returns at once."""
        self.stats.fed += len(batch)
        pipe = self._open(len(batch))
        if pipe is not None:  # encoded only when it will be sent
            self._send(pipe, 0, len(batch), _encode(batch))

    def metrics(self, row: dict[str, Any]) -> None:
        pipe = self._open(1)
        if pipe is not None:
            self._send(pipe, 1, 1, _encode(row))

    async def _read_stats(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            self._behind = report["behind"]
            self.stats.sent = report["sent"]
            self.stats.failed = report["failed"]
            self.stats.errors = report["errors"]
            self.stats.last_error = report["last_error"]

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        await end_child(proc, self.config.timeout_s + 2)
        if self._reader is not None:
            self._reader.cancel()


# -- the child ------------------------------------------------------------------------

_decode_batch = msgspec.msgpack.Decoder(list[tuple[int, int, bytes, bytes]]).decode
_decode_event = msgspec.json.Decoder().decode


def _iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _rows(batch: list[tuple[int, int, bytes, bytes]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seq, ts, subject, payload in batch:
        try:
            fields = _decode_event(payload)
        except msgspec.DecodeError:
            fields = {"undecodable": payload[:200].decode(errors="replace")}
        if not isinstance(fields, dict):
            fields = {"value": fields}
        if fields.get("type") in _SITES_LEFT_OUT:
            continue
        fields.pop("site", None)  # a consumer's report of a block names a site
        where = {"_time": _iso(ts), "seq": seq, "subject": subject.decode()}
        rows.extend({**row, **where} for row in _per_result(fields))
    return rows


# Which sites the consumers' traffic goes to stays in the fleet: the endpoints' and the
# probes' verdicts are not tapped, nor is the site of a consumer's report.
_SITES_LEFT_OUT = frozenset({"SitesChecked"})


def _failed(result: object) -> bool:
    return isinstance(result, dict) and result.get("ok") is False


def _per_result(fields: dict[str, Any]) -> list[dict[str, Any]]:
    """One row an observation, as the dashboard's queries count them by type: a round
    (ProxiesChecked) gives a ProxyWorked or ProxyFailed row per result, with the
    round's envelope and its ``index``; a Located of many addresses, a row each."""
    kind = fields.get("type")
    results = fields.get("results") if kind == "ProxiesChecked" else None
    if isinstance(results, list):
        envelope = {k: v for k, v in fields.items() if k != "results"}
        return [
            {
                **envelope,
                **(r if isinstance(r, dict) else {"value": r}),
                "type": "ProxyFailed"
                if isinstance(r, dict) and r.get("ok") is False
                else "ProxyWorked",
                "round": fields.get("id"),
                "index": j,
            }
            for j, r in enumerate(results)
        ]
    more = fields.get("more") if kind == "Located" else None
    if isinstance(more, list) and more:
        first = {k: v for k, v in fields.items() if k != "more"}
        return [first, *({**first, **p} for p in more if isinstance(p, dict))]
    return [fields]


def serve() -> int:
    """The child: read frames, batch rows, send, report counts on stdout."""
    import queue
    import threading

    import axiom_py  # type: ignore[import-untyped]

    config = TapConfig(**json.loads(os.environ["PPF_TAP"]))
    client = axiom_py.Client(token=config.token, org_id=config.org_id, url=config.url)
    # axiom-py's requests session has no timeout: give it one.
    client.session.request = functools.partial(client.session.request, timeout=config.timeout_s)
    counts: dict[str, Any] = {
        "sent": 0,
        "failed": 0,
        "errors": 0,
        "last_error": "",
        "behind": False,
    }
    pending: queue.Queue[list[dict[str, Any]] | None] = queue.Queue()
    queued = [0]
    lock = threading.Lock()

    def report() -> None:
        with lock:
            sys.stdout.write(json.dumps(counts) + "\n")
            sys.stdout.flush()

    def sender() -> None:
        while (rows := pending.get()) is not None:
            try:
                client.ingest_events(config.dataset, rows)
                with lock:
                    counts["sent"] += len(rows)
            except Exception as exc:  # any failure of Axiom: count it, drop, go on
                with lock:
                    counts["failed"] += len(rows)
                    counts["errors"] += 1
                    counts["last_error"] = repr(exc)[:300]
            finally:
                with lock:
                    queued[0] -= len(rows)
                    counts["behind"] = queued[0] >= config.max_rows
            report()

    thread = threading.Thread(target=sender, name="ppf-tap-sender", daemon=True)
    thread.start()
    rows: list[dict[str, Any]] = []
    since = time.monotonic()

    def flush() -> None:
        nonlocal rows, since
        if rows:
            with lock:
                over = queued[0] + len(rows) > config.max_rows
                if over:
                    counts["failed"] += len(rows)
                else:
                    queued[0] += len(rows)
            if not over:
                pending.put(rows)
            rows = []
        since = time.monotonic()

    inp = sys.stdin.buffer
    while (frame := read_frame(inp)) is not None:
        kind, items = _HEAD.unpack_from(frame)
        with lock:
            behind = queued[0] >= config.max_rows
        if behind:
            # Axiom is not taking what we have: drop before paying for the rows, and
            # tell the parent, which then stops encoding and sending until we catch up.
            with lock:
                counts["failed"] += items
                tell = not counts["behind"]
                counts["behind"] = True
            if tell:
                report()
            continue
        if kind == 0:
            rows.extend(_rows(_decode_batch(frame[5:])))
        else:
            rows.append({**msgspec.msgpack.decode(frame[5:]), "type": "metrics"})
        if len(rows) >= config.batch_rows or time.monotonic() - since >= config.batch_s:
            flush()
    flush()
    pending.put(None)
    thread.join(config.timeout_s * 4)
    report()
    return 0
