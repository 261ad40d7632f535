"""The checker: lease recheck shards, re-test the proxies that are due, report both ways.

The gateway's lease payload lists the shard's due proxies (graduated intervals, spread
across ASNs: projections/recheck.py); the checker tests each with the protocol it was
confirmed with and publishes ``ProxyWorked`` or ``ProxyFailed`` under its lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig, run_cycles
from events import Event, ProxyFailed

__all__ = ["Checker", "CheckerConfig"]

log = structlog.get_logger("ppf.checker")


@dataclass(frozen=True, slots=True)
class CheckerConfig(AgentConfig):
    shards: int = 8  # shards leased a cycle


class Checker(Agent):
    config: CheckerConfig

    def __init__(
        self,
        gateway: str,
        token: str,
        name: str,
        judges: str | Sequence[str],
        data: Path,
        config: CheckerConfig,
    ) -> None:
        super().__init__(gateway, token, name, judges, data, config)
        self.rechecked = 0
        self.voided = 0  # cycles thrown away because the judge did not answer

    async def run(self, stop: asyncio.Event, *, cycles: int | None = None) -> None:
        async with self._gateway_client() as gw, self._judges() as judge:
            self.cycles += await run_cycles(
                self.name,
                lambda: self.cycle(gw, judge),
                stop,
                idle_s=self.config.idle_s,
                cycles=cycles,
            )

    async def cycle(self, gw: GatewayClient, judge: JudgePool) -> int:
        cfg = self.config
        await gw.flush()  # observations buffered while the log was away go first
        if await self._outage(gw, judge):
            return 0
        grants = await gw.lease("recheck", cfg.shards, cfg.lease_ttl_s)
        if not grants:
            return 0
        targets: list[tuple[str, int, str | None]] = []
        leases: list[str] = []
        for grant in grants:
            for ip, port, known in grant.recheck().proxies:
                targets.append((ip, port, known or None))
                leases.append(grant.lease)
        async with self._heartbeats(gw, grants):  # thousands of checks may outlast a lease
            results = await self._check(targets, judge)
        failed = [r for r in results if not r.ok]
        if failed and all(r.void for r in failed):
            # Our judges are down, not their proxies: failures now would mark a healthy
            # pool dead. The cycle is void; its shards go back uncounted.
            log.warning("recheck_void", agent=self.name, reason="no judge answers")
            for grant in grants:
                await gw.release(grant.lease, "abandoned", "judge unreachable", counted=False)
            self.voided += 1
            return 0  # no work done: wait before asking again
        events: list[Event] = []
        for (ip, port, proto), lease, r in zip(targets, leases, results, strict=True):
            if r.ok and r.proto is not None:
                events.append(self._worked(ip, port, r, lease))
            elif not r.void:  # a judge's failure says nothing of the proxy
                events.append(
                    self._ev(
                        ProxyFailed, ip=ip, port=port, proto=proto or "", error=r.error, lease=lease
                    )
                )
        await gw.publish(events)
        for grant in grants:
            await gw.release(grant.lease, "done")
        self.rechecked += len(targets)
        log.info(
            "recheck_done",
            agent=self.name,
            shards=len(grants),
            proxies=len(targets),
            working=sum(r.ok for r in results),
        )
        return len(grants)
