"""Deposits through the gateway: an agent stores a seed batch or a raw page here, by
key, and announces it itself with ``Deposited``.

Agents have no NATS permission on the bucket: the gateway is the one writer, and it
stores only what the key allows the caller. A seed batch's key names the range the
caller holds a live lease on, at the cursor the range stands at now; a page's key is
its own SHA-256, so junk cannot be stored under a page's key. (The fold checks both
again from the log, and every read against the recorded digest: reducers/deposits.py,
projections/ingest.py.) Seed inputs are stored by the operator (``ppf seed plan``).

Also here: the inputs of seed plans, read once by key (checked against the digest in
the key) and kept, so a seed lease carries its range's items.
"""

from __future__ import annotations

import hashlib

import structlog
from aiohttp import web

from events.keys import items_of, parse_key, range_target
from events.mint import now_ms
from events.wire import DepositReply
from gateway.http import CONFIG, FOLD, ApiError, authorize, reply
from projections.log import DepositError, DepositStore
from reducers.pool import lease_live

__all__ = ["Inputs", "routes"]

log = structlog.get_logger("ppf.deposits")

routes = web.RouteTableDef()

MAX_PAGE = 4 * 1024 * 1024  # the request cap (GatewayConfig.max_body) bounds it too


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
    data = await request.read()
    digest = hashlib.sha256(data).hexdigest()
    said = request.headers.get("X-Content-SHA256", "")
    if said and said != digest:
        raise ApiError(400, "digest", f"the body's SHA-256 is {digest}, not {said}")
    if parts.form == "page":
        if parts.sha256 != digest:
            raise ApiError(403, "not-this-page", "a page's key is the SHA-256 of its content")
        if len(data) > MAX_PAGE:
            raise ApiError(413, "too-large", f"pages are kept up to {MAX_PAGE} bytes")
    else:
        state = request.app[FOLD].state
        target = range_target(parts.plan, parts.range)
        row = state.leases.get(target)
        if row is None or row.kind != "seed":
            raise ApiError(404, "no-such-range", f"no seed range {target}")
        if row.holder != caller.name or not lease_live(row, now_ms()):
            raise ApiError(403, "not-your-range", f"{caller.name} holds no live lease on {target}")
        if parts.cursor != row.cursor:
            raise ApiError(
                409, "not-at-cursor", f"range {target} stands at {row.cursor}, not {parts.cursor}"
            )
    try:
        stored = await _store(request).put(key, data)
    except DepositError as exc:
        raise ApiError(503, "store", f"the deposit was not stored: {exc}") from exc
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
