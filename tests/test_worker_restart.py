"""A NATS restart in the middle of a worker's batch loses no observation and doubles none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.worker import Worker, WorkerConfig
from ops.lab.testbed import ProxyLab
from ops.nats.server import NatsServer
from tests.fleet import fleet


async def _until(cond: object, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.1)


# nats-py's reconnect loop replaces the writer of a connection whose CONNECT was refused
# without closing it (client.py, _attempt_reconnect); CPython closes it as the reference
# drops, with this warning. A refusal is expected here: the worker reconnects before the
# gateway's auth callout has, and the server answers "Authorization Violation" until then.
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("via", ["nats", "http"])
async def test_nats_restart_mid_batch(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path, via: str
) -> None:
    """Straight to JetStream with its own NATS login, or through the gateway
    (``--http-only``): either way the outbox carries the batch over the restart."""
    real = [p for p in lab.proxies if p.name in ("squid", "microsocks", "dante")]
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    page = "\n".join(f"127.0.0.1:{p.port}" for p in [*real, tarpit]) + "\n"
    async with fleet(nats_server, {"/l.txt": page}) as f:
        # The tarpit makes the check phase last its timeout, and the confirmations wait
        # 5 s to go out (they go within 50 ms by default, before a restart could land):
        # the window for the restart, with observations in hand.
        config = WorkerConfig(
            lab=True,
            check_timeout_s=4,
            idle_s=0.5,
            lease_ttl_s=60,
            http_only=via == "http",
            publish_gather_s=5.0,
        )
        worker = Worker(f.gateway, f.token, "w1", f.gateway + "/judge", tmp_path / "w1", config)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        outbox = tmp_path / "w1" / "outbox.jsonl"
        try:
            leases = f.fold.state.leases
            await _until(lambda: any(r.status == "leased" for r in leases.values()), 20)
            assert worker.via == via
            await nats_server.astop()  # mid-batch: the worker is checking through the tarpit
            # Publishes are retried for about 15 s (NATS) or 30 s (the gateway, then 503).
            await _until(outbox.exists, 90)  # the observations could not be published: kept
            await nats_server.astart()
            await _until(lambda: not outbox.exists(), 90)  # re-sent once the log is back
            assert await f.fold.wait_for(await f.log.head_seq(), 20)
        finally:
            stop.set()
            await asyncio.wait_for(task, 90)
        state = f.fold.state
    confirmations = {p.port: state.proxies[("127.0.0.1", p.port)].confirmations for p in real}
    assert confirmations == {p.port: 1 for p in real}  # none lost, none doubled
    assert ("127.0.0.1", tarpit.port) not in state.proxies
    counts = state.agents["w1"].counts
    assert counts["Fetched"] == 1 and counts["ProxyWorked"] == len(real)
