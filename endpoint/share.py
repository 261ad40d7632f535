"""One feed for the workers of one endpoint (``ppf serve --workers N``): what they ask
the gateways for, asked once.

Each worker is a ``ppf serve`` process of its own on the same port (``SO_REUSEPORT``:
the kernel spreads the connections), with its own feed (endpoint/feed.py) pointed here
instead of at the gateways. This stands between them on loopback and forwards every
call to the first gateway that answers, as a feed would, except that a GET's answer is
kept and given to every worker that asks the same within its period: the pool
(``/v1/proxies``) and the sites' rules for the feed's refresh period, a login that worked
(``/v1/agents/me``, 200) for ``LOGIN_KEPT_S``, never a refusal; and one ask at a time
for the same call. (The sites' changes are asked from each worker's own last answer:
no two ask the same.) The gateway sees one endpoint's feed and logins, not N. What the
traffic shows (``POST /v1/events``) goes through as each worker sends it. Only the
workers may call it: each call carries the secret this process gave them.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import Counter
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from events.wire import AGENT_HEADER, ME_PATH, PROXIES_PATH, SITE_RULES_PATH
from gatewayapi import GatewayApi

__all__ = ["SECRET_HEADER", "Shared"]

SECRET_HEADER = "Ppf-Worker"
LOGIN_KEPT_S = 2.0  # within a worker's LOGIN_FRESH_S: a revoked token still stops in seconds
_FORWARDED = ("Authorization", AGENT_HEADER, "Content-Type")


class _Kept:
    __slots__ = ("at", "body", "etag", "kind", "status")

    def __init__(self, status: int, body: bytes, etag: str, kind: str, at: float) -> None:
        self.status, self.body, self.etag, self.kind, self.at = status, body, etag, kind, at


class Shared:
    """The workers' feed of ``gateways``, on ``127.0.0.1`` (``start`` gives its URL)."""

    def __init__(self, gateways: Sequence[str], every_s: float, secret: str) -> None:
        self.gateways = [g.rstrip("/") for g in gateways]
        self.every_s = every_s
        self.secret = secret
        self.asked: Counter[str] = Counter()  # calls that went to a gateway, by path
        self.kept_answers: Counter[str] = Counter()  # calls answered from what was kept
        self._kept: dict[tuple[str, str, str], _Kept] = {}
        self._asking: dict[tuple[str, str, str], asyncio.Future[_Kept | None]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._api: GatewayApi | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, port: int) -> str:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._api = GatewayApi(self._http, self.gateways)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._call)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def _period(self, path: str) -> float:
        if path in (PROXIES_PATH, SITE_RULES_PATH):
            return self.every_s
        return LOGIN_KEPT_S if path == ME_PATH else 0.0

    async def _call(self, request: web.Request) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get(SECRET_HEADER, ""), self.secret):
            return web.Response(status=403, text="not a worker of this endpoint")
        headers = {k: request.headers[k] for k in _FORWARDED if k in request.headers}
        if request.method != "GET" or not self._period(request.path):
            found = await self._ask(request.method, request.path_qs, headers, await request.read())
        else:
            key = (request.path_qs, headers.get("Authorization", ""), headers.get(AGENT_HEADER, ""))
            found = await self._kept_or_asked(key, request.path, headers)
        if found is None:
            return web.Response(status=502, text="no gateway answered")
        if found.etag and request.headers.get("If-None-Match") == found.etag:
            return web.Response(status=304, headers={"ETag": found.etag})
        out = {"ETag": found.etag} if found.etag else {}
        if found.kind:
            out["Content-Type"] = found.kind
        return web.Response(status=found.status, body=found.body, headers=out)

    async def _kept_or_asked(
        self, key: tuple[str, str, str], path: str, headers: dict[str, str]
    ) -> _Kept | None:
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept.at < self._period(path):
            self.kept_answers[path] += 1
            return kept
        asking = self._asking.get(key)
        if asking is not None:  # one ask at a time for one call
            self.kept_answers[path] += 1
            return await asyncio.shield(asking)
        future: asyncio.Future[_Kept | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        found = None
        try:
            if kept is not None and kept.etag:
                headers = {**headers, "If-None-Match": kept.etag}
            found = await self._ask("GET", key[0], headers, b"")
            if found is not None and found.status == 304 and kept is not None:
                kept.at = found.at
                found = kept
            elif found is not None and found.status == 200:
                self._kept[key] = found
                if len(self._kept) > 10_000:  # logins of many consumers: the oldest go
                    for old in sorted(self._kept, key=lambda k: self._kept[k].at)[:1_000]:
                        del self._kept[old]
            return found
        finally:  # those who waited get what came (nothing, on an error: a 502 to them)
            del self._asking[key]
            future.set_result(found)

    async def _ask(
        self, method: str, path_qs: str, headers: dict[str, str], body: bytes
    ) -> _Kept | None:
        assert self._api is not None
        # The worker's own headers (its token among them) go as they came.
        answer = await self._api.call(method, path_qs, headers=headers, data=body or None)
        if answer.status == 0:
            return None
        self.asked[path_qs.split("?")[0]] += 1
        kind = answer.headers.get("Content-Type", "")
        etag = answer.headers.get("ETag", "")
        return _Kept(answer.status, answer.body, etag, kind, time.monotonic())
