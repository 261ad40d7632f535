"""The checker: lease recheck shards, re-test the proxies that are due, report both ways.

The gateway's lease payload lists the shard's due proxies (graduated intervals, spread
across ASNs: projections/recheck.py); a cycle leases shards until it holds ``batch``
due proxies, tests each with the protocol it was confirmed with and publishes
``ProxyWorked`` or ``ProxyFailed`` under its lease as each check ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from agents.check import Check
from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig
from events import ProxyFailed
from events.wire import LeaseGrant

__all__ = ["Checker", "CheckerConfig"]

log = structlog.get_logger("ppf.checker")


@dataclass(frozen=True, slots=True)
class CheckerConfig(AgentConfig):
    shards: int = 8  # shards leased at a time
    # A cycle leases shards until it holds this many due proxies (or no shard has any):
    # with a small pool a shard holds one proxy or none, and eight a cycle, each cycle
    # as long as its slowest check, rechecked 200 proxies about three times an hour
    # whatever the intervals asked (BENCHMARKS.md, issue 12).
    batch: int = 500
    max_shards: int = 64  # the gateway's leases per agent


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
        await self._run(stop, cycles, self.cycle)

    async def cycle(self, gw: GatewayClient, judge: JudgePool) -> int:
        cfg = self.config
        await gw.flush()  # observations buffered while the log was away go first
        if await self._outage(gw, judge):
            return 0
        grants: list[LeaseGrant] = []
        targets: list[tuple[str, int, str | None]] = []
        leases: list[str] = []
        while len(targets) < cfg.batch and len(grants) < cfg.max_shards:
            more = await gw.lease("recheck", min(cfg.shards, cfg.max_shards - len(grants)),
                                  cfg.lease_ttl_s)  # fmt: skip
            if not more:
                break
            grants += more
            for grant in more:
                for ip, port, known in grant.recheck().proxies:
                    targets.append((ip, port, known or None))
                    leases.append(grant.lease)
        if not grants:
            return 0
        # Results go out as checks end: a death is known when its check ends, not when
        # the cycle's slowest check does. A failure the judge explains (void) never goes.
        async with self._heartbeats(gw, grants), self._streaming(gw) as out:

            def heard(i: int, r: Check) -> None:
                ip, port, proto = targets[i]
                if r.ok and r.proto is not None:
                    out.append(self._worked(ip, port, r, leases[i]))
                elif not r.void:  # a judge's failure says nothing of the proxy
                    out.append(
                        self._ev(
                            ProxyFailed, ip=ip, port=port, proto=proto or "", error=r.error,
                            lease=leases[i],
                        )
                    )  # fmt: skip

            results = await self._check(targets, judge, on_result=heard)
        failed = [r for r in results if not r.ok]
        if failed and all(r.void for r in failed):
            # Our judges are down, not their proxies: failures now would mark a healthy
            # pool dead, so none was said. The cycle is void; its shards go back uncounted.
            log.warning("recheck_void", agent=self.name, reason="no judge answers")
            for grant in grants:
                await gw.release(grant.lease, "abandoned", "judge unreachable", counted=False)
            self.voided += 1
            return 0  # no work done: wait before asking again
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
