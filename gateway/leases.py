"""Lease granting (docs/architecture.md §7): the gateway proposes, the log decides.

A grant publishes one ``Leased`` claim per picked target on its lease subject with
``Nats-Expected-Last-Subject-Sequence`` set from the projection: a claim raced by
another gateway is refused by the server (early rejection), and whatever reaches the
log is arbitrated by the ledger reducer in log order. The gateway answers only with
the claims its own projection shows granted, so any number of gateways may run, with
no leader and never a double lease.

Compare-and-set publishes are awaited ``js.publish`` calls issued concurrently: nats-py's
``publish_async`` never resolves when the server rejects one (nats-py 2.16).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

import msgspec
import structlog

from eventlog.protocol import ConflictError, DepositError, EventLog, LogError
from events import Leased, LeaseKind, Released
from events.mint import fresh_id, now_ms
from events.subjects import proxy_of, proxy_token
from events.wire import LeaseGrant, ProxyPayload, SeedPayload, SourcePayload
from gateway.budget import CheckBudget
from gateway.deposits import Inputs
from gateway.diskguard import DiskGuard
from gateway.lookahead import Lookahead
from gateway.ranking import SourceRanking, free
from gateway.rechecks import Probing, RecheckWork
from projections.core.poolview import ProxyView
from projections.core.recheck import RecheckPolicy
from projections.holdings import live_holdings, untested_room
from projections.live import FoldService, far_behind
from projections.seeding import seed_candidates, seed_status
from reducers import State
from reducers.ledger import clamped_ttl, sure_claim

__all__ = ["SHARDS", "CheckBudget", "Granter"]


log = structlog.get_logger("ppf.leases")


# Recheck targets: the shards events.shard_of() maps proxies to.
SHARDS = tuple(f"s{i:03d}" for i in range(256))


def _payload(
    state: State, inputs: Inputs, kind: str, target: str, score: float
) -> SourcePayload | SeedPayload | ProxyPayload | None:
    """What the holder of a source, a seed range or a checked-out proxy works on (None:
    a recheck shard's, which the recheck work makes)."""
    row = state.leases.get(target)
    if kind == "source":
        src = state.sources[target]
        return SourcePayload(
            url=src.url,
            last_hash=src.last_hash,
            proto_hint=src.proto_hint,
            priority=round(score, 4),
        )
    if kind == "seed" and row is not None:
        items = inputs.cached(row.input) or []
        plan, _, rng = target.partition("-")
        given = row.input_kind or "proxies"
        chosen = items[row.cursor : row.end + 1]
        return SeedPayload(
            cursor=row.cursor, end=row.end, plan=plan, range=rng, kind=given, items=chosen
        )
    if kind == "proxy":
        ip, port = proxy_of(target)
        proxy = state.proxies.get((ip, port))
        return ProxyPayload(ip=ip, port=port, proto=proxy.proto if proxy else "")
    return None


class SeedInputs:
    """The seed plans' inputs as this gateway reads them (``inputs``), those it could
    not, and the seed status ``/v1/stats`` shows (a scan, kept a moment)."""

    def __init__(self, fold: FoldService, inputs: Inputs, guard: DiskGuard | None) -> None:
        self.fold, self.inputs, self.guard = fold, inputs, guard
        self.unreadable_inputs: dict[str, str] = {}  # seed input key -> why, for status
        self._seed: dict[str, Any] = {}
        self._seed_at = -1e9

    def status(self, now: int, max_age_s: float = 5.0) -> dict[str, Any]:
        """``projections.seeding.seed_status``, computed at most every ``max_age_s`` (a
        scan of the seed ranges and deposits), with the inputs this gateway could not read."""
        if time.monotonic() - self._seed_at > max_age_s:
            self._seed = seed_status(self.fold.state, now)
            self._seed["unreadable_inputs"] = dict(self.unreadable_inputs)
            self._seed_at = time.monotonic()
        guard = self.guard
        # Fresh at every call: an operator waits on this to see imports resume.
        self._seed["paused"] = guard.reason if guard is not None else ""
        self._seed["disk"] = guard.status() if guard is not None else {"guard": "off"}
        return self._seed

    async def readable(self, picked: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """The picked ranges whose plan's input this gateway can read (kept after the
        first read): a range whose input is missing or corrupt is not leased, and said."""
        leases = self.fold.state.leases
        out = []
        for target, score in picked:
            key = leases[target].input
            try:
                await self.inputs.items(key)
            except DepositError as exc:
                log.warning("seed_input_unreadable", target=target, input=key, error=str(exc))
                self.unreadable_inputs[key] = exc.reason
                continue
            out.append((target, score))
        return out


class Granter:
    """Picks targets and claims them for agents; one per gateway process."""

    def __init__(
        self,
        fold: FoldService,
        lg: EventLog,
        *,
        max_per_agent: int = 64,
        wait_s: float = 2.0,
        due_refresh_s: float = 0.5,
        recheck: RecheckPolicy | None = None,
        probing: Probing | None = None,
        inputs: Inputs | None = None,
        guard: DiskGuard | None = None,
    ) -> None:
        self.fold = fold
        self.guard = guard
        self.seeds = SeedInputs(fold, inputs or Inputs(None), guard)
        self.log = lg
        self.max_per_agent = max_per_agent
        self.wait_s = wait_s
        self.ranking = SourceRanking(fold, due_refresh_s)
        self._claiming: set[str] = set()  # targets this gateway has a claim in flight for
        # Targets granted ahead of the fold (a sure claim): the claim's sequence, its
        # agent and kind; kept in _claiming until the fold has applied them, and counted
        # in their agents' holdings (the ledger does not show them yet).
        self._ahead: dict[str, tuple[int, str, LeaseKind]] = {}
        self.granted = 0
        self.lost = 0
        self.rechecks = RecheckWork(fold, recheck, probing)
        self.lookahead = Lookahead()

    def _candidates(self, kind: LeaseKind, now: int) -> Iterator[tuple[str, float]]:
        """Free targets in priority order, lazily: a grant takes the first few only."""
        if kind == "source":
            return self.ranking.free_due(now, self._claiming)
        if kind == "seed":
            return self._seed_candidates(now)
        # Only shards with proxies due now (an empty shard is no work: leasing it would
        # have checkers spin), longest since last leased first.
        leases = self.fold.state.leases
        shards = sorted(
            self.rechecks.due_shards(now),
            key=lambda t: (leases[t].leased_at if t in leases else 0, t),
        )
        return ((t, 0.0) for t in shards if t not in self._claiming and free(leases.get(t), now))

    def _targets(self, kind: LeaseKind) -> int:
        """How many targets of ``kind`` there are: what an untested share is of."""
        state = self.fold.state
        if kind == "recheck":
            return len(SHARDS)
        if kind == "source":
            return len(state.sources)
        return sum(1 for row in state.leases.values() if row.kind == kind)

    def _proxy_candidates(self, views: list[ProxyView], now: int) -> Iterator[tuple[str, float]]:
        """Proxies not checked out by anyone (nor being claimed here), in the order given."""
        leases = self.fold.state.leases
        for v in views:
            target = proxy_token(v.ip, v.port)
            if target not in self._claiming and free(leases.get(target), now):
                yield target, v.latency

    def _seed_candidates(self, now: int) -> Iterator[tuple[str, float]]:
        return seed_candidates(self.fold.state, self._claiming, now)

    def _payload(
        self, kind: str, target: str, score: float, agent: str, aside: set[str]
    ) -> dict[str, Any]:
        """What the holder of ``target`` works on; ``aside``: networks whose failing
        proxies ``agent`` leaves to another checker (``RecheckWork.left_to_others``)."""
        made = _payload(self.fold.state, self.seeds.inputs, kind, target, score)
        payload = made if made is not None else self.rechecks.payload(target, agent, aside)
        return msgspec.structs.asdict(payload)

    def _settle_ahead(self) -> None:
        applied = self.fold.applied_seq
        for target, (seq, _, _) in list(self._ahead.items()):
            if seq <= applied:
                del self._ahead[target]
                self._claiming.discard(target)
            else:
                self._claiming.add(target)

    async def prepare(self) -> None:
        """Forever, for the kinds asked for lately, in two loops: the sources' ranking (in
        steps, every ``due_refresh_s``) apart from the look-ahead (gateway/lookahead.py),
        whose rounds wait on the server and left it stale (grants then ranked, 4-6 ms)."""
        async with asyncio.TaskGroup() as group:  # one failing stops both, as one did
            group.create_task(self.ranking.keep(lambda: "source" in self.lookahead.asked_lately()))
            group.create_task(self._look_ahead())

    async def _look_ahead(self) -> None:  # every LOOK_EVERY_S, or when a grant found too few
        while True:
            asked = await self.lookahead.next_round()
            self.lookahead.forget_old(time.monotonic())
            try:
                if asked and await far_behind(self.fold):
                    for kind in asked:
                        candidates = self._candidates(kind, now_ms())  # type: ignore[arg-type]
                        await self.lookahead.look_up(kind, candidates, self.fold.state, self.log)
            except LogError as exc:  # NATS away: the next round tries again
                log.debug("look_ahead_failed", error=repr(exc))
            except Exception:  # a bug: said, and the grants go on without the look-ahead
                log.exception("look_ahead_failed")

    async def grant(
        self,
        agent: str,
        kind: LeaseKind,
        count: int,
        ttl_s: int,
        *,
        proxies: list[ProxyView] | None = None,
        checkout: str = "",
        room: int | None = None,
    ) -> list[LeaseGrant]:
        """Claims for ``agent``; for kind "proxy", ``proxies`` are the candidates (served
        ones that match the checkout's filters), claimed under ``checkout``."""
        self._settle_ahead()
        now = now_ms()
        if kind == "seed" and self.guard is not None and self.guard.reason:
            return []  # the disk budget: bulk imports wait (the reason is in /v1/stats)
        state = self.fold.state
        ahead = list(self._ahead.values())  # granted, not in the ledger yet
        if room is None:
            mine = sum(holder == agent for _, holder, _ in ahead)
            room = self.max_per_agent - live_holdings(state, agent, now) - mine
        if kind != "proxy" and state.settings.trust and agent not in state.trusted:
            unfolded = [a for _, a, k in ahead if k == kind and a not in state.trusted]
            targets = self._targets(kind)
            room = min(room, untested_room(state, agent, kind, targets, now, unfolded))
        want = max(0, min(count, room))
        if kind == "proxy":
            candidates: Iterator[tuple[str, float]] = self._proxy_candidates(proxies or [], now)
            confirmed_only = False  # a checkout's candidates are the request's own
        else:
            self.lookahead.asked(kind)
            candidates = self._candidates(kind, now)
            confirmed_only = want > 0 and await far_behind(self.fold)
        claimable = self.lookahead.claimable(kind, candidates, self.fold.state, confirmed_only)
        picked = list(islice(claimable, want))
        if confirmed_only and len(picked) < want:
            self.lookahead.now()  # look further ahead for the next grant
        if not picked:
            return []
        if kind == "seed":
            picked = await self.seeds.readable(picked)
        claims = []
        for target, score in picked:
            lease = fresh_id()
            row = state.leases.get(target)
            event = Leased(
                id=lease,
                agent=agent,
                at=now,
                lease=lease,
                kind=kind,
                target=target,
                ttl_s=ttl_s,
                checkout=checkout,
            )
            # Whether the log must grant it once it is stored next on its subject: then
            # the answer needs no wait for the fold, however far behind the head it is.
            sure = sure_claim(row)
            claims.append((event, row.subject_seq if row is not None else 0, score, sure))
            self._claiming.add(target)
        sent = now_ms()  # before the claims are stored: their log time is at or after it
        acked: list[tuple[Leased, int, float, bool]] = []
        try:
            results = await asyncio.gather(
                *(self.log.publish(ev, expected_last_subject_seq=exp) for ev, exp, _, _ in claims),
                return_exceptions=True,
            )
            acked = [
                (ev, res.seq, score, sure)
                for (ev, _, score, sure), res in zip(claims, results, strict=True)
                if not isinstance(res, BaseException)
            ]
            for res in results:
                if isinstance(res, BaseException) and not isinstance(res, ConflictError):
                    raise res
            unsure = [seq for _, seq, _, sure in acked if not sure]
            if unsure:
                await self.fold.wait_for(max(unsure), self.wait_s)
        finally:
            applied = self.fold.applied_seq
            for ev, _, _, _ in claims:
                self._claiming.discard(ev.target)
            # A sure claim answered before the fold applied it stays out of the picks
            # until it has: the projection still shows its target free.
            for ev, seq, _, sure in acked:
                if sure and seq > applied:
                    self._ahead[ev.target] = (seq, agent, kind)
        self._settle_ahead()
        try:
            grants = self._answer(agent, kind, acked, sent)
        except BaseException:
            # The claims are stored and the agent will never hear of them: given back at
            # once (uncounted), not left to hold their targets until their TTL.
            await _give_back(self.log, agent, kind, acked)
            raise
        self.granted += len(grants)
        self.lost += len(claims) - len(acked)
        return grants

    def _answer(
        self, agent: str, kind: LeaseKind, acked: list[tuple[Leased, int, float, bool]], sent: int
    ) -> list[LeaseGrant]:
        """The grants for the acked claims the ledger gives ``agent``, with their payloads."""
        state = self.fold.state
        grants = []
        # Once a grant, not once a shard: it looks over the agents and the outages.
        aside = (
            self.rechecks.left_to_others(agent, now_ms()) if kind == "recheck" and acked else set()
        )
        for ev, seq, score, sure in acked:
            row = state.leases.get(ev.target)
            if row is not None and row.lease == ev.lease and row.epoch == seq:
                expires_at = row.expires_at  # folded already: the log's own figure
            elif sure:
                # Not folded yet: the log grants it at its own time, at or after ``sent``,
                # so this expiry is never later than the ledger's.
                expires_at = sent + clamped_ttl(state.settings, ev.ttl_s) * 1000
            else:
                self.lost += 1
                continue
            grants.append(
                LeaseGrant(
                    lease=ev.lease,
                    epoch=seq,
                    kind=kind,
                    target=ev.target,
                    expires_at=expires_at,
                    payload=self._payload(kind, ev.target, score, agent, aside),
                )
            )
        return grants


async def _give_back(
    lg: EventLog, agent: str, kind: LeaseKind, acked: list[tuple[Leased, int, float, bool]]
) -> None:
    """``Released`` ``abandoned``, uncounted, for claims a failed grant stored."""
    for ev, _, _, _ in acked:
        release = Released(
            id=fresh_id(),
            agent=agent,
            at=now_ms(),
            lease=ev.lease,
            target=ev.target,
            outcome="abandoned",
            counted=False,
            error="the gateway failed to answer the grant",
            kind=kind,
        )
        try:
            await lg.publish(release)
        except LogError as exc:  # the claim then expires at its TTL
            log.warning("claim_not_given_back", target=ev.target, error=repr(exc))
    log.exception("grant_failed_after_claims", agent=agent, kind=kind, given_back=len(acked))
