"""Who may log in to the endpoint, as its gateways say: a consumer's name and token,
checked with ``GET /v1/agents/me`` on connections of their own (a flood of bad logins,
which the gateway answers slowly, never holds up the pool's refresh or the traffic): one
ask however many connections log in with it at once; a login that worked is checked
again in the background once it is ``LOGIN_FRESH_S`` old (so a revoked token stops
working within seconds) and kept at most ``LOGIN_TTL_S`` while no gateway answers; a
refusal is never kept. Only a digest of each login is kept."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

import aiohttp

from gatewayapi import GatewayApi

__all__ = ["LOGIN_FRESH_S", "LOGIN_TTL_S", "Logins"]

LOGIN_FRESH_S = 5.0
LOGIN_TTL_S = 60.0
LOGINS_KEPT = 10_000  # the logins that worked, the least recently checked dropped first
LOGIN_ASKS = 16  # gateway connections for logins, apart from the pool's and the traffic's
_ROLES = ("consumer", "admin")


class Logins:
    """The logins the gateways said are good lately, and the asks under way."""

    def __init__(self, gateways: Sequence[str], headers: dict[str, str]) -> None:
        self.gateways, self.headers = gateways, headers
        # sha256(name:token) -> when a gateway last said it is a login (oldest first)
        self._logins: dict[str, float] = {}
        self._asking: dict[str, asyncio.Future[bool | None]] = {}  # one ask per login
        self.asks = 0
        self._http: aiohttp.ClientSession | None = None
        self._api: GatewayApi | None = None

    def start(self) -> None:
        self._http = aiohttp.ClientSession(
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=10),
            connector=aiohttp.TCPConnector(limit=LOGIN_ASKS),
        )
        self._api = GatewayApi(self._http, self.gateways)

    async def stop(self) -> None:
        for pending in list(self._asking.values()):
            pending.cancel()
        if self._http is not None:
            await self._http.close()

    def known(self, name: str, token: str) -> bool:
        """Whether ``name``:``token`` worked within ``LOGIN_TTL_S`` (nothing asked)."""
        checked = self._logins.get(hashlib.sha256(f"{name}:{token}".encode()).hexdigest())
        return checked is not None and time.monotonic() - checked < LOGIN_TTL_S

    async def ok(self, name: str, token: str) -> bool:
        """Whether ``name``:``token`` is a consumer's (or the admin's) login now."""
        key = hashlib.sha256(f"{name}:{token}".encode()).hexdigest()
        checked = self._logins.get(key)
        age = time.monotonic() - checked if checked is not None else LOGIN_TTL_S
        if age < LOGIN_FRESH_S:
            return True
        asking = self._ask_once(key, name, token)
        if age < LOGIN_TTL_S:
            return True  # answered as it was; the ask in the background decides the next
        said = await asyncio.shield(asking)
        # No gateway answers: a login that worked once holds until one does.
        return said is True or (said is None and checked is not None)

    async def still(self, name: str, token: str) -> bool:
        """Whether ``name``:``token`` still is a login: the gateways asked, and their
        answer awaited, once the last is ``LOGIN_FRESH_S`` old (for the connections open
        under it; no gateway answering: it holds)."""
        key = hashlib.sha256(f"{name}:{token}".encode()).hexdigest()
        checked = self._logins.get(key)
        if checked is not None and time.monotonic() - checked < LOGIN_FRESH_S:
            return True
        asking = self._ask_once(key, name, token)
        return await asyncio.shield(asking) is not False

    def _ask_once(self, key: str, name: str, token: str) -> asyncio.Future[bool | None]:
        """The ask of the gateways for this login under way, or a new one."""
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._check(key, name, token))
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return asking

    async def _check(self, key: str, name: str, token: str) -> bool | None:
        """One ask of the gateways: True a login, False not (forgotten at once), None
        when no gateway answers (a login that worked holds until ``LOGIN_TTL_S``)."""
        self.asks += 1
        assert self._api is not None
        me = await self._api.me(token=token, agent=name)
        if me.status == 0:  # no gateway answered
            return None
        status, body = me.status, me.object()
        if status == 200 and body.get("name") == name and body.get("role") in _ROLES:
            self._logins.pop(key, None)
            self._logins[key] = time.monotonic()
            while len(self._logins) > LOGINS_KEPT:
                del self._logins[next(iter(self._logins))]
            return True
        self._logins.pop(key, None)
        return False
