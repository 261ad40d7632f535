"""A one-machine system for seed and deposit tests: nats-server with its object store,
the fold with its DuckDB file and the deposit ingest, the gateway app on a port, and
agents enrolled with their own tokens (lab mode)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

import events as ev
from agents.gateway_client import GatewayClient
from eventlog.client import Log, fresh_id, now_ms
from gateway.app import make_app
from gateway.diskguard import DiskGuard
from gateway.http import GatewayConfig
from ops.cli import enroll
from ops.nats.server import NatsServer
from projections.ingest import DepositIngest
from projections.live import FoldService

__all__ = ["Box", "deposit_box"]


@dataclass
class Box:
    log: Log
    fold: FoldService
    ingest: DepositIngest
    gateway: str
    tokens: dict[str, str]
    app: web.Application | None = None  # the gateway's, for what it keeps in memory


@contextlib.asynccontextmanager
async def deposit_box(
    nats: NatsServer,
    tmp: Path,
    agents: dict[str, str],
    disk_share: float | None = None,
    trusted: tuple[str, ...] | None = None,
) -> AsyncIterator[Box]:
    """The system, ``agents`` (name -> role) enrolled; with ``trusted``, trust is on and
    those are the operator's agents (as ``ppf up`` runs)."""
    lg = await Log.connect(nats.url)
    await lg.ensure_stream()
    tokens = {name: await enroll(lg, name, role) for name, role in agents.items()}  # type: ignore[arg-type]
    settings = ev.Settings(
        lab=True, agent_subjects=True, trust=trusted is not None, trusted_agents=trusted or ()
    )
    await lg.publish(ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=settings))
    fold = FoldService(lg, db=tmp / "ppf.duckdb")
    await fold.start()
    ingest = DepositIngest(fold, lg.deposits, poll_s=0.05, sweep_s=0.3)
    await ingest.start()
    guard = None
    if disk_share is not None:
        guard = DiskGuard(lg.stored_bytes, nats.store_dir, disk_share, every_s=0.1)
    config = GatewayConfig(agent_nats=nats.agent_auth(), deposits=lg.deposits, disk_guard=guard)
    app = make_app(fold, lg, config)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert await fold.wait_for(await lg.head_seq(), 10)
        yield Box(lg, fold, ingest, str(server.make_url("")).rstrip("/"), tokens, app)
    finally:
        await server.close()
        await ingest.stop()
        await fold.stop()
        await lg.close()


async def source_lease(box: Box, gw: GatewayClient) -> str:
    """A live source lease for ``gw``'s worker, on a source of its own: the lease a page
    is stored under (gateway/deposits.py)."""
    url = f"http://lists-{gw.agent}.example.net/{fresh_id()}.txt"
    added = ev.SourceAdded(
        id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=ev.url_id(url)
    )
    await box.log.publish(added)
    assert await box.fold.wait_for(await box.log.head_seq(), 10)
    (grant,) = await gw.lease("source", 1, 600)
    return grant.lease
