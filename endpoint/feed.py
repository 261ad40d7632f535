"""What the endpoint knows of the fleet, from its gateways: the pool, the sites' rules
and verdicts, and who may log in (``endpoint/logins.py``).

The pool comes as the gateways serve it (``GET /v1/proxies?limit=0&mitm=any``), asked
in the background every ``every_s`` with the ``ETag`` of the last answer (a gateway
answers 304 while its pool view has not moved), from the first gateway of the list that
answers: a gateway restarting leaves the endpoint with the pool it has. What a
consumer's traffic met
goes back under its token, once a second, as one ``ProxiesChecked`` round (``POST
/v1/events``): the fold takes a consumer's failures as its reports, within its budget,
and its successes as counts only (reducers/reports.py ``traffic``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import aiohttp
import msgspec
import structlog

from endpoint.link.upstream import Facts, Upstream
from endpoint.logins import Logins
from endpoint.router.choose import Pool
from endpoint.router.verdicts import PSL_VERSION
from events.batches import MAX_RESULTS, TRAFFIC_KEY
from events.blockpages import READER_VERSION
from events.catalogue import CheckResult, ProxiesChecked, SiteResult, SitesChecked
from events.mint import fresh_id, now_ms
from events.wire import ProxiesPage, ProxyRoute, SiteChanges, SiteRules
from gatewayapi import GatewayApi, GatewayError
from gatewayapi.client import UNREACHED

__all__ = ["Feed"]

log = structlog.get_logger("ppf.serve")

PIECE = 500  # proxies of a new pool taken in between two turns of the loop
TRAFFIC_S = 1.0  # a consumer's outcomes go to the log once a second, as one round
SITES_S = 60.0  # what the traffic showed of sites goes to the log once a minute
# The fleet's verdicts are asked for from a little before the last answer's time: a
# verdict folded just then is not missed (taking one twice changes nothing).
_OVERLAP_MS = 5_000


# The rows as the router reads them (events/wire.py ProxyRoute: ProxyOut's routing fields).
_rows: msgspec.json.Decoder[Any] = msgspec.json.Decoder(ProxyRoute)
_page = msgspec.json.Decoder(ProxiesPage)


def _json_page(body: bytes) -> bytes:
    """An answer of a gateway from before ndjson, as the lines of its proxies."""
    return b"".join(bytes(raw) + b"\n" for raw in _page.decode(body).proxies)


PIECE_BYTES = 32 * 1024  # of the gateway's answer (ndjson), decoded at a time


async def _rows_of(content: aiohttp.StreamReader) -> list[Facts]:
    """The pool in the gateway's ndjson answer, its whole lines decoded as they arrive,
    a piece at a time: the whole pool at once (one JSON document, read, decoded and
    made into upstreams) holds the loop, the gateway's in ``ppf up`` (docs/decisions.md,
    The endpoint)."""
    rows: list[Facts] = []
    rest = b""
    async for piece in content.iter_chunked(PIECE_BYTES):
        data = rest + piece
        end = data.rfind(b"\n") + 1
        rows.extend(_rows.decode_lines(data[:end]))
        rest = data[end:]
        await asyncio.sleep(0)  # what has arrived already is read without a pause
    rows.extend(_rows.decode_lines(rest))
    return rows


STOP_STEP_S = 5.0  # the longest one step of a stop waits (a cancelled task, a close)


async def _bounded(step: Awaitable[object], what: str) -> None:
    """``step`` awaited for at most ``STOP_STEP_S``; a warning naming it when it overran."""
    try:
        async with asyncio.timeout(STOP_STEP_S):
            await step
    except TimeoutError:
        log.warning("feed_stop_step_overran", step=what, after_s=STOP_STEP_S)


class Feed:
    def __init__(
        self,
        gateways: Sequence[str],
        pool: Pool,
        *,
        every_s: float = 5.0,
        identity: tuple[str, str] | None = None,
        sites_every_s: float = SITES_S,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.gateways = [g.rstrip("/") for g in gateways]
        self.headers = headers or {}  # on every call (a worker's to its endpoint, share.py)
        self.pool = pool
        self.every_s = every_s
        self.refreshed = 0  # answers that changed the pool
        self.failures = 0
        self.reports = 0
        self._etag = ""
        self._json_only: set[str] = set()  # gateways that answer no ndjson (older ones)
        self.logins = Logins(self.gateways, self.headers)
        self._http: aiohttp.ClientSession | None = None
        self._api: GatewayApi | None = None
        self._task: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        # A consumer's outcomes not sent yet, by its token: (its name, results).
        self._traffic: dict[str, tuple[str, list[CheckResult]]] = {}
        self.traffic_dropped = 0
        # The endpoint's own (name, token), under which what its traffic showed of sites
        # goes to the log (an endpoint without one keeps it to itself).
        self.identity = identity
        self._standing_at = 0  # log time (ms) of the fleet's verdicts last taken (its `now`)
        self.sites_every_s = sites_every_s
        self.sites_sent = self.sites_dropped = 0
        self._sites_task: asyncio.Task[None] | None = None
        # One round of each kind at a time: a flush (the stop's, say) waits for the round
        # in flight, whose batch is already taken, and then sends what came after it.
        self._traffic_round = asyncio.Lock()
        self._sites_round = asyncio.Lock()

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), headers=self.headers
        )
        self._api = GatewayApi(self._http, self.gateways)
        self.logins.start()
        await self.refresh()
        await self.refresh_rules()
        self._task = asyncio.create_task(self._run(), name="ppf-serve-feed")
        self._sender = asyncio.create_task(self._send_traffic(), name="ppf-serve-traffic")
        if self.identity is not None:
            self._sites_task = asyncio.create_task(self._send_sites(), name="ppf-serve-sites")

    async def stop(self) -> None:
        # Each step bounded, and said when it overran: a stop that hangs tells where.
        for task in (self._task, self._sender, self._sites_task):
            if task is not None:
                task.cancel()
                await _bounded(asyncio.gather(task, return_exceptions=True), task.get_name())
        await self.flush_traffic()  # bounded by the session's timeout, its rounds counted
        await self.flush_sites()
        await _bounded(self.logins.stop(), "logins")
        if self._http is not None:
            await _bounded(self._http.close(), "session")

    @property
    def api(self) -> GatewayApi:
        assert self._api is not None, "the feed is started"
        return self._api

    async def _run(self) -> None:
        while True:
            # An empty pool (a fleet just started) is asked for every second until it fills.
            await asyncio.sleep(self.every_s if self.pool.upstreams else min(1.0, self.every_s))
            await self.refresh()
            await self.refresh_rules()

    async def refresh_rules(self) -> None:
        """The operator's rules for reading sites (``ppf sites add``), from the first
        gateway that has them, asked under the endpoint's own name (an endpoint without
        one reads the built-in rules only); kept as they are when none answers."""
        if self.identity is None:  # the rules are for endpoints with a name of their own
            return
        for base in self.gateways:
            answer = await self.api.only(base).site_rules(token=self.identity[1])
            if answer.status == 0:
                log.warning("rules_not_read", gateway=base, error=answer.text(200))
                continue
            if answer.status != 200:
                continue
            try:
                self.pool.rules = tuple(answer.of(SiteRules, "site rules").rules)
                return
            except GatewayError as exc:
                log.warning("rules_not_read", gateway=base, error=exc.detail[:200])

    async def refresh(self) -> bool:
        """One ask of the gateways, in order; True when the pool was replaced."""
        headers = {"If-None-Match": self._etag} if self._etag else {}
        for base in self.gateways:
            try:
                form = "ndjson" if base not in self._json_only else None
                async with self.api.only(base).proxies_stream(
                    headers, limit=0, mitm="any", format=form
                ) as r:
                    if r.status == 304:
                        return False
                    if r.status == 400 and form:  # a gateway from before ndjson: ask it so
                        self._json_only.add(base)
                        return await self.refresh()
                    if r.status != 200:
                        raise aiohttp.ClientError(f"{r.status}")
                    if form:
                        fresh = await _rows_of(r.content)
                    else:
                        fresh = _rows.decode_lines(_json_page(await r.read()))
                    self._etag = r.headers.get("ETag", "")
            except (*UNREACHED, GatewayError, msgspec.DecodeError) as exc:
                self.failures += 1
                log.warning("feed_failed", gateway=base, error=repr(exc)[:200])
                continue
            for _ in self.pool.replacing(fresh, PIECE):
                await asyncio.sleep(0)
            self.refreshed += 1
            return True
        return False  # every gateway away: the pool we have stays

    def record(
        self, token: str, name: str, up: Upstream, ok: bool, latency_ms: float, why: str
    ) -> None:
        """One outcome of a consumer's traffic, sent with its others as one round a second
        (``ProxiesChecked`` under its token: its reports, in the fold's budget)."""
        pending = self._traffic.setdefault(token, (name, []))[1]
        if len(pending) < MAX_RESULTS * 20:  # a second's worth; past it, counted, not kept
            pending.append(
                CheckResult(
                    ip=up.ip,
                    port=up.port,
                    proto=up.proto,
                    ok=ok,
                    latency_ms=int(latency_ms) if ok else 0,
                    error=why[:200],
                )
            )
        else:
            self.traffic_dropped += 1

    async def _post(self, event: ProxiesChecked | SitesChecked, token: str) -> str:
        """One round to the gateways under ``token``: "" when one took it, else what
        came back (None: no gateway answered), for the caller's log line."""
        answer = await self.api.events({"events": [msgspec.to_builtins(event)]}, token=token)
        return "" if answer.ok else f"{answer.status} {answer.text(190)}"

    async def _send_traffic(self) -> None:
        while True:
            await asyncio.sleep(TRAFFIC_S)
            # Shielded: a stop during a round lets it end (its batch is taken, and would be
            # lost uncounted), and the stop's own flush waits for it.
            await asyncio.shield(self.flush_traffic())

    async def flush_traffic(self) -> None:
        async with self._traffic_round:
            await self._flush_traffic()

    async def _flush_traffic(self) -> None:
        traffic, self._traffic = self._traffic, {}
        for token, (name, results) in traffic.items():
            for start in range(0, len(results), MAX_RESULTS):
                batch = ProxiesChecked(
                    id=fresh_id(),
                    agent=name,
                    at=now_ms(),
                    key=TRAFFIC_KEY,
                    results=results[start : start + MAX_RESULTS],
                )
                if not (why := await self._post(batch, token)):
                    self.reports += sum(not r.ok for r in batch.results)
                else:
                    self.traffic_dropped += len(batch.results)
                    log.warning("traffic_not_sent", consumer=name, answer=why)

    async def _send_sites(self) -> None:
        while True:
            await asyncio.sleep(self.sites_every_s)
            await asyncio.shield(self.flush_sites())  # as _send_traffic's round
            await self.refresh_standing()

    async def refresh_standing(self) -> None:
        """The fleet's verdicts on sites that moved since the last ask
        (``GET /v1/sites/changes``), taken into the pool (``Pool.heard``): what the
        fleet's probes and the other endpoints learned routes this one's requests too."""
        if self.identity is None:
            return
        since = max(0, self._standing_at - _OVERLAP_MS)
        answer = await self.api.site_changes(since, token=self.identity[1])
        try:
            changes = answer.of(SiteChanges, "site changes")
        except GatewayError as exc:
            log.warning("site_changes_not_read", answer=exc.detail[:200])
            return
        self.pool.heard(changes.cells, time.monotonic())
        self._standing_at = changes.now

    async def flush_sites(self) -> None:
        """What the traffic showed of sites since the last round, as ``SitesChecked``
        rounds keyed ``traffic`` under the endpoint's own name: a proxy's and a site's,
        never a consumer's; nothing without an identity."""
        async with self._sites_round:
            await self._flush_sites()

    async def _flush_sites(self) -> None:
        cells, dropped = self.pool.tally.take(time.monotonic())
        if dropped:  # past the cap of cells a round: said, then counted afresh
            log.warning("site_verdicts_dropped", cells=dropped)
        if self.identity is None or not cells:
            return
        name, token = self.identity
        results = [
            SiteResult(ip=ip, port=port, site=site, through=through, blocked=blocked)
            for (ip, port, site), (through, blocked) in cells.items()
            if through or blocked  # a cell whose answers through were unsaid, and no block
        ]
        for start in range(0, len(results), MAX_RESULTS):
            batch = SitesChecked(
                id=fresh_id(), agent=name, at=now_ms(), key=TRAFFIC_KEY, psl=PSL_VERSION,
                reader=READER_VERSION, results=results[start : start + MAX_RESULTS],
            )  # fmt: skip
            if not (why := await self._post(batch, token)):
                self.sites_sent += len(batch.results)
            else:
                self.sites_dropped += len(batch.results)
                log.warning("sites_not_sent", endpoint=name, answer=why)
