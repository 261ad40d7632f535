"""A proxy's download speed: a bounded download of ppf's own judge's bytes through it
(gateway/judge.py ``judge_bytes``), timed from the first byte of the body to the last,
so the figure is the proxy's throughput from this agent's vantage and not its latency.

Each download spends the agent's ``SpeedBudget``: a proxy's bandwidth is someone
else's, and a fleet of checkers downloading from every proxy they check would be a
load of its own. Only a judge of ppf's (one that signs) serves the bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from agents.tunnel import connect

__all__ = ["SPEED_BYTES", "SpeedBudget", "speed"]

SPEED_BYTES = 256 * 1024  # one download: long enough to leave slow start behind
_HEAD_MAX = 16 * 1024


class Judge(Protocol):
    """What a download needs of a judge (``agents.check.Judge`` has it)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def signer(self) -> tuple[str, bytes] | None: ...

    def nonce(self) -> str: ...


class SpeedBudget:
    """Bytes this agent may download for speed an hour, refilled as time passes; and
    the proxies it timed lately, each timed again only after ``every_s`` (the budget
    goes to the proxies not timed yet, not to the first few checked each round)."""

    def __init__(
        self,
        bytes_per_hour: int,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 6 * 3600,
    ) -> None:
        self.per_hour = bytes_per_hour
        self.clock = clock
        self.every_s = every_s
        self._left = float(bytes_per_hour)
        self._at = clock()
        self._timed: dict[tuple[str, int], float] = {}  # proxy -> when, oldest first
        self.spent = 0  # bytes, for the agent's status

    def take(self, size: int, proxy: tuple[str, int] | None = None) -> bool:
        """Whether a download of ``size`` bytes (through ``proxy``) is due and fits now,
        and is counted if so."""
        now = self.clock()
        timed = self._timed
        while timed and now - next(iter(timed.values())) >= self.every_s:
            del timed[next(iter(timed))]  # insertion order is time order: oldest first
        if proxy in timed:
            return False
        self._left = min(self.per_hour, self._left + (now - self._at) * self.per_hour / 3600)
        self._at = now
        if size > self._left:
            return False
        self._left -= size
        self.spent += size
        if proxy is not None:
            timed[proxy] = now
        return True


async def speed(
    ip: str, port: int, proto: str, judge: Judge, size: int = SPEED_BYTES, timeout: float = 20.0
) -> int:
    """Kilobytes (1,000 bytes) a second of ``size`` bytes from ``judge`` through the
    proxy as ``proto``; 0 when the download did not complete."""
    if judge.signer is None:
        return 0  # only ppf's own judge serves bytes
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await connect(ip, port, proto, judge.host, judge.port, timeout / 2)
            target = f"{judge.path}/bytes?n={judge.nonce()}&size={size}"
            if proto == "http":  # a forwarding proxy wants the absolute URI
                target = f"http://{judge.host}:{judge.port}{target}"
            writer.write(
                f"GET {target} HTTP/1.1\r\nHost: {judge.host}:{judge.port}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)
            if len(head) > _HEAD_MAX or len(status) < 2 or status[1] != b"200":
                return 0
            first = await reader.read(65_536)
            began, got = time.perf_counter(), len(first)
            while got < size:
                more = await reader.read(65_536)
                if not more:
                    return 0
                got += len(more)
            took = time.perf_counter() - began
    except Exception:  # refused, timed out, cut short; python-socks raises its own errors
        return 0
    finally:
        if writer is not None:
            writer.close()
    rest = got - len(first)
    return max(1, int(rest / took / 1000)) if took > 0 and rest > 0 else 0
