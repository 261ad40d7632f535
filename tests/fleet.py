"""A one-machine fleet for worker tests: the log, a fold, a gateway, and list pages.

Everything real (nats-server, the aiohttp gateway on a port, pages served over HTTP);
only the size is small. Lab mode is on, so loopback proxies and pages are accepted.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import events as ev
from eventlog.client import Log, fresh_id, now_ms
from gateway.app import make_app
from gateway.http import GatewayConfig
from ops.cli import enroll
from ops.nats.server import NatsServer
from projections.live import FoldService

__all__ = ["Fleet", "fleet", "serving"]


@dataclass
class Fleet:
    log: Log
    fold: FoldService
    gateway: str  # base URL
    token: str  # of the worker "w1"
    url_ids: dict[str, str]  # page path -> its source's url_id
    urls: dict[str, str]  # page path -> its URL


@contextlib.asynccontextmanager
async def fleet(
    nats_server: NatsServer,
    pages: dict[str, str],
    *,
    unserved: Sequence[str] = (),
    hints: dict[str, str] | None = None,
    trusted: Sequence[str] | None = None,
    others: dict[str, ev.Role] | None = None,
) -> AsyncIterator[Fleet]:
    """Pages (path -> text) served and added as sources (with ``hints``: path ->
    protocol hint), and ``unserved`` URLs added as sources too (keyed by URL in
    ``url_ids``); a worker "w1" enrolled, and ``others`` (name -> role). With
    ``trusted``, trust is on and those are the operator's agents (as ``ppf up`` runs)."""

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path])

    site = web.Application()
    site.router.add_get("/{name}", serve)
    lists = TestServer(site, host="127.0.0.1")
    await lists.start_server()
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    token = await enroll(lg, "w1", "worker")
    for name, role in (others or {}).items():
        await enroll(lg, name, role)
    settings = ev.Settings(
        lab=True,
        agent_subjects=True,
        trust=trusted is not None,
        trusted_agents=tuple(trusted or ()),
    )
    await lg.publish(ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=settings))
    urls = {path: str(lists.make_url(path)) for path in pages} | {u: u for u in unserved}
    url_ids = {key: ev.url_id(url) for key, url in urls.items()}
    for key, url in urls.items():
        added = ev.SourceAdded(
            id=fresh_id(),
            agent="admin",
            at=now_ms(),
            url=url,
            url_id=url_ids[key],
            proto_hint=(hints or {}).get(key, ""),
        )
        await lg.publish(added)
    fold = FoldService(lg, db=None)
    await fold.start()
    assert await fold.wait_for(await lg.head_seq(), 10)
    # The gateway decides the embedded server's logins: agents that ask get their own.
    config = GatewayConfig(agent_nats=nats_server.agent_auth())
    gateway = TestServer(make_app(fold, lg, config), host="127.0.0.1")
    await gateway.start_server()
    try:
        yield Fleet(lg, fold, str(gateway.make_url("")).rstrip("/"), token, url_ids, urls)
    finally:
        await gateway.close()
        await lists.close()
        await fold.stop()
        await lg.close()


@contextlib.asynccontextmanager
async def serving(
    lg: Log, config: GatewayConfig | None = None
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], FoldService]]:
    """The real gateway app on a port, as a test client, over a fold caught up with the
    log; both stopped after, also when the test fails."""
    fold = FoldService(lg, db=None)
    await fold.start()
    client = TestClient(TestServer(make_app(fold, lg, config or GatewayConfig())))
    try:
        await client.start_server()
        assert await fold.wait_for(await lg.head_seq(), 10)
        yield client, fold
    finally:
        await client.close()
        await fold.stop()
