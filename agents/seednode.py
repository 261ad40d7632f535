"""The seed node: works through the ranges of a planned bulk import (docs/operations.md,
"Bulk imports").

It leases a range, works it from the resume cursor the lease carries, batch by batch:
each batch is checked (candidate proxies through the judge pool; candidate source URLs
fetched and kept when they hold proxies), stored under ``<plan>/<range>/<cursor>``
through the gateway, and announced with ``Deposited`` and the next cursor. The ledger
moves the cursor only on a batch that starts where it stands, so a node that dies
loses at most the batch it was on: the next holder starts there, not at the start.

Checking a dump is scanning other people's addresses: a node never sends more than
``per_net_per_s`` checks a second into one /24, and skips the operator's exclusions
besides the private and reserved ranges that are always refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import structlog

from agents.check import Check
from agents.extract import extract
from agents.fetch import Fetcher
from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig
from events import Deposited
from events.keys import seed_key
from events.wire import SEED_LEASE_TTL_S, LeaseGrant, SeedBatch, SeedFound, SeedPayload

__all__ = ["SeedConfig", "SeedNode", "excluded"]

log = structlog.get_logger("ppf.seed")

MIN_CANDIDATES = 3  # a URL whose page holds fewer is not a proxy list


@dataclass(frozen=True, slots=True)
class SeedConfig(AgentConfig):
    lease_ttl_s: int = SEED_LEASE_TTL_S
    batch: int = 200  # items a deposit
    per_net_per_s: float = 20.0  # checks a second into one /24 (or /48)
    exclude: tuple[str, ...] = ()  # CIDRs never checked, besides private and reserved
    lab: bool = False  # loopback and private addresses may be checked
    upstream: str | None = None  # where source URLs are fetched through


def excluded(ip: str, nets: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return True
    return any(addr in net for net in nets)


class _PerNet:
    """At most ``rate`` checks a second into each /24: a target waits for its slot."""

    def __init__(self, rate: float) -> None:
        self.gap = 1.0 / rate if rate > 0 else 0.0
        self._next: dict[str, float] = {}

    def delay(self, ip: str, now: float) -> float:
        """Book the next slot of ``ip``'s network; how long until it comes."""
        if not self.gap:
            return 0.0
        net = ip.rsplit(".", 1)[0] if "." in ip else ip.rsplit(":", 5)[0]
        at = max(now, self._next.get(net, 0.0))
        self._next[net] = at + self.gap
        return at - now


class SeedNode(Agent[SeedConfig]):
    def _own_state(self) -> None:
        config = self.config
        self._nets = [ipaddress.ip_network(c, strict=False) for c in config.exclude]
        self._per_net = _PerNet(config.per_net_per_s)
        self.items_done = 0
        self.batches = 0
        self.ranges_done = 0

    async def run(self, stop: asyncio.Event, *, cycles: int | None = None) -> None:
        await self._run(stop, cycles, self.cycle)

    async def cycle(self, gw: GatewayClient, judge: JudgePool) -> int:
        await gw.flush()
        if await self._outage(gw, judge):
            return 0
        grants = await gw.lease("seed", 1, self.config.lease_ttl_s)
        for grant in grants:
            async with self._heartbeats(gw, [grant]):
                outcome, error = await self._work(gw, judge, grant)
            await gw.release(grant.lease, outcome, error, counted=outcome != "abandoned")
        return len(grants)

    async def _work(
        self, gw: GatewayClient, judge: JudgePool, grant: LeaseGrant
    ) -> tuple[str, str]:
        """Work one range to its end; (release outcome, error)."""
        rng = grant.seed()
        cursor = rng.cursor
        items = rng.items
        size = self.config.batch
        while cursor <= rng.end:
            if judge.outage():  # our way out is down: the range goes back uncounted
                return "abandoned", "own network down"
            offset = cursor - rng.cursor
            chunk = items[offset : offset + size]
            if not chunk:
                return "failed", f"the lease carried no items from {cursor}"
            batch = await self._batch(rng, cursor, chunk, judge)
            why = await self._deposit(gw, grant, rng, batch)
            if why:
                return "failed", why
            cursor = batch.next
            self.items_done += len(chunk)
            self.batches += 1
        self.ranges_done += 1
        log.info("range_done", agent=self.name, target=grant.target, items=len(items))
        return "done", ""

    async def _batch(
        self, rng: SeedPayload, cursor: int, chunk: list[str], judge: JudgePool
    ) -> SeedBatch:
        if rng.kind == "sources":
            return await self._sources(cursor, chunk)
        lab = self.config.lab
        found = extract("\n".join(chunk), lab=lab)
        targets = [(c.ip, c.port, c.proto) for c in found if not excluded(c.ip, self._nets)]
        refused = len(chunk) - len(targets)
        results = await self._paced(targets, judge)
        worked = [
            SeedFound(
                ip=ip,
                port=port,
                proto=r.proto or "",
                latency_ms=r.latency_ms,
                exit_ip=r.exit_ip,
                anonymity=r.anonymity,
                mitm=r.mitm,
                judge=r.judge,
                https=r.https,
            )
            for (ip, port, _), r in zip(targets, results, strict=True)
            if r.ok and r.proto is not None
        ]
        return SeedBatch(start=cursor, next=cursor + len(chunk), worked=worked, refused=refused)

    async def _paced(
        self, targets: list[tuple[str, int, str | None]], judge: JudgePool
    ) -> list[Check]:
        """Check ``targets``, each when its /24 has a slot (``per_net_per_s``)."""
        now = time.monotonic()
        gate = asyncio.Semaphore(self.config.check_concurrency)

        async def one(target: tuple[str, int, str | None], wait: float) -> Check:
            if wait:
                await asyncio.sleep(wait)  # a target waiting for its slot holds no check
            async with gate:
                return (await self._check([target], judge))[0]

        return list(
            await asyncio.gather(*(one(t, self._per_net.delay(t[0], now)) for t in targets))
        )

    async def _sources(self, cursor: int, chunk: list[str]) -> SeedBatch:
        """Which of ``chunk``'s URLs are proxy lists: fetched once each, kept when the
        page holds at least ``MIN_CANDIDATES`` candidates."""
        cfg = self.config
        keep: list[str] = []
        refused = 0
        async with Fetcher(upstream=cfg.upstream, lab=cfg.lab) as fetcher:

            async def probe(url: str) -> None:
                nonlocal refused
                if not url.startswith(("http://", "https://")):
                    refused += 1
                    return
                result = await fetcher.fetch(url)
                if result.ok and len(extract(result.body, lab=cfg.lab)) >= MIN_CANDIDATES:
                    keep.append(url)

            await asyncio.gather(*(probe(u) for u in chunk))
        keep.sort(key=chunk.index)
        return SeedBatch(start=cursor, next=cursor + len(chunk), sources=keep, refused=refused)

    async def _deposit(
        self, gw: GatewayClient, grant: LeaseGrant, rng: SeedPayload, batch: SeedBatch
    ) -> str:
        """Store the batch and announce it; "" when done, else why not. A 409 is the
        gateway not having applied our previous batch yet: asked again a few times."""
        key = seed_key(rng.plan, rng.range, batch.start)
        data = msgspec.json.encode(batch)
        status, said = 0, ""
        for delay in (0.2, 0.5, 1.0, 2.0, 4.0, 0.0):
            status, said = await gw.deposit(key, data)
            if status == 200:
                break
            if status not in (0, 409) and status < 500:
                return f"deposit {key}: {status} {said}"
            if delay:
                await asyncio.sleep(delay)
        else:
            return f"deposit {key}: {status} {said}"
        event = self._ev(
            Deposited,
            lease=grant.lease,
            key=key,
            sha256=said,
            bytes=len(data),
            items=batch.next - batch.start,
            cursor=batch.next,
        )
        if not await gw.publish([event]):
            # Kept in the outbox and sent later; the range stops here meanwhile: a
            # batch announced late is refused if the lease has moved on, and redone.
            return "the log did not take the deposit yet"
        return ""
