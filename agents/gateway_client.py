"""An agent's side of the gateway: leases, heartbeats, releases, and observations.

Observations are sent as ``POST /v1/events`` batches. When the gateway or the log is
unreachable they are appended to an outbox file and sent again, with the same event
ids, before anything newer: the log stores a re-sent id once, so a restart of NATS or
of the gateway loses no observation and doubles none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import structlog

from events import Event, encode

__all__ = ["GatewayClient", "GatewayError"]

log = structlog.get_logger("ppf.agent")


class GatewayError(RuntimeError):
    pass


class GatewayClient:
    def __init__(self, base: str, token: str, agent: str, outbox: Path) -> None:
        self.base = base.rstrip("/")
        self.agent = agent
        self.outbox = outbox
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http: aiohttp.ClientSession | None = None
        self.sent = 0
        self.buffered = 0

    async def __aenter__(self) -> GatewayClient:
        self._http = aiohttp.ClientSession(
            headers=self._headers, timeout=aiohttp.ClientTimeout(total=30)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def _post(self, path: str, body: Any) -> tuple[int, Any]:
        assert self._http is not None
        async with self._http.post(self.base + path, json=body) as r:
            return r.status, await r.json(content_type=None)

    async def whoami(self) -> dict[str, str]:
        assert self._http is not None
        async with self._http.get(self.base + "/v1/agents/me") as r:
            data = await r.json(content_type=None)
            if r.status != 200:
                raise GatewayError(f"whoami: {r.status} {data}")
            return dict(data)

    async def lease(self, kind: str, count: int, ttl_s: int) -> list[dict[str, Any]]:
        body = {"agent": self.agent, "kind": kind, "count": count, "ttl_s": ttl_s}
        status, data = await self._post("/v1/leases", body)
        if status != 200:
            raise GatewayError(f"lease: {status} {data}")
        return list(data["leases"])

    async def heartbeat(self, lease: str) -> bool:
        status, _ = await self._post(f"/v1/leases/{lease}/heartbeat", None)
        return status == 200

    async def release(self, lease: str, outcome: str, error: str = "") -> bool:
        body = {"outcome": outcome, "counted": True, "error": error[:500]}
        status, _ = await self._post(f"/v1/leases/{lease}/release", body)
        return status == 200

    async def publish(self, events: list[Event]) -> bool:
        """Send (outbox first); on failure keep them on disk. True when all were sent."""
        pending = [*self._read_outbox(), *(encode(e) for e in events)]
        for start in range(0, len(pending), 500):
            chunk = pending[start : start + 500]
            body = b'{"events":[' + b",".join(chunk) + b"]}"
            try:
                assert self._http is not None
                async with self._http.post(
                    self.base + "/v1/events",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    ok = r.status == 200
                    detail = "" if ok else (await r.text())[:300]
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                ok, detail = False, repr(exc)
            if not ok:
                self._write_outbox(pending[start:])
                log.warning("events_buffered", count=len(pending) - start, detail=detail)
                return False
            self.sent += len(chunk)
        self.outbox.unlink(missing_ok=True)
        return True

    async def flush(self) -> bool:
        """Send what the outbox holds, if anything; True when it is empty after."""
        return not self.outbox.exists() or await self.publish([])

    def _read_outbox(self) -> list[bytes]:
        if not self.outbox.exists():
            return []
        return [line for line in self.outbox.read_bytes().splitlines() if line.strip()]

    def _write_outbox(self, encoded: list[bytes]) -> None:
        self.outbox.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.outbox.with_suffix(".tmp")
        tmp.write_bytes(b"\n".join(encoded) + b"\n")
        tmp.replace(self.outbox)  # atomic: a crash leaves the old or the new outbox
        self.buffered = len(encoded)
