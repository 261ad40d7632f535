"""An agent's life beside its gateways: told to stop mid-work it stops within seconds and
gives its leases back uncounted; given several gateways it works through the one that
answers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agents.worker import Worker, WorkerConfig
from ops.lab.testbed import ProxyLab
from ops.nats.server import NatsServer, free_port
from tests.fleet import fleet


@pytest.mark.timeout(120)
async def test_a_worker_stopped_mid_check_gives_its_lease_back_uncounted(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Mid-check (a tarpit holds the checks for their 30 s timeout), stop: the worker
    ends within 6 s, its lease is free again at once, not counted as an attempt."""
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    async with fleet(nats_server, {"/l.txt": f"127.0.0.1:{tarpit.port}\n"}) as f:
        config = WorkerConfig(lab=True, check_timeout_s=30, idle_s=0.5, lease_ttl_s=600)
        worker = Worker(f.gateway, f.token, "w1", f.gateway + "/judge", tmp_path / "w1", config)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        leases = f.fold.state.leases
        deadline = time.monotonic() + 30
        while not any(r.status == "leased" for r in leases.values()):
            assert time.monotonic() < deadline, "no lease taken"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # into the checks
        told = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, 10)
        took = time.monotonic() - told
        assert await f.fold.wait_for(await f.log.head_seq(), 10)
        rows = [r for r in leases.values() if r.kind == "source"]
    assert took < 6, took
    assert rows and all((r.status, r.attempts) == ("free", 0) for r in rows), rows


@pytest.mark.timeout(120)
async def test_a_worker_moves_to_the_gateway_that_answers(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """``--gateway`` with a dead one first: the worker moves to the next, takes the
    lease there and reports what it found, nothing lost."""
    squid = next(p for p in lab.proxies if p.name == "squid")
    async with fleet(nats_server, {"/l.txt": f"127.0.0.1:{squid.port}\n"}) as f:
        dead = f"http://127.0.0.1:{free_port()}"
        config = WorkerConfig(lab=True, check_timeout_s=5, idle_s=0.5)
        worker = Worker(
            f"{dead},{f.gateway}", f.token, "w1", f.gateway + "/judge", tmp_path / "w1", config
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop, cycles=1))
        await asyncio.wait_for(task, 60)
        assert await f.fold.wait_for(await f.log.head_seq(), 10)
        assert ("127.0.0.1", squid.port) in f.fold.state.proxies
