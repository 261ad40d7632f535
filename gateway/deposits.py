"""Deposits through the gateway: an agent stores a seed batch or a raw page here, by
key, and announces it itself with ``Deposited``.

Agents have no NATS permission on the bucket: the gateway is the one writer, and it
stores only what the key allows the caller. A seed batch's key names the range the
caller holds a live lease on, at the cursor the range stands at now; a page's key is
its own SHA-256, so junk cannot be stored under a page's key, and a page is stored only
under a live source lease its depositor holds (``Ppf-Lease``, or any it holds), within
``PAGE_BYTES_PER_LEASE`` a lease; a page not announced (``Deposited``) by the time its
lease ends, and a minute after, is deleted by ``Pages.sweep``. Refusals are counted per
agent (``deposits_refused`` in ``/v1/agents``; this gateway's). (The fold checks both
again from the log, and every read against the recorded digest: reducers/deposits.py,
projections/ingest.py.) Seed inputs are stored by the operator (``ppf seed plan``).

Also here: the inputs of seed plans, read once by key (checked against the digest in
the key) and kept, so a seed lease carries its range's items.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from eventlog.protocol import DepositError, DepositStore
from events.keys import items_of, parse_key, range_target
from events.mint import now_ms
from events.wire import DepositReply
from gateway.http import CONFIG, FOLD, ApiError, authorize, reply
from projections.tasks import stop_tasks
from reducers import State
from reducers.pool import lease_live

__all__ = ["PAGES", "Inputs", "Pages", "routes", "sweeping"]

log = structlog.get_logger("ppf.deposits")

routes = web.RouteTableDef()

MAX_PAGE = 4 * 1024 * 1024  # the request cap (GatewayConfig.max_body) bounds it too
PAGE_BYTES_PER_LEASE = 2 * MAX_PAGE  # a source lease is one fetch: its page, and a retry
UNANNOUNCED_GRACE_MS = 60_000  # after its lease ends, a page not announced is deleted
SWEEP_EVERY_S = 15.0
# How long a deposit waits for a lease this fold has not applied yet (granted a moment ago).
GRANT_WAIT_S = 2.0


@dataclass
class Pages:
    """The pages this gateway stored: bytes by lease, and those not announced yet by the
    time they must be (key -> unix ms), swept from the store after; refusals by agent."""

    by_lease: dict[str, int] = field(default_factory=dict)
    due: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    swept: int = 0

    def refuse(self, agent: str, status: int, kind: str, detail: str) -> ApiError:
        self.refused[agent] = self.refused.get(agent, 0) + 1
        return ApiError(status, kind, detail)

    async def sweep(self, state: State, store: DepositStore | None, now: int) -> int:
        """Delete the pages past their time that no ``Deposited`` announced; forget the
        ones announced. How many were deleted."""
        gone = 0
        for key, deadline in list(self.due.items()):
            if key in state.deposits:
                del self.due[key]
            elif deadline <= now and store is not None:
                with contextlib.suppress(DepositError):
                    await store.delete(key)
                    gone += 1
                    log.info("page_swept", key=key, why="never announced under its lease")
                del self.due[key]
        live = {lease for lease in self.by_lease if lease in state.lease_owner}
        for lease in [k for k in self.by_lease if k not in live]:
            del self.by_lease[lease]  # released or expired and folded: its bytes are done
        self.swept += gone
        return gone


PAGES = web.AppKey("pages", Pages)


async def sweeping(app: web.Application) -> AsyncIterator[None]:
    """``Pages.sweep`` every ``SWEEP_EVERY_S`` while the app runs."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                await app[PAGES].sweep(app[FOLD].state, app[CONFIG].deposits, now_ms())
            except Exception:  # a bug: said, and the sweep goes on at the next round
                log.exception("page_sweep_failed")

    task = asyncio.create_task(loop(), name="ppf-page-sweep")
    yield
    await stop_tasks([task], 5)  # a bare cancel can be lost on 3.11 (projections/tasks.py)


async def _page_lease(request: web.Request, agent: str, size: int) -> tuple[str, int]:
    """(the live source lease ``agent`` stores this page under, when it ends): the one
    ``Ppf-Lease`` names, else any it holds with room for ``size`` bytes. A lease named
    but not folded here yet (granted a moment ago, by another gateway or ahead of the
    fold) is looked for once more at the head."""
    fold, pages = request.app[FOLD], request.app[PAGES]
    named = request.headers.get("Ppf-Lease", "")
    if named and named not in fold.state.lease_owner:
        await fold.caught_up_now(GRANT_WAIT_S)
    state, now = fold.state, now_ms()
    targets = sorted(state.holders.get(agent, ()))
    held = [named] if named else [state.leases[t].lease for t in targets]
    full = False
    for lease in held:
        target = state.lease_owner.get(lease)
        row = state.leases.get(target) if target is not None else None
        if row is None or row.holder != agent or row.kind != "source" or not lease_live(row, now):
            continue
        if pages.by_lease.get(lease, 0) + size <= PAGE_BYTES_PER_LEASE:
            return lease, row.expires_at
        full = True
    if full:
        raise pages.refuse(
            agent, 413, "lease-full", f"{PAGE_BYTES_PER_LEASE} bytes of pages a lease at most"
        )
    why = f"no live source lease {named[:64]!r}" if named else "no live source lease"
    raise pages.refuse(agent, 403, "no-lease", f"{agent} holds {why}: pages need one")


def _store(request: web.Request) -> DepositStore:
    store = request.app[CONFIG].deposits
    if store is None:
        raise ApiError(503, "no-deposit-store", "this gateway has no deposit store")
    return store


@routes.put("/v1/deposits/{key:.+}")
async def put_deposit(request: web.Request) -> web.Response:
    caller = authorize(request, "worker", "seed")
    key = request.match_info["key"]
    parts = parse_key(key)
    if parts is None or parts.form == "input":
        raise ApiError(400, "bad-key", "a deposit key is <plan>/<range>/<cursor> or page/<sha256>")
    pages = request.app[PAGES]
    lease, due = "", 0
    if parts.form == "page":  # before the body is read: a caller without a lease sends none
        size = request.content_length or 0
        if size > MAX_PAGE:
            raise pages.refuse(caller.name, 413, "too-large", f"pages up to {MAX_PAGE} bytes")
        lease, due = await _page_lease(request, caller.name, size)
    data = await request.read()
    digest = hashlib.sha256(data).hexdigest()
    said = request.headers.get("X-Content-SHA256", "")
    if said and said != digest:
        raise pages.refuse(
            caller.name, 400, "digest", f"the body's SHA-256 is {digest}, not {said}"
        )
    if parts.form == "page":
        if parts.sha256 != digest:
            raise pages.refuse(
                caller.name, 403, "not-this-page", "a page's key is the SHA-256 of its content"
            )
        if len(data) > MAX_PAGE:
            raise pages.refuse(caller.name, 413, "too-large", f"pages up to {MAX_PAGE} bytes")
        lease, due = await _page_lease(request, caller.name, len(data))
    else:
        fold = request.app[FOLD]
        target = range_target(parts.plan, parts.range)
        row = fold.state.leases.get(target)

        def held() -> bool:
            return row is not None and row.holder == caller.name and lease_live(row, now_ms())

        if row is not None and not held():
            # Granted ahead of this fold (a sure claim, gateway/leases.py) or by another
            # gateway, and not folded here yet: a batch deposited at once after its
            # grant was refused. The head as it is now, as for a page.
            await fold.caught_up_now(GRANT_WAIT_S)
            row = fold.state.leases.get(target)
        if row is None or row.kind != "seed":
            raise ApiError(404, "no-such-range", f"no seed range {target}")
        if not held():
            raise ApiError(403, "not-your-range", f"{caller.name} holds no live lease on {target}")
        if parts.cursor != row.cursor:
            raise ApiError(
                409, "not-at-cursor", f"range {target} stands at {row.cursor}, not {parts.cursor}"
            )
    try:
        stored = await _store(request).put(key, data)
    except DepositError as exc:
        raise ApiError(503, "store", f"the deposit was not stored: {exc}") from exc
    if lease:
        pages.by_lease[lease] = pages.by_lease.get(lease, 0) + len(data)
        if key not in request.app[FOLD].state.deposits:
            pages.due[key] = max(pages.due.get(key, 0), due + UNANNOUNCED_GRACE_MS)
    return reply(DepositReply(key=key, sha256=stored, bytes=len(data)))


class Inputs:
    """Seed inputs by deposit key, read once and kept as their items."""

    def __init__(self, store: DepositStore | None, keep: int = 8) -> None:
        self.store = store
        self.keep = keep
        self._items: dict[str, list[str]] = {}

    async def items(self, key: str) -> list[str]:
        """The items of input ``key``; DepositError when it cannot be read as recorded."""
        found = self._items.get(key)
        if found is not None:
            return found
        parts = parse_key(key)
        if self.store is None or parts is None or parts.form != "input":
            raise DepositError("missing", f"no input {key!r} here")
        found = items_of(await self.store.get(key, parts.sha256))
        if len(self._items) >= self.keep:
            self._items.pop(next(iter(self._items)))
        self._items[key] = found
        return found

    def cached(self, key: str) -> list[str] | None:
        return self._items.get(key)
