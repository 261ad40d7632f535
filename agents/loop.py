"""What every agent shares: who it is, how it stamps events, and the loop it runs
(a cycle, or an idle wait when there was no work)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from agents.check import Check, Target, check_many
from agents.citizen import Citizen
from agents.gateway_client import GatewayClient
from agents.https import HTTPS_TARGETS
from agents.judgepool import JudgePool
from agents.speed import SpeedBudget
from events import Event, Heartbeat
from events.batches import MAX_RESULTS, observation
from events.mint import fresh_id, now_ms
from events.wire import DEFAULT_LEASE_TTL_S, LeaseGrant

__all__ = ["Agent", "AgentConfig", "Results", "run_cycles"]

log = structlog.get_logger("ppf.agent")


async def run_cycles(
    name: str,
    cycle: Callable[[], Awaitable[int]],
    stop: asyncio.Event,
    *,
    idle_s: float,
    cycles: int | None = None,
    grace_s: float = 2.0,
) -> int:
    """Run ``cycle`` until ``stop`` (or ``cycles`` cycles with work); returns cycles done.

    A cycle returns how many leases it worked; a failed cycle is logged and waited out
    like an idle one, never the end of the agent. Told to stop, a cycle in progress has
    ``grace_s`` to end, then is cancelled: it gives its leases back uncounted as it goes
    (``AgentLoop._heartbeats``), so a stop costs no target an attempt.
    """
    done = 0
    while not stop.is_set():
        try:
            did = await _until_stopped(cycle(), stop, grace_s)
        except asyncio.CancelledError:
            if stop.is_set() and not _cancelling():
                break  # told to stop: the cycle gave its leases back as it ended
            raise
        except Exception as exc:
            log.warning("cycle_failed", agent=name, error=repr(exc))
            did = 0
        if did:
            done += 1
            if cycles is not None and done >= cycles:
                break
            continue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(idle_s):
                await stop.wait()
    return done


async def _until_stopped(work: Awaitable[int], stop: asyncio.Event, grace_s: float) -> int:
    """``work``'s result; once ``stop`` is set, ``grace_s`` more, then it is cancelled
    (CancelledError, for the caller to tell from its own cancellation)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=grace_s)
        if not task.done():
            task.cancel()
        return await task
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not a cycle it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


RELEASE_ON_STOP_S = 3.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What every agent is told: how it checks, how long its leases last, how long it
    waits when there is no work, and where its observations go."""

    check_concurrency: int = 500
    # A proxy slower than this to fetch a tiny page is of no use, and nearly every dead
    # candidate costs exactly this: 5 s (as widely used checkers do) keeps a harvest fast.
    check_timeout_s: float = 5.0
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    idle_s: float = 30.0
    nats: str | None = None  # None: the URL the gateway offers
    tls_judge: str | None = None  # https:// judge: tunnels are checked for interception
    http_only: bool = False
    own_judges: tuple[str, ...] = ()  # ppf's own judges among the given: no budget
    judge_budget_per_s: float = 5.0  # requests a second to each public judge not ours
    # False: start even when no judge answers (``ppf up`` on a machine without internet)
    # and wait, saying so, instead of stopping.
    require_judge: bool = True
    judge_key: str = ""  # hex: this agent's key for ppf's public judge (GET /v1/agents/me)
    https_targets: tuple[str, ...] = HTTPS_TARGETS  # () tries none
    # Results go out as checks end, gathered this long into one publish (a publish a
    # second held every death back half a second: 5 simulated seconds in the churn lab).
    publish_gather_s: float = 0.05
    # What the machine asks of the agent (battery, metered link); None: never holds back.
    citizen: Citizen | None = None

    @property
    def idle_wait_s(self) -> float:
        """How long an agent without work waits before it asks again: ``idle_s``, and at
        most a heartbeat's period, so that an idle agent notices its gateway's death (and
        moves to the next) as soon as one holding leases does."""
        return min(self.idle_s, self.lease_ttl_s / 3)


# The longest a result waits, batched, before it goes out (docs/architecture.md §3).
BATCH_GATHER_S = 1.0


class Results:
    """Events that go out as they come (``Agent._streaming``): ``append`` one, and a
    publish takes what gathered within ``gather_s``; ``flush`` publishes what waits now
    (before a lease is released, so the gateway sees its results first)."""

    def __init__(self, gw: GatewayClient, gather_s: float) -> None:
        self.gw = gw
        # Batched, a round's results wait up to BATCH_GATHER_S to go out together (or
        # until a message's worth has gathered): fewer, larger messages.
        self.gather_s = max(gather_s, BATCH_GATHER_S) if gw.batches else gather_s
        self.pending: list[Event] = []
        self.ready = asyncio.Event()
        self.full = asyncio.Event()
        self.done = asyncio.Event()
        self._lock = asyncio.Lock()  # publishes in the order their events came

    def append(self, event: Event) -> None:
        self.pending.append(event)
        self.ready.set()
        if len(self.pending) >= MAX_RESULTS:
            self.full.set()

    async def flush(self) -> None:
        async with self._lock:
            if self.pending:
                batch = self.pending[:]
                del self.pending[:]
                await self.gw.publish(batch)

    async def stream(self) -> None:
        while not self.done.is_set():
            await self.ready.wait()
            if not self.done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.gather_s):
                        await self.full.wait()
            self.ready.clear()
            self.full.clear()
            await self.flush()
        await self.flush()


Config = TypeVar("Config", bound="AgentConfig")


class Agent(Generic[Config]):
    """An agent's identity and its way to the gateway; subclasses define ``run``, most
    of them as ``_run`` over their own ``cycle``, and their own state in ``_own_state``."""

    def __init__(
        self,
        gateway: str,
        token: str,
        name: str,
        judges: str | Sequence[str],
        data: Path,
        config: Config,
    ) -> None:
        self.gateway = gateway
        self.token = token
        self.name = name
        # One URL or several (``--judge`` repeated); none: the built-in public judges.
        self.judge_urls = (judges,) if isinstance(judges, str) else tuple(judges)
        self.data = data
        self.config = config
        # Downloads through the proxies it checks, to time them (a checker's: agents/speed.py).
        self.speed_budget: SpeedBudget | None = None
        self.cycles = 0
        self._client: GatewayClient | None = None
        self._why = ""  # why it takes no work, as last announced (see _outage)
        # Told to stop (the run's event): a cycle cancelled then gives its leases back.
        # Cancelled otherwise (a crash's stand-in in tests, a caller's timeout), it dies
        # holding them, and they expire as a dead agent's do.
        self._stop: asyncio.Event | None = None
        self._own_state()

    def _own_state(self) -> None:
        """A role's own state, made once the agent's is (nothing here)."""

    async def _run(
        self,
        stop: asyncio.Event,
        cycles: int | None,
        step: Callable[[GatewayClient, JudgePool], Awaitable[int]],
    ) -> None:
        """``step(gateway, judges)`` cycle after cycle until ``stop`` is set (or
        ``cycles`` cycles that had work are done), waiting ``idle_wait_s`` after one without."""
        self._stop = stop
        async with self._gateway_client() as gw, self._judges() as judge:
            self.cycles += await run_cycles(
                self.name,
                lambda: step(gw, judge),
                stop,
                idle_s=self.config.idle_wait_s,
                cycles=cycles,
            )

    @property
    def via(self) -> str:
        """Where observations go now: ``nats`` or ``http`` ("" before the agent runs)."""
        return self._client.via if self._client is not None else ""

    def _gateway_client(self) -> GatewayClient:
        """The gateway, and the way observations go (JetStream, or HTTP when told)."""
        self._client = GatewayClient(
            self.gateway,
            self.token,
            self.name,
            self.data / "outbox.jsonl",
            nats=self.config.nats,
            http_only=self.config.http_only,
        )
        return self._client

    @contextlib.asynccontextmanager
    async def _heartbeats(self, gw: GatewayClient, grants: list[LeaseGrant]) -> AsyncIterator[None]:
        """Keep ``grants``' leases while the block runs: a heartbeat each a third of the
        TTL, so a batch may take longer than its lease (two heartbeats may fail)."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.config.lease_ttl_s / 3)
                for grant in list(grants):  # the caller may drop one it gave back
                    await gw.heartbeat(grant.lease)

        keeper = asyncio.create_task(beat())
        try:
            yield
        except asyncio.CancelledError:
            # Stopped mid-work (run_cycles): the leases go back uncounted, at once, so
            # the next agent takes them without waiting out their TTL and no target pays
            # an attempt for our stop (a seed range keeps its cursor: a release leaves it).
            if self._stop is None or not self._stop.is_set():
                raise
            with contextlib.suppress(Exception):
                async with asyncio.timeout(RELEASE_ON_STOP_S):
                    await asyncio.gather(
                        *(
                            gw.release(g.lease, "abandoned", "stopped", counted=False)
                            for g in grants
                        )
                    )
            raise
        finally:
            keeper.cancel()

    @contextlib.asynccontextmanager
    async def _streaming(self, gw: GatewayClient) -> AsyncIterator[Results]:
        """Results that go out as they come while the block runs, and the rest at its
        end: a long batch of checks (thousands of dead candidates, each a timeout)
        reports its first results at once, not at its end, and a death is known to the
        pool within a publish of its check's end."""
        results = Results(gw, self.config.publish_gather_s)
        streamer = asyncio.create_task(results.stream())
        try:
            yield results
        finally:
            results.done.set()
            results.ready.set()
            await streamer

    @contextlib.asynccontextmanager
    async def _judges(self) -> AsyncIterator[JudgePool]:
        """The judge pool, asked directly at start (ValueError: none answers), watched
        while the agent runs."""
        # The gateway's own judge is ours, and so is the key it gives us, unless told.
        gw = self._client
        key = self.config.judge_key or (gw.judge_key if gw is not None else "")
        own = (
            *self.config.own_judges,
            *(g.strip().rstrip("/") + "/judge" for g in self.gateway.split(",")),
        )
        pool = JudgePool(
            self.judge_urls,
            tls_url=self.config.tls_judge,
            own=own,
            budget_per_s=self.config.judge_budget_per_s,
            agent=self.name,
            key=bytes.fromhex(key),
        )
        await pool.start(require=self.config.require_judge)
        try:
            yield pool
        finally:
            await pool.stop()

    async def _outage(self, gw: GatewayClient, judges: JudgePool) -> bool:
        """Whether the agent takes no work now: its own way out is down (no judge answers
        directly: the canary), or its machine asks it to hold back (on battery, on a
        metered link: agents/citizen.py, "paused: ..."). Said when it starts, changes
        and ends, in the log and to the fleet (a ``Heartbeat`` with ``outage``);
        meanwhile no source and no proxy is blamed for the agent's silence."""
        citizen = self.config.citizen
        why = judges.outage() or (citizen.reason() if citizen is not None else "")
        if why != self._why and await gw.announce(
            [self._ev(Heartbeat, leases=[], outage=why[:500])]
        ):
            self._why = why
            if why.startswith("paused"):
                log.info("agent_paused", agent=self.name, why=why)
            elif why:
                log.warning("network_down", agent=self.name, why=why)
            else:
                log.info("network_back", agent=self.name)
        return bool(why)

    async def _check(
        self,
        targets: Sequence[Target],
        judges: JudgePool,
        on_result: Callable[[int, Check], None] | None = None,
        timeouts: Sequence[float] = (),
    ) -> list[Check]:
        """Check ``targets`` as this agent's config says (concurrency, timeout, HTTPS);
        ``timeouts``: each target's own, where the caller fits them."""
        cfg = self.config
        return await check_many(
            targets,
            judges,
            concurrency=cfg.check_concurrency,
            timeout=cfg.check_timeout_s,
            https=cfg.https_targets,
            on_result=on_result,
            timeouts=timeouts,
            speed_budget=self.speed_budget,
        )

    def _ev(self, cls: type[Event], **fields: Any) -> Event:
        """A new event from this agent, stamped with a fresh id and this machine's clock."""
        return cls(id=fresh_id(), agent=self.name, at=now_ms(), **fields)

    def _worked(self, ip: str, port: int, result: Check, lease: str, source: str = "") -> Event:
        """The observation a successful check makes (worker and checker alike)."""
        return observation(
            True, result, id=fresh_id(), agent=self.name, at=now_ms(), ip=ip, port=port,
            source=source, lease=lease,
        )  # fmt: skip
