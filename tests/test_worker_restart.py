"""A NATS restart in the middle of a worker's batch loses no observation and doubles none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import events as ev
from agents.worker import Worker, WorkerConfig
from gateway.app import make_app
from ops.cli import enroll
from ops.fold_service import FoldService
from ops.lab import ProxyLab
from ops.log import Log, fresh_id, now_ms
from ops.natsd import NatsServer, free_port


async def _until(cond: object, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("via", ["nats", "http"])
async def test_nats_restart_mid_batch(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path, via: str
) -> None:
    """Straight to JetStream through the worker role's NATS user, or through the gateway
    (``--http-only``): either way the outbox carries the batch over the restart."""
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    token = await enroll(lg, "w1", "worker")
    await lg.publish(
        ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(lab=True))
    )
    real = [p for p in lab.proxies if p.name in ("squid", "microsocks", "dante")]
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    page = "\n".join(f"127.0.0.1:{p.port}" for p in [*real, tarpit]) + "\n"

    async def serve_list(_: web.Request) -> web.Response:
        return web.Response(text=page)

    lists = web.Application()
    lists.router.add_get("/l.txt", serve_list)
    list_server = TestServer(lists, host="127.0.0.1")
    await list_server.start_server()
    url = str(list_server.make_url("/l.txt"))
    await lg.publish(
        ev.SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=ev.url_id(url))
    )
    fold = FoldService(lg, db=None)
    await fold.start()
    assert await fold.wait_for(await lg.head_seq(), 10)
    gateway = TestServer(make_app(fold, lg), host="127.0.0.1")
    await gateway.start_server()
    base = str(gateway.make_url("")).rstrip("/")
    # The tarpit makes the check phase last its timeout: the window for the restart.
    config = WorkerConfig(
        lab=True,
        check_timeout_s=4,
        idle_s=0.5,
        lease_ttl_s=60,
        nats=nats_server.agent_url("worker") if via == "nats" else None,
        http_only=via == "http",
    )
    worker = Worker(base, token, "w1", base + "/judge", tmp_path / "w1", config)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    outbox = tmp_path / "w1" / "outbox.jsonl"
    try:
        await _until(lambda: any(r.status == "leased" for r in fold.state.leases.values()), 20)
        assert worker.via == via
        await nats_server.astop()  # mid-batch: the worker is checking through the tarpit
        # Publishes are retried for about 15 s (NATS) or 30 s (the gateway, then 503).
        await _until(outbox.exists, 90)  # the observations could not be published: kept
        await nats_server.astart()
        await _until(lambda: not outbox.exists(), 90)  # re-sent once the log is back
        head = await lg.head_seq()
        assert await fold.wait_for(head, 20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 90)
        await gateway.close()
        await list_server.close()
        await fold.stop()
        await lg.close()
    confirmations = {p.port: fold.state.proxies[("127.0.0.1", p.port)].confirmations for p in real}
    assert confirmations == {p.port: 1 for p in real}  # none lost, none doubled
    assert ("127.0.0.1", tarpit.port) not in fold.state.proxies
    counts = fold.state.agents["w1"].counts
    assert counts["Fetched"] == 1 and counts["ProxyWorked"] == len(real)


@pytest.mark.timeout(120)
async def test_a_list_that_will_not_load_spends_no_attempt(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The fetch failure is told by Fetched (the source backs off); the lease is
    released uncounted, so a source that is down for a while never ends `failed`."""
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    token = await enroll(lg, "w1", "worker")
    await lg.publish(
        ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(lab=True))
    )
    url = f"http://127.0.0.1:{free_port()}/gone.txt"  # nothing listens there
    uid = ev.url_id(url)
    await lg.publish(ev.SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=uid))
    fold = FoldService(lg, db=None)
    await fold.start()
    gateway = TestServer(make_app(fold, lg), host="127.0.0.1")
    await gateway.start_server()
    base = str(gateway.make_url("")).rstrip("/")
    try:
        config = WorkerConfig(lab=True, idle_s=0.2, nats=nats_server.agent_url("worker"))
        worker = Worker(base, token, "w1", base + "/judge", tmp_path / "w1", config)
        await asyncio.wait_for(worker.run(asyncio.Event(), cycles=1), 60)
        assert await fold.wait_for(await lg.head_seq(), 10)
        row = next(r for r in fold.state.leases.values() if r.target == uid)
        assert (row.status, row.attempts) == ("free", 0)
        assert "Connect" in row.last_error or "refused" in row.last_error.lower()
        assert fold.state.agents["w1"].counts["Fetched.failed"] == 1
    finally:
        await gateway.close()
        await fold.stop()
        await lg.close()


@pytest.mark.timeout(120)
async def test_a_page_that_breaks_the_extractor_spoils_only_itself(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the extractor raises on one page of the batch. The other page's
    proxies are still checked and published; the broken one is released `abandoned`,
    which counts an attempt (a page that always does this is parked by the budget)."""
    import agents.worker as worker_module

    real_extract = worker_module.extract

    def extract(body: bytes, *args: object, **kw: object) -> object:
        if b"POISON" in body:
            raise ValueError("the extractor met a bug")
        return real_extract(body, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_module, "extract", extract)
    squid = next(p for p in lab.proxies if p.name == "squid")
    pages = {"/good.txt": f"127.0.0.1:{squid.port}\n", "/poison.txt": "POISON 8.8.8.8:80\n"}

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path])

    site = web.Application()
    site.router.add_get("/{name}", serve)
    list_server = TestServer(site, host="127.0.0.1")
    await list_server.start_server()
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    token = await enroll(lg, "w1", "worker")
    await lg.publish(
        ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(lab=True))
    )
    uids = {}
    for path in pages:
        url = str(list_server.make_url(path))
        uids[path] = ev.url_id(url)
        await lg.publish(
            ev.SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=uids[path])
        )
    fold = FoldService(lg, db=None)
    await fold.start()
    gateway = TestServer(make_app(fold, lg), host="127.0.0.1")
    await gateway.start_server()
    base = str(gateway.make_url("")).rstrip("/")
    try:
        config = WorkerConfig(lab=True, idle_s=0.2, check_timeout_s=5)
        worker = Worker(base, token, "w1", base + "/judge", tmp_path / "w1", config)
        await asyncio.wait_for(worker.run(asyncio.Event(), cycles=1), 60)
        assert await fold.wait_for(await lg.head_seq(), 10)
        assert ("127.0.0.1", squid.port) in fold.state.proxies
        rows = {r.target: r for r in fold.state.leases.values()}
        poisoned, good = rows[uids["/poison.txt"]], rows[uids["/good.txt"]]
        assert (poisoned.attempts, good.attempts) == (1, 0)
        assert "extractor met a bug" in poisoned.last_error
    finally:
        await gateway.close()
        await list_server.close()
        await fold.stop()
        await lg.close()
