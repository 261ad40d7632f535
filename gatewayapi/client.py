"""The gateway's HTTP API as ppf's own programs call it: one method per route they use,
each answer read into the type events/wire.py declares for it.

Every caller inside ppf goes through here (the agents, the endpoint's feed, ``ppf mcp``,
the CLI, the benches), so a ``/v1/`` path is written nowhere else but in the gateway's
routes. The gateways given are asked in turn until one answers: ``sticky``, the one
that answered is asked first next time (an agent's, which stays on a gateway until it
fails); otherwise each call starts from the first (the endpoint's, which reports to the
first that answers). Nothing here retries or decides: a caller reads the status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from events.wire import (
    AGENT_HEADER,
    ENDPOINT_FIGURES_PATH,
    EVENTS_PATH,
    ME_PATH,
    PROXIES_PATH,
    SITE_CHANGES_PATH,
    SITE_RULES_PATH,
    WireError,
)

__all__ = ["Answer", "GatewayApi", "GatewayError"]

T = TypeVar("T")

# What reaching a gateway can raise: each is "no answer from this one".
UNREACHED = (aiohttp.ClientError, TimeoutError, OSError)


class GatewayError(WireError):
    """The gateway said no, or none could be reached (status 0)."""


class Answer(NamedTuple):
    """A gateway's answer, read whole: ``status`` 0 when none answered (``body`` then
    says why)."""

    status: int
    body: bytes
    headers: Mapping[str, str] = {}

    @property
    def ok(self) -> bool:
        return self.status == 200

    def json(self) -> Any:
        """The body decoded as JSON; its first 300 characters when it is not JSON (a
        proxy's error page, a refusal in plain text)."""
        try:
            return msgspec.json.decode(self.body)
        except msgspec.DecodeError:
            return self.text()

    def object(self) -> dict[str, Any]:
        """The body as a JSON object ({} when it is not one)."""
        decoded = self.json()
        return decoded if isinstance(decoded, dict) else {}

    def text(self, limit: int = 300) -> str:
        return self.body[:limit].decode("utf-8", "replace")

    def of(self, kind: type[T], what: str = "") -> T:
        """The body read as ``kind``; a ``GatewayError`` naming ``what`` was asked when
        the status is not 200 or the body is not one."""
        if not self.ok:
            raise GatewayError(self.status, f"{what}: {self.status} {self.text()}")
        try:
            return msgspec.json.decode(self.body, type=kind)
        except msgspec.DecodeError as exc:
            raise GatewayError(self.status, f"{what}: {exc}: {self.text()}") from None


class GatewayApi:
    """The API of the gateways ``bases`` (a comma-separated list or a sequence), over
    ``http``, as ``token`` unless a call names another."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        bases: str | Sequence[str],
        *,
        token: str = "",
        sticky: bool = False,
        on_failover: Callable[[str, str, str], None] | None = None,
    ) -> None:
        given = bases.split(",") if isinstance(bases, str) else bases
        self.bases = [b.strip().rstrip("/") for b in given if b.strip()]
        self.http = http
        self.token = token
        self.sticky = sticky
        self.on_failover = on_failover  # (gone, to, why), when a sticky client moves on
        self._at = 0

    @property
    def base(self) -> str:
        """The gateway asked first."""
        return self.bases[self._at]

    def only(self, base: str) -> GatewayApi:
        """The same API at ``base`` alone (a caller that treats each gateway apart)."""
        return GatewayApi(self.http, [base], token=self.token)

    def _order(self) -> list[int]:
        return [(self._at + i) % len(self.bases) for i in range(len(self.bases))]

    @contextlib.asynccontextmanager
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        agent: str = "",
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The first answer to ``method path`` (read it as it comes); ``GatewayError``
        (status 0) when no gateway answered. ``agent``: the name a token issued a moment
        ago is looked up under."""
        sent = dict(headers or {})
        token = self.token if token is None else token
        if token:
            sent["Authorization"] = f"Bearer {token}"
        if agent:
            sent[AGENT_HEADER] = agent
        why = "no gateway given"
        for at in self._order():
            base = self.bases[at]
            try:
                response = await self.http.request(
                    method, base + path, params=params, json=json, data=data, headers=sent
                )
            except UNREACHED as exc:
                why = repr(exc)
                continue
            if self.sticky and at != self._at:
                gone, self._at = self.base, at
                if self.on_failover is not None:
                    self.on_failover(gone, base, why[:200])
            try:
                yield response
            finally:
                response.release()
            return
        raise GatewayError(0, why)

    async def call(self, method: str, path: str, **how: Any) -> Answer:
        """``method path`` answered whole (see ``request``); status 0 when no gateway
        answered, or the answer broke off."""
        try:
            async with self.request(method, path, **how) as r:
                return Answer(r.status, await r.read(), r.headers)
        except GatewayError as exc:
            return Answer(0, exc.detail.encode())
        except UNREACHED as exc:
            return Answer(0, repr(exc).encode())

    # -- the routes

    async def healthz(self) -> Answer:
        return await self.call("GET", "/healthz")

    async def metrics(self) -> Answer:
        """``GET /metrics``: Prometheus's text."""
        return await self.call("GET", "/metrics")

    async def stats(self) -> Answer:
        """``GET /v1/stats``: the fleet's figures (a JSON object)."""
        return await self.call("GET", "/v1/stats")

    async def agents(self) -> Answer:
        return await self.call("GET", "/v1/agents")

    async def me(self, token: str | None = None, agent: str = "") -> Answer:
        """``GET /v1/agents/me``: an ``AgentMe``."""
        return await self.call("GET", ME_PATH, token=token, agent=agent)

    async def proxies(self, **params: Any) -> Answer:
        """``GET /v1/proxies`` with its filters: a ``ProxiesPage``."""
        return await self.call("GET", PROXIES_PATH, params=_query(params))

    def proxies_stream(
        self, headers: Mapping[str, str] | None = None, **params: Any
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """``GET /v1/proxies``, read as it comes (``format=ndjson``: a ``ProxyOut`` a
        line)."""
        return self.request("GET", PROXIES_PATH, params=_query(params), headers=headers)

    async def site_rules(self, token: str | None = None) -> Answer:
        """``GET /v1/sites/rules``: a ``SiteRules``."""
        return await self.call("GET", SITE_RULES_PATH, token=token)

    async def site_changes(self, since: int, token: str | None = None) -> Answer:
        """``GET /v1/sites/changes``: a ``SiteChanges``."""
        return await self.call("GET", SITE_CHANGES_PATH, params={"since": since}, token=token)

    async def leases(self, kind: str = "") -> Answer:
        """``GET /v1/leases``: the leases held (a JSON object)."""
        return await self.call("GET", "/v1/leases", params=_query({"kind": kind}))

    async def lease(self, body: Any) -> Answer:
        """``POST /v1/leases``: a ``LeasesReply``."""
        return await self.call("POST", "/v1/leases", json=body)

    async def heartbeat(self, lease: str) -> Answer:
        return await self.call("POST", f"/v1/leases/{quote(lease, safe='')}/heartbeat")

    async def release(self, lease: str, body: Any) -> Answer:
        return await self.call("POST", f"/v1/leases/{quote(lease, safe='')}/release", json=body)

    async def events(self, body: bytes | Any, token: str | None = None) -> Answer:
        """``POST /v1/events``: ``{"events": [...]}``, encoded already or not."""
        if isinstance(body, bytes):
            headers = {"Content-Type": "application/json"}
            return await self.call("POST", EVENTS_PATH, data=body, headers=headers, token=token)
        return await self.call("POST", EVENTS_PATH, json=body, token=token)

    async def deposit(self, key: str, data: bytes, headers: Mapping[str, str]) -> Answer:
        """``PUT /v1/deposits/{key}``: a ``DepositReply``."""
        return await self.call("PUT", f"/v1/deposits/{key}", data=data, headers=headers)

    async def report(self, address: str, body: Any) -> Answer:
        """``POST /v1/proxies/{address}/report``: a ``ReportReply``."""
        path = f"{PROXIES_PATH}/{quote(address, safe=':[]')}/report"
        return await self.call("POST", path, json=body)

    async def endpoint_figures(self, body: Any, token: str | None = None) -> Answer:
        """``POST /v1/endpoints/figures``: an ``EndpointFigures``."""
        return await self.call("POST", ENDPOINT_FIGURES_PATH, json=body, token=token)


def _query(params: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters as the gateway reads them: none left empty, booleans in words."""
    out = {}
    for name, value in params.items():
        if value is None or value == "":
            continue
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out
