"""A worker and seed nodes at work with trust on, as ``ppf up`` runs them, beside a peer
that lies: what the honest agents found is served, what the liar made up never is."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import events as ev
from agents.check import Check, Target
from agents.judgepool import JudgePool
from agents.seednode import SeedNode
from agents.worker import Worker, WorkerConfig
from eventlog.client import Log, fresh_id, now_ms
from events.batches import group
from ops.cli.seed import plan
from ops.lab.testbed import ProxyLab
from ops.nats.server import NatsServer
from tests.fleet import fleet
from tests.helpers import until
from tests.seedbox import deposit_box
from tests.test_seed import _node, _refusing_ports, _work_to_the_end


def _served(base: str) -> set[tuple[str, int]]:
    with urllib.request.urlopen(base + "/v1/proxies?limit=0&mitm=any", timeout=5) as r:
        body: Any = json.load(r)
    return {(p["ip"], p["port"]) for p in body["proxies"]}


async def _serves(base: str, want: set[tuple[str, int]]) -> None:
    """Until the gateway serves exactly ``want`` (its view follows the fold), 10 s at most."""
    served: set[tuple[str, int]] = set()
    for _ in range(50):
        served = await asyncio.to_thread(_served, base)
        if served == want:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"served {sorted(served)}, not {sorted(want)}")


async def _lie(lg: Log, liar: str, ports: list[int]) -> None:
    """``liar`` says, on its own subjects (all its NATS login may write), that proxies on
    ``ports`` work, in rounds as its client sends them."""
    worked = [
        ev.ProxyWorked(
            id=fresh_id(), agent=liar, at=now_ms(), ip="127.0.0.1", port=port, proto="http",
            latency_ms=5, anonymity="elite",
        )
        for port in ports
    ]  # fmt: skip
    for event in group(worked):
        await lg.publish_raw(ev.agent_subject(event), ev.encode(event), msg_id=event.id)


@pytest.mark.timeout(120)
async def test_a_worker_with_trust_on_beside_a_lying_worker(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Trust on, the operator's worker w1 trusted (as ``ppf up`` trusts its own) and a
    peer that is not: the peer confirms ten addresses nothing listens on and tries to
    fail the real proxies; w1 works a page of the lab. Served: exactly the real proxies
    w1 confirmed; the liar's made-up ones are known, never served; its failures are
    refused (a worker reports working proxies only)."""
    by = {p.name: p for p in lab.proxies}
    real = [by[n] for n in ("squid", "microsocks", "dante")]
    page = "".join(f"{p.proto}://127.0.0.1:{p.port}\n" for p in real)
    made_up = _refusing_ports(10)
    async with fleet(
        nats_server, {"/l.txt": page}, trusted=("w1",), others={"liar": "worker"}
    ) as f:
        await _lie(f.log, "liar", made_up)
        failed = [
            ev.ProxyFailed(
                id=fresh_id(), agent="liar", at=now_ms(), ip="127.0.0.1", port=p.port,
                proto=p.proto or "http",
            )
            for p in real
        ]  # fmt: skip
        for event in failed:
            await f.log.publish_raw(ev.agent_subject(event), ev.encode(event), msg_id=event.id)
        cfg = WorkerConfig(lab=True, idle_s=0.2, check_timeout_s=5)
        worker = Worker(f.gateway, f.token, "w1", f.gateway + "/judge", tmp_path / "w1", cfg)
        await asyncio.wait_for(worker.run(asyncio.Event(), cycles=1), 60)
        assert await f.fold.wait_for(await f.log.head_seq(), 10)
        state = f.fold.state
        assert all(("127.0.0.1", port) in state.proxies for port in made_up)  # known
        await _serves(f.gateway, {("127.0.0.1", p.port) for p in real})
        # Its failures were refused: the real proxies stand as w1 found them.
        assert state.agents["liar"].counts.get("ProxyFailed", 0) == 0
        assert all(state.proxies[("127.0.0.1", p.port)].fail_streak == 0 for p in real)


class _LyingNode(SeedNode):
    """A seed node whose checks say every candidate works: what a peer that wants its
    addresses served would deposit."""

    async def _check(
        self,
        targets: Sequence[Target],
        judges: JudgePool,
        on_result: Callable[[int, Check], None] | None = None,
        timeouts: Sequence[float] = (),
    ) -> list[Check]:
        return [
            Check(addr=f"{t[0]}:{t[1]}", ok=True, proto="http", latency_ms=5, anonymity="elite")
            for t in targets
        ]


@pytest.mark.timeout(150)
async def test_seed_nodes_with_trust_on_beside_a_lying_seed_node(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Trust on, the operator's seed node s1 trusted and a seed node that is not, whose
    checks say every candidate works: the liar works the dump's first range (refusing
    addresses only), s1 the rest. Every range is worked to its end; what the liar
    deposited is folded (its addresses known) and never served; served is exactly the
    real proxies, which s1 checked."""
    real = [p for p in lab.proxies if p.name in ("squid", "microsocks")]
    refusing = _refusing_ports(60)
    lines = [f"127.0.0.1:{port}" for port in refusing]
    lines += [f"{p.proto}://127.0.0.1:{p.port}" for p in real]  # in the last range
    dump = ("\n".join(lines) + "\n").encode()
    agents = {"s1": "seed", "liar": "seed"}
    async with deposit_box(nats_server, tmp_path, agents, trusted=("s1",)) as box:
        planned, _ = await plan(box.log, dump, "proxies", 20, 0)
        assert planned is not None
        liar = _node(box, "liar", tmp_path, _LyingNode, batch=20)
        await asyncio.wait_for(liar.run(asyncio.Event(), cycles=1), 60)
        state = box.fold.state
        assert await until(lambda: not state.pending_deposits, 30)
        lied = [port for port in refusing if ("127.0.0.1", port) in state.proxies]
        assert lied  # its deposit was folded: the addresses it named are known
        done = await _work_to_the_end(box, _node(box, "s1", tmp_path, batch=20))
        assert done, state.leases
        assert await box.fold.wait_for(await box.log.head_seq(), 10)
        await _serves(box.gateway, {("127.0.0.1", p.port) for p in real})
