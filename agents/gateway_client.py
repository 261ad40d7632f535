"""An agent's side of the gateway: leases, heartbeats, releases, and observations.

Observations go to JetStream directly, through the NATS user of the agent's role (the
gateway tells an authenticated agent its URL; ``--nats`` names one), or as
``POST /v1/events`` batches with ``--http-only`` or when the gateway offers no NATS.
When the log is unreachable they are written to an outbox file and sent again, with
the same event ids, before anything newer: the log stores a re-sent id once (within
its duplicate window), so a restart of NATS or of the gateway loses no observation and
doubles none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec
import structlog

from agents.outbox import Outbox
from eventlog.client import Log, LogError, redact
from events import (
    MAX_MESSAGE,
    DecodeError,
    Event,
    agent_inbox,
    agent_msg_id,
    agent_subject,
    decode,
    encode,
)
from events.batches import group
from events.sites import SiteRule
from events.wire import AgentMe, DepositReply, LeaseGrant, LeasesReply, SiteRules
from gatewayapi import GatewayApi, GatewayError

__all__ = ["GatewayClient", "GatewayError"]


def _invalid_indexes(problem: bytes, count: int) -> dict[int, str]:
    """The events a 400 names as invalid (index -> why), or none if it names none."""
    try:
        errors = msgspec.json.decode(problem).get("errors") or []
        found = {int(e["index"]): f"{e.get('field', '')}: {e.get('reason', '')}" for e in errors}
    except (msgspec.DecodeError, AttributeError, KeyError, TypeError, ValueError):
        return {}
    return {i: why for i, why in found.items() if 0 <= i < count}


log = structlog.get_logger("ppf.agent")


# Events per JetStream round (pipelined): a failure re-sends at most this many that
# may have been stored already, and those the duplicate window absorbs.
NATS_CHUNK = 200
# A clock this far from the log's is worth a line in the agent's log (the fleet refuses
# ids past its skew setting, 5 minutes by default); asked again every STANDING_S.
CLOCK_WARN_MS = 2_000
STANDING_S = 600.0


async def _post_events(
    api: GatewayApi, pending: list[bytes], set_aside: Callable[[bytes, str], None]
) -> tuple[list[bytes], str, int]:
    """``POST /v1/events`` in batches: what is left to send, why, and how many went; an
    event the gateway names invalid is ``set_aside`` with its reason."""
    sent = 0
    size = 500
    while pending:
        chunk = pending[:size]
        answer = await api.events(b'{"events":[' + b",".join(chunk) + b"]}")
        if answer.status == 200:
            sent += len(chunk)
            pending = pending[size:]
        elif answer.status == 413 and size > 1:  # this gateway takes smaller batches
            size //= 2
        elif answer.status == 400 and (invalid := _invalid_indexes(answer.body, len(chunk))):
            for i, why in invalid.items():
                set_aside(chunk[i], why)
            pending = [e for i, e in enumerate(chunk) if i not in invalid] + pending[size:]
        else:
            return pending, f"{answer.status} {answer.text()}", sent
    return [], "", sent


async def _publish_lines(
    lg: Log, pending: list[bytes], set_aside: Callable[[bytes, str], None]
) -> tuple[list[bytes], str, int]:
    """The outbox's lines straight to JetStream, each on ``ppf.in.<agent>...`` under
    ``<agent>:<id>``, ``NATS_CHUNK`` at a time: what is left, why, and how many went; a
    line the stream would never take is ``set_aside``."""
    sent = 0
    while pending:
        lines, chunk = pending[:NATS_CHUNK], []
        for line in lines:
            if len(line) > MAX_MESSAGE:  # the stream refuses it: retried, it never goes
                set_aside(line, f"larger than the {MAX_MESSAGE} bytes allowed")
                continue
            try:
                chunk.append(decode(line))
            except DecodeError as exc:  # a damaged outbox line
                set_aside(line, exc.reason)
        try:
            # On its own subjects, under ids scoped by its name: the only ones its
            # NATS credentials may write, and the only ones the fold takes from it.
            await lg.publish_many(chunk, timeout=5.0, subject=agent_subject, msg_id=agent_msg_id)
        except LogError as exc:
            return [encode(e) for e in chunk] + pending[NATS_CHUNK:], repr(exc), sent
        sent += len(chunk)
        pending = pending[NATS_CHUNK:]
    return [], "", sent


class Notices:
    """What the gateway says the fold holds against an agent, told to its operator once
    each; asked again every ``STANDING_S``."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.asked_at = time.monotonic()
        self._warned: set[str] = set()
        self._rejected_seen = 0

    def due(self) -> bool:
        return time.monotonic() - self.asked_at >= STANDING_S

    def heard(self, me: AgentMe) -> None:
        """Tell the operator, once, what the fold holds against this agent: a clock far
        from the log's (its ids are refused past the fleet's skew) and its events the
        fold refused, with the latest reason (GET /v1/agents/me)."""
        self.asked_at = time.monotonic()
        if abs(me.skew_ms) >= CLOCK_WARN_MS and "skew" not in self._warned:
            self._warned.add("skew")
            log.warning("agent_clock_off", agent=self.agent, skew_ms=me.skew_ms)
        if me.rejected > self._rejected_seen:
            if "rejected" not in self._warned:
                self._warned.add("rejected")
                log.warning(
                    "agent_events_refused",
                    agent=self.agent,
                    rejected=me.rejected,
                    last_refusal=me.last_refusal,
                )
            self._rejected_seen = me.rejected


async def _put_deposit(api: GatewayApi, key: str, data: bytes, lease: str) -> tuple[int, str]:
    """``PUT /v1/deposits/{key}``: (200, the SHA-256 as stored) or (status, why)."""
    digest = hashlib.sha256(data).hexdigest()
    headers = {"X-Content-SHA256": digest, "Content-Type": "application/octet-stream"}
    if lease:
        headers["Ppf-Lease"] = lease
    answer = await api.deposit(key, data, headers)
    if answer.status != 200:
        return answer.status, answer.text()
    stored = answer.of(DepositReply, "deposit")
    if stored.sha256 != digest:  # stored, but not what we sent: never announce it
        return 502, f"stored {stored.sha256}, sent {digest}"
    return 200, digest


class GatewayClient:
    def __init__(
        self,
        base: str,
        token: str,
        agent: str,
        outbox: Path,
        *,
        nats: str | None = None,
        http_only: bool = False,
    ) -> None:
        self.agent = agent
        self.box = Outbox(outbox)
        self._bases = base
        self._token = token
        self._http: aiohttp.ClientSession | None = None
        self._api: GatewayApi | None = None
        self._nats_url = None if http_only else nats
        self._nats_given = nats  # --nats: used as given; else the gateway's offer, followed
        self._http_only = http_only
        self._asked = False  # until GET /v1/agents/me has answered
        # Whether the fleet reports a check round as one ProxiesChecked (the gateway says
        # so from its settings, events.catalogue.Settings.batches).
        self.batches = False
        # Our key for the fleet's judges (hex, "" when the gateway has none).
        self.judge_key = ""
        self._log: Log | None = None
        self.sent = 0
        self._sending = asyncio.Lock()
        self._notices = Notices(agent)

    @property
    def via(self) -> str:
        """Where observations go: ``nats`` or ``http``."""
        return "nats" if self._nats_url else "http"

    async def __aenter__(self) -> GatewayClient:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        # The gateways given (comma-separated): one is used until it cannot be reached,
        # then the next; leases live in the log, so any gateway heartbeats and releases
        # them, and the outbox keeps what none took.
        self._api = GatewayApi(
            self._http, self._bases, token=self._token, sticky=True, on_failover=self._moved
        )
        await self._ask_for_nats()
        return self

    async def _ask_for_nats(self) -> None:
        """Learn from the gateway, once it answers, the role's NATS URL (until then, and
        when it offers none, observations go through HTTP) and whether to batch."""
        if self._asked:
            return
        try:
            me = await self.whoami()
        except GatewayError as exc:
            log.warning("no_nats_offer_yet", agent=self.agent, error=repr(exc))
            return
        await self._follow(me)  # before it is asked: this first answer is logged below
        self._asked = True
        self._notices.heard(me)
        self.batches = me.batches
        self.judge_key = me.judge_key
        log.info(
            "agent_events_via",
            agent=self.agent,
            via=self.via,
            nats=redact(self._nats_url) if self._nats_url else None,
            batches=self.batches,
        )

    async def _follow(self, me: AgentMe) -> None:
        """Publish where the gateway says now: its NATS login for an agent trusted now,
        its own ``POST /v1/events`` for one not (yet) trusted, whose NATS login the
        server refuses (gateway/natsauth.py). An agent that earns trust moves to NATS at
        its next ask; one that loses it, at its first send that fails."""
        if self._http_only or self._nats_given is not None:
            return
        offered = me.nats or None
        if offered == self._nats_url:
            return
        if self._log is not None:
            with contextlib.suppress(LogError, OSError):
                await self._log.close()
            self._log = None
        self._nats_url = offered
        if self._asked:
            log.info("agent_events_via", agent=self.agent, via=self.via)

    async def _ask_again(self) -> None:
        """Ask again every STANDING_S (after a lease): a clock drifts, a bug ships."""
        if not self._notices.due():
            return
        try:
            me = await self.whoami()
        except GatewayError:
            self._notices.asked_at = time.monotonic()
            return
        self._notices.heard(me)
        await self._follow(me)

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        if self._log is not None:
            await self._log.close()

    def _moved(self, gone: str, to: str, why: str) -> None:
        log.warning("gateway_failover", agent=self.agent, gone=gone, to=to, why=why)

    @property
    def api(self) -> GatewayApi:
        assert self._api is not None, "the client is used inside its async with"
        return self._api

    @property
    def base(self) -> str:
        """The gateway in use now."""
        return self.api.base

    async def whoami(self) -> AgentMe:
        return (await self.api.me()).of(AgentMe, "whoami")

    async def site_rules(self, known: tuple[SiteRule, ...]) -> tuple[SiteRule, ...]:
        """The operator's rules for reading sites (``GET /v1/sites/rules``); ``known``
        when no gateway answers them."""
        try:
            return tuple((await self.api.site_rules()).of(SiteRules, "site rules").rules)
        except GatewayError:
            return known

    async def lease(self, kind: str, count: int, ttl_s: int) -> list[LeaseGrant]:
        body = {"agent": self.agent, "kind": kind, "count": count, "ttl_s": ttl_s}
        answer = await self.api.lease(body)
        if answer.status != 200:
            raise GatewayError(answer.status, f"lease: {answer.status} {answer.text()}")
        await self._ask_again()
        return answer.of(LeasesReply, "lease").leases

    async def deposit(self, key: str, data: bytes, lease: str = "") -> tuple[int, str]:
        """Store ``data`` under ``key`` through the gateway: (200, its SHA-256 as stored)
        or (status, why); a page under the source ``lease`` it was fetched for. The
        caller announces it after, with ``Deposited``."""
        return await _put_deposit(self.api, key, data, lease)

    async def heartbeat(self, lease: str) -> bool:
        return (await self.api.heartbeat(lease)).ok

    async def release(
        self, lease: str, outcome: str, error: str = "", *, counted: bool = True
    ) -> bool:
        body = {"outcome": outcome, "counted": counted, "error": error[:500]}
        # A few tries over a gateway's blip: a release that never arrives lets the lease
        # expire, and expiry counts an attempt whatever the outcome was.
        for delay in (0.5, 1.0, 2.0, 0.0):
            status = (await self.api.release(lease, body)).status
            if status != 0 and status < 500:
                return status == 200
            if delay:
                await asyncio.sleep(delay)
        return False

    async def publish(self, events: list[Event]) -> bool:
        """Send (outbox first); on failure keep the unsent on disk. True when all were sent.

        An event the log will never take (the gateway names it invalid, or it cannot be
        decoded from the outbox) is set aside in ``outbox.rejected`` with its reason,
        so it neither blocks everything after it nor is lost."""
        async with self._sending:
            await self._ask_for_nats()
            outbox = self.box.unexpired(self.box.read())
            if self.batches:  # a round's results as one message (events/batches.py)
                events = group(events)
            pending = [*outbox, *(encode(e) for e in self.box.stamp(events, outbox))]
            send = self._send_nats if self._nats_url else self._send_http
            left, detail = await send(pending)
            if left and send == self._send_nats:
                # Its NATS login refused or gone (trust lost, a kick): ask where to now;
                # with no login offered, this send goes through the gateway (also past a
                # --nats given, which an untested agent's login cannot use).
                with contextlib.suppress(GatewayError):
                    me = await self.whoami()
                    await self._follow(me)
                    if not me.nats:
                        left, detail = await self._send_http(left)
            if left:
                self.box.write(left)
                log.warning("events_buffered", count=len(left), via=self.via, detail=detail)
                return False
            self.box.path.unlink(missing_ok=True)
            return True

    async def announce(self, events: list[Event]) -> bool:
        """Send now through ``POST /v1/events``, never the outbox: for events whose
        subject only the service writes (an agent's own ``Heartbeat``), which its NATS
        user may not publish. False when the gateway did not take them (ask again)."""
        left, detail = await self._send_http([encode(e) for e in events])
        if left:
            log.warning("announce_failed", agent=self.agent, detail=detail)
        return not left

    async def _send_http(self, pending: list[bytes]) -> tuple[list[bytes], str]:
        """``POST /v1/events`` in batches; what is left to send, and why."""
        left, why, sent = await _post_events(self.api, pending, self.box.set_aside)
        self.sent += sent
        return left, why

    async def _send_nats(self, pending: list[bytes]) -> tuple[list[bytes], str]:
        """Straight to JetStream, each event on ``ppf.in.<agent>...`` under ``<agent>:<id>``."""
        assert self._nats_url is not None
        try:
            if self._log is None:
                self._log = await Log.connect(
                    self._nats_url,
                    name=f"ppf-agent-{self.agent}",
                    inbox_prefix=agent_inbox(self.agent),
                )
        except LogError as exc:
            return pending, repr(exc)
        left, why, sent = await _publish_lines(self._log, pending, self.box.set_aside)
        self.sent += sent
        return left, why

    async def flush(self) -> bool:
        """Send what the outbox holds, if anything; True when it is empty after."""
        return not self.box.path.exists() or await self.publish([])
