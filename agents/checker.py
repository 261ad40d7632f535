"""The checker: lease recheck shards, re-test the proxies that are due, report both ways.

The gateway's lease payload lists the shard's due proxies (graduated intervals, spread
across ASNs: projections/core/recheck.py); the checker keeps up to ``batch`` of them in
flight, tests each with the protocol it was confirmed with, publishes ``ProxyWorked``
or ``ProxyFailed`` under its lease as each check ends, and gives each shard back as
soon as its own checks are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from agents.check import Check
from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig, Results
from agents.probe import Prober
from agents.speed import SpeedBudget
from events import ProxyFailed, SitesChecked
from events.blockpages import READER_VERSION
from events.catalogue import SiteResult
from events.wire import LeaseGrant

__all__ = ["Checker", "CheckerConfig", "fitted_timeout"]

log = structlog.get_logger("ppf.checker")

# A TARGET probe of a round: (its grant, ip, port, proto, site, the path it asks).
Probe = tuple[int, str, int, str, str, str]


@dataclass(frozen=True, slots=True)
class CheckerConfig(AgentConfig):
    shards: int = 8  # shards leased at a time
    # A cycle leases shards until it holds this many due proxies (or no shard has any):
    # with a small pool a shard holds one proxy or none, and eight a cycle, each cycle
    # as long as its slowest check, rechecked a small pool far less often than its
    # intervals asked (docs/decisions.md, Agents).
    batch: int = 500
    max_shards: int = 64  # the gateway's leases per agent
    # Lease requests at most this often: shards going back one by one must not each
    # cost the gateway a look over the pool for due ones.
    lease_gap_s: float = 0.2
    # A recheck waits for a known proxy this many times what its checks have taken (the
    # pool's latency EMA), at least fit_floor_s, at most check_timeout_s; 0: always the
    # check timeout. A dead proxy's check is most of the time it is served dead: a 5 s
    # timeout for a proxy that answers in 0.5 s kept it in the pool 5 s longer.
    fit_timeout: float = 3.0
    fit_floor_s: float = 2.0
    # TARGET probes (agents/probe.py): bytes of sites' answers read an hour, at most.
    probe_bytes_per_hour: int = 64 * 1024 * 1024
    # Downloads that time the proxies that work (agents/speed.py): bytes an hour, at most
    # (128 downloads of 256 KiB); 0 times none.
    speed_bytes_per_hour: int = 32 * 1024 * 1024
    rules_refresh_s: float = 60.0  # how often the sites' rules are asked for


def fitted_timeout(latency_ms: int, cfg: CheckerConfig) -> float:
    """How long a recheck waits for a proxy whose checks have taken ``latency_ms`` (the
    pool's EMA; 0: unknown, the whole check timeout)."""
    if not cfg.fit_timeout or latency_ms <= 0:
        return cfg.check_timeout_s
    fitted = max(cfg.fit_floor_s, cfg.fit_timeout * latency_ms / 1000)
    return min(cfg.check_timeout_s, fitted)


async def _logged(agent: str, round_: Coroutine[Any, Any, None]) -> None:
    try:
        await round_
    except Exception as exc:  # its shards went back (or expire); the checker goes on
        log.warning("cycle_failed", agent=agent, error=repr(exc))


class Checker(Agent[CheckerConfig]):
    def _own_state(self) -> None:
        config = self.config
        self.rechecked = 0
        self.voided = 0  # rounds thrown away because the judge did not answer
        self._holding = 0  # recheck leases held by rounds in flight
        self._in_flight = 0  # their proxies not checked yet
        self._freed = asyncio.Event()  # a shard went back: room to lease again
        self._paused_until = 0.0  # loop time: after a void round, an idle wait
        self.prober = Prober(config.probe_bytes_per_hour)
        if config.speed_bytes_per_hour:
            self.speed_budget = SpeedBudget(config.speed_bytes_per_hour)
        self.probed = 0

    async def run(self, stop: asyncio.Event, *, cycles: int | None = None) -> None:
        """Lease and check until ``stop`` (or ``cycles`` rounds that leased work).

        Rounds overlap: a round leases due shards and checks them, and each shard is
        released as soon as its own checks end and their results are out; meanwhile
        the checker leases more as soon as it has room (``batch`` proxies in flight,
        ``max_shards`` leases). A round that waited for its slowest check (a dead
        proxy's timeout) held every other proxy's next check back by that long
        (docs/decisions.md, Agents)."""
        async with self._gateway_client() as gw, self._judges() as judge:
            self.cycles += await self._flow(gw, judge, stop, cycles)

    async def _flow(
        self, gw: GatewayClient, judge: JudgePool, stop: asyncio.Event, cycles: int | None
    ) -> int:
        cfg = self.config
        rounds: set[asyncio.Task[None]] = set()
        stopping = asyncio.create_task(stop.wait())
        done = 0
        loop = asyncio.get_running_loop()
        last_ask = -cfg.lease_gap_s
        try:
            while not stop.is_set():
                leased = 0
                self._freed.clear()  # before leasing: a shard going back meanwhile wakes us
                if self._in_flight < cfg.batch and self._holding < cfg.max_shards:
                    gap = last_ask + cfg.lease_gap_s - loop.time()
                    if gap > 0:
                        await asyncio.sleep(gap)
                    last_ask = loop.time()
                    try:
                        leased = await self._begin(gw, judge, rounds)
                    except Exception as exc:  # a failed lease is waited out, never the end
                        log.warning("cycle_failed", agent=self.name, error=repr(exc))
                if leased:
                    done += 1
                    if cycles is not None and done >= cycles:
                        break
                    continue  # more may be due now
                # Wait for room (a shard released), for the stop, or idle_wait_s for work.
                freed = asyncio.create_task(self._freed.wait())
                await asyncio.wait(
                    {stopping, freed}, timeout=cfg.idle_wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                freed.cancel()
        finally:
            stopping.cancel()
            await asyncio.gather(*rounds, return_exceptions=True)
        return done

    async def _begin(
        self, gw: GatewayClient, judge: JudgePool, rounds: set[asyncio.Task[None]]
    ) -> int:
        """Lease due shards up to the room left and start checking them; returns how
        many shards were leased."""
        cfg = self.config
        if asyncio.get_running_loop().time() < self._paused_until:
            return 0  # a round our judges failed: wait before asking again
        await gw.flush()  # observations buffered while the log was away go first
        if await self._outage(gw, judge):
            return 0
        grants: list[LeaseGrant] = []
        probes: list[Probe] = []  # (grant, ip, port, proto, site, path)
        targets: list[tuple[str, int, str | None]] = []
        timeouts: list[float] = []
        owner: list[int] = []  # targets[i] is grants[owner[i]]'s
        room = cfg.batch - self._in_flight
        while len(targets) < room and self._holding + len(grants) < cfg.max_shards:
            want = min(cfg.shards, cfg.max_shards - self._holding - len(grants))
            more = await gw.lease("recheck", want, cfg.lease_ttl_s)
            if not more:
                break
            for grant in more:
                payload = grant.recheck()
                latencies = payload.latency_ms
                if len(latencies) != len(payload.proxies):  # an older gateway: none sent
                    latencies = [0] * len(payload.proxies)
                for (ip, port, known), latency in zip(payload.proxies, latencies, strict=True):
                    targets.append((ip, port, known or None))
                    timeouts.append(fitted_timeout(latency, cfg))
                    owner.append(len(grants))
                paths = payload.paths  # where the operator gave a target's URL
                probes.extend((len(grants), *p, paths.get(p[3], "/")) for p in payload.probes)
                grants.append(grant)
        if not grants:
            return 0
        if probes:
            await self.prober.refresh_rules(gw, self.config.rules_refresh_s)
        self._holding += len(grants)
        self._in_flight += len(targets)
        round_ = self._round(gw, judge, grants, targets, timeouts, owner, probes)
        task = asyncio.create_task(_logged(self.name, round_))
        rounds.add(task)
        task.add_done_callback(rounds.discard)
        return len(grants)

    async def _round(
        self,
        gw: GatewayClient,
        judge: JudgePool,
        grants: list[LeaseGrant],
        targets: list[tuple[str, int, str | None]],
        timeouts: list[float],
        owner: list[int],
        probes: list[Probe],
    ) -> None:
        """Check one round's proxies and make its probes; each shard goes back when its
        own checks and probes end (and the round's, if a probe of it said nothing), its
        probes' verdicts said first (``SitesChecked``)."""
        left = [0] * len(grants)  # by shard: its proxies not checked yet, probes not made
        for g in owner:
            left[g] += 1
        size = left[:]  # its checks (what a judge's failure is weighed against)
        unprobed = [0] * len(grants)  # by shard: its probes not made
        for g, *_ in probes:
            left[g] += 1
            unprobed[g] += 1
        verdicts: list[list[SiteResult]] = [[] for _ in grants]
        unsaid: list[list[tuple[str, int, str]]] = [[] for _ in grants]  # probes said none
        waiting: list[int] = []  # shards done but for their probes that said none
        probing: list[asyncio.Task[None]] = []
        void = [0] * len(grants)  # failures a judge explains, by shard
        settled = [False] * len(grants)
        releases: list[asyncio.Task[None]] = []
        held = list(grants)  # heartbeats go to these
        working = 0

        async def give_back(g: int, out: Results) -> None:
            # Its results first, so the gateway never sees the shard free and its
            # proxies not yet checked; its probes read alike, read again with the rest.
            verdicts[g] += self.prober.told(unsaid[g])
            if verdicts[g]:
                shard = grants[g].target
                lease = grants[g].lease
                said = self._ev(
                    SitesChecked,
                    key=shard,
                    results=verdicts[g],
                    lease=lease,
                    reader=READER_VERSION,
                )
                out.append(said)
            await out.flush()
            if void[g] and void[g] == size[g]:
                # Our judges failed it, not its proxies: nothing was said, and the shard
                # goes back uncounted.
                await gw.release(grants[g].lease, "abandoned", "judge unreachable", counted=False)
            else:
                await gw.release(grants[g].lease, "done")
            held.remove(grants[g])
            self._holding -= 1
            self._freed.set()

        try:
            async with self._heartbeats(gw, held), self._streaming(gw) as out:

                def give_back_now(g: int) -> None:
                    settled[g] = True
                    releases.append(asyncio.create_task(give_back(g, out)))

                for g in range(len(grants)):
                    if not left[g]:  # nothing due in it after all (the budget, a race)
                        give_back_now(g)

                def heard(i: int, r: Check) -> None:
                    nonlocal working
                    ip, port, proto = targets[i]
                    g = owner[i]
                    if r.ok and r.proto is not None:
                        working += 1
                        out.append(self._worked(ip, port, r, grants[g].lease))
                    elif r.void:  # a judge's failure says nothing of the proxy
                        void[g] += 1
                    else:
                        out.append(
                            self._ev(
                                ProxyFailed, ip=ip, port=port, proto=proto or "",
                                error=r.error, lease=grants[g].lease,
                            )
                        )  # fmt: skip
                    self._in_flight -= 1
                    settle(g)

                def settle(g: int) -> None:
                    left[g] -= 1
                    if left[g] == 0:
                        if unsaid[g] and any(unprobed):  # read once all probes are in
                            waiting.append(g)  # (the fastest end before any block came)
                        else:
                            give_back_now(g)
                    while waiting and not any(unprobed):
                        give_back_now(waiting.pop())

                async def probe(
                    g: int, ip: str, port: int, proto: str, site: str, path: str
                ) -> None:
                    # Cancelled with a round that failed, it leaves its shard unsettled
                    # (given back below) and its counts as they were.
                    found = await self.prober.result(ip, port, proto, site, path)
                    unprobed[g] -= 1
                    self.probed += 1
                    if found is not None:
                        verdicts[g].append(found)
                    else:
                        unsaid[g].append((ip, port, site))
                    settle(g)

                probing += [asyncio.create_task(probe(*p)) for p in probes]
                results = await self._check(targets, judge, on_result=heard, timeouts=timeouts)
                await asyncio.gather(*probing)
                await asyncio.gather(*releases)
        finally:
            for task in probing:  # a round that failed mid-way leaves no probe running
                task.cancel()
            for g, grant in enumerate(grants):  # not settled: failed or cancelled mid-way
                if not settled[g]:
                    self._holding -= 1
                    await gw.release(grant.lease, "abandoned", "checker stopped", counted=False)
            self._in_flight -= sum(left) - sum(unprobed)
            self._freed.set()
        failed = [r for r in results if not r.ok]
        if failed and all(r.void for r in failed):
            # Our judges are down, not their proxies: failures now would mark a healthy
            # pool dead, so none was said, and the shards went back uncounted.
            log.warning("recheck_void", agent=self.name, reason="no judge answers")
            self.voided += 1
            self._paused_until = asyncio.get_running_loop().time() + self.config.idle_s
            return
        self.rechecked += len(targets)
        log.info(
            "recheck_done",
            agent=self.name,
            shards=len(grants),
            proxies=len(targets),
            working=working,
        )
