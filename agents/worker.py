"""The worker: lease proxy-list URLs, fetch, extract, test, report, release.

One cycle: lease ``batch`` sources; fetch each (skipping extraction when the content
hash equals the lease's ``last_hash``); extract; deduplicate across the batch; cap at
``max_proxies``; check them all through the judge; publish ``Fetched``, ``Extracted``,
``ProxyWorked`` (working ones only) and ``Discovered`` (links of pages that yielded
proxies); deposit each changed page it extracted from (up to ``deposit_pages_max``
bytes, under its own SHA-256, so ``ppf reparse`` can run a better extractor over it
later) and announce it with ``Deposited``; release. A heartbeat task keeps the leases
of a long cycle alive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import structlog

from agents.check import Check
from agents.extract import EXTRACTOR, extract
from agents.fetch import Fetcher, FetchResult
from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig
from events import Deposited, Discovered, Event, Extracted, Fetched
from events.keys import page_key
from events.wire import LeaseGrant, SourcePayload

__all__ = ["Worker", "WorkerConfig"]

log = structlog.get_logger("ppf.worker")

_HREF = re.compile(rb"""href=["']([^"'<>\s]{1,300})["']""", re.IGNORECASE)
MAX_LINKS = 50  # per productive page


def _links(page: bytes, base: str) -> list[str]:
    """http(s) links of a page, relative ones resolved against its URL, in order, once."""
    out: dict[str, None] = {}
    for raw in _HREF.findall(page):
        url = urljoin(base, raw.decode("ascii", "replace")).split("#", 1)[0]
        if url.startswith(("http://", "https://")) and url != base:
            out[url] = None
            if len(out) == MAX_LINKS:
                break
    return list(out)


MAX_CANDIDATES_IN_EVENT = 1_000
MAX_VALIDATORS = 20_000  # sources whose ETag / Last-Modified a worker remembers


@dataclass(frozen=True, slots=True)
class WorkerConfig(AgentConfig):
    batch: int = 5  # url_batch_size
    # Addresses checked a cycle: bounds the memory a batch of dense lists can take (they
    # held millions) while letting a big list be checked whole.
    max_proxies: int = 20_000
    fetch_timeout_s: float = 30.0
    idle_s: float = 5.0  # sources come due all the time: look again soon
    lab: bool = False
    upstream: str | None = None
    # Raw pages kept for reparse: the changed pages extracted from, up to this size
    # (0: none). Pages are content-addressed, so a page seen twice is stored once.
    deposit_pages_max: int = 1024 * 1024


class Worker(Agent[WorkerConfig]):
    def _own_state(self) -> None:
        self.confirmed = 0
        # url -> (etag, last_modified, content_hash) of this worker's last fetch: the
        # lease payload carries only the log's last hash, so validators live here.
        self._validators: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        self.not_modified = 0
        self.pages_deposited = 0
        self.pages_not_deposited = 0
        self._deposits_off = ""  # why this gateway takes no pages (said once)

    async def _fetch(self, fetcher: Fetcher, payload: SourcePayload) -> FetchResult:
        """Conditional when this worker holds the validators of the copy the log last
        saw (same hash): a 304 then means that copy, unchanged."""
        url, last_hash = payload.url, payload.last_hash
        etag, modified, seen_hash = self._validators.get(url, ("", "", ""))
        if not seen_hash or seen_hash != last_hash:
            etag = modified = ""
        result = await fetcher.fetch(url, etag=etag, last_modified=modified)
        if result.not_modified:
            self.not_modified += 1
            result = dataclasses.replace(result, content_hash=seen_hash)
        elif result.ok and (result.etag or result.last_modified):
            self._validators[url] = (result.etag, result.last_modified, result.content_hash)
            self._validators.move_to_end(url)
            while len(self._validators) > MAX_VALIDATORS:
                self._validators.popitem(last=False)
        return result

    async def _deposit_pages(
        self, gw: GatewayClient, pages: dict[str, bytes], deposit: dict[str, tuple[str, str, int]]
    ) -> list[Event]:
        """Store the changed pages of this batch; a ``Deposited`` for each one stored.
        A page not stored is said (a warning each), never announced."""
        cap = self.config.deposit_pages_max
        todo = [
            (uid, sha, lease, items)
            for uid, (sha, lease, items) in deposit.items()
            if 0 < len(pages[uid]) <= cap and not self._deposits_off
        ]
        stored = await asyncio.gather(
            *(gw.deposit(page_key(sha), pages[uid], lease) for uid, sha, lease, _ in todo)
        )
        out: list[Event] = []
        for (uid, sha, lease, items), (status, said) in zip(todo, stored, strict=True):
            if status == 200:
                self.pages_deposited += 1
                key = page_key(sha)
                size = len(pages[uid])
                out.append(
                    self._ev(Deposited, key=key, sha256=sha, bytes=size, items=items, lease=lease)
                )
                continue
            self.pages_not_deposited += 1
            if status == 503 and "no-deposit-store" in said:
                self._deposits_off = said  # asked no more: said once, here
                log.warning("gateway_keeps_no_pages", agent=self.name, why=said[:200])
                continue
            log.warning(
                "page_not_deposited", agent=self.name, url_id=uid, status=status, why=said[:200]
            )
        return out

    async def run(self, stop: asyncio.Event, *, cycles: int | None = None) -> None:
        """Work until ``stop`` is set (or ``cycles`` cycles that had work are done)."""
        cfg = self.config
        async with Fetcher(
            upstream=cfg.upstream, lab=cfg.lab, timeout_s=cfg.fetch_timeout_s
        ) as fetcher:
            await self._run(stop, cycles, lambda gw, judge: self.cycle(gw, fetcher, judge))

    async def cycle(self, gw: GatewayClient, fetcher: Fetcher, judge: JudgePool) -> int:
        cfg = self.config
        await gw.flush()  # observations buffered while the log was away go first
        if await self._outage(gw, judge):
            return 0
        grants = await gw.lease("source", cfg.batch, cfg.lease_ttl_s)
        if not grants:
            return 0
        async with self._heartbeats(gw, grants):
            return await self._work(gw, fetcher, judge, grants)

    async def _work(
        self, gw: GatewayClient, fetcher: Fetcher, judge: JudgePool, grants: list[LeaseGrant]
    ) -> int:
        cfg = self.config
        events: list[Event] = []
        pages: dict[str, bytes] = {}
        urls: dict[str, str] = {}
        deposit: dict[str, tuple[str, str, int]] = {}  # url_id -> (sha256, lease, items)
        # One check per address across the batch: (ip, port) -> [proto, prefer, url_id,
        # lease]. A protocol written with the address (a scheme, a JSON field) is checked
        # as given; one from a hint or a word on the line is only tried first.
        found: dict[tuple[str, int], list[Any]] = {}
        outcomes: dict[str, tuple[str, str, bool]] = {}  # lease -> (outcome, error, counted)
        extracted = 0
        payloads = [g.source() for g in grants]
        fetched = await asyncio.gather(*(self._fetch(fetcher, p) for p in payloads))
        for grant, payload, result in zip(grants, payloads, fetched, strict=True):
            uid, lease = grant.target, grant.lease
            if result.upstream_down:
                # Our way out is down (Tor restarting, say): nothing was learned about
                # the source, so no Fetched, and the lease goes back uncounted.
                outcomes[lease] = ("abandoned", result.error, False)
                continue
            changed = result.ok and result.content_hash != payload.last_hash
            events.append(
                self._ev(
                    Fetched,
                    url_id=uid,
                    lease=lease,
                    ok=result.ok,
                    error=result.error,
                    http_status=result.status,
                    content_hash=result.content_hash,
                    bytes=len(result.body),
                    fetch_ms=result.fetch_ms,
                    changed=changed,
                )
            )
            # A list that would not load is the source's fault, not the lease's: its
            # Fetched says so and the source's schedule backs off (and retries within
            # 6 h). Counting it against the attempt budget would, after five tries, fail
            # the target for good, until an admin reset.
            outcomes[lease] = ("done", "", True) if result.ok else ("failed", result.error, False)
            if not changed:
                continue
            try:
                candidates = extract(result.body, payload.proto_hint or None, lab=cfg.lab)
            except Exception as exc:  # a bug meets a page: the rest of the batch goes on
                log.error("extract_failed", agent=self.name, url_id=uid, error=repr(exc))
                # Abandoned counts an attempt: a page that keeps doing this is a poison
                # target, and the attempt budget parks it.
                outcomes[lease] = ("abandoned", f"extract: {exc!r}", True)
                continue
            events.append(
                self._ev(
                    Extracted,
                    url_id=uid,
                    content_hash=result.content_hash,
                    count=len(candidates),
                    lease=lease,
                    extractor=EXTRACTOR,
                    candidates=[
                        (c.ip, c.port, c.proto or "", c.confidence)
                        for c in candidates[:MAX_CANDIDATES_IN_EVENT]
                    ],
                )
            )
            pages[uid] = result.body
            urls[uid] = payload.url
            deposit[uid] = (result.content_hash, lease, len(candidates))
            extracted += len(candidates)
            for c in candidates:
                explicit = c.proto if c.confidence >= 1.0 else None
                entry = found.get((c.ip, c.port))
                if entry is None:
                    if len(found) >= cfg.max_proxies:
                        continue  # past the cap: never checked, so not kept (lists run long)
                    entry = found[(c.ip, c.port)] = [explicit, None, uid, lease]
                if entry[0] is None and explicit is not None:
                    entry[0] = explicit
                if explicit is None and entry[1] is None:
                    entry[1] = c.proto
        targets = [(ip, port, proto, prefer) for (ip, port), (proto, prefer, _, _) in found.items()]
        # What the fetches found goes out first; confirmations follow as checks end.
        await gw.publish(events)
        events = []
        productive: set[str] = set()
        async with self._streaming(gw) as confirmed:

            def heard(index: int, check: Check) -> None:
                if check.ok and check.proto is not None:
                    ip, port = targets[index][:2]
                    uid, lease = found[(ip, port)][2:]
                    productive.add(uid)
                    confirmed.append(self._worked(ip, port, check, lease, source=uid))
                    self.confirmed += 1

            results = await self._check(targets, judge, on_result=heard)
        for uid in sorted(productive):
            links = _links(pages[uid], urls[uid])
            if links:
                events.append(self._ev(Discovered, parent=uid, urls=links))
        events.extend(await self._deposit_pages(gw, pages, deposit))
        await gw.publish(events)
        for lease, (outcome, error, counted) in outcomes.items():
            await gw.release(lease, outcome, error, counted=counted)
        if all(r.upstream_down for r in fetched):
            log.warning("upstream_down", agent=self.name, upstream=cfg.upstream)
            return 0  # no work done: wait before leasing again
        log.info(
            "cycle_done",
            agent=self.name,
            sources=len(grants),
            candidates=extracted,
            checked=len(targets),
            working=sum(r.ok for r in results),
        )
        return len(grants)
