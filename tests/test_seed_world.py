"""Seed nodes in the world in a box: `ppf up` with no lab mode, a 20,000-line dump of
the world's real proxies among refusing and silent addresses, three `ppf agent seed`
processes, one killed with SIGKILL mid-range."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from tests.test_cli import Up

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

LINES = 20_000


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with World(tmp_path_factory.mktemp("world-seed")) as w:
        yield w


def _dump(world: World) -> list[str]:
    """The world's real proxies spread among refusing addresses (the box owns them and
    nothing listens: a reset) and silent ones (nobody owns them: a connect times out),
    on many ports each."""
    real = [f"{p.addr}:{p.port}" for p in world.proxies]
    dead = []
    for i in range(LINES - len(real)):
        addr, _ = (world.silent if i % 10 == 0 else world.refusing)[i % len(world.refusing)]
        dead.append(f"{addr}:{10_000 + i // len(world.refusing)}")
    step = len(dead) // (len(real) + 1)
    for n, line in enumerate(real):
        dead.insert((n + 1) * step, line)
    return dead


def _seed_node(
    ppf_bin: str, up: Up, world: World, own_judge: str, token: str, data: Path
) -> subprocess.Popen[bytes]:
    with open(data.parent / f"{data.name}.log", "ab") as log:  # the child keeps its copy
        return subprocess.Popen(
            [
                ppf_bin, "agent", "seed", "--gateway", up.base, "--token", token,
                # The fleet's own judge, where the world reaches it: public judges (the box
                # has two) take 5 checks a second each, which a dump of dead lines wastes.
                "--own-judge", own_judge, "--judge", world.judges["httpbin"],
                # The box's addresses sit in a few /24s: the per-network pace a real dump
                # wants would make this a long test.
                "--per-net", "100000", "--check-timeout", "2", "--lease-ttl", "20",
                "--seed-batch", "250", "--data", str(data),
            ],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip


@pytest.mark.timeout(600)
async def test_three_seed_nodes_work_a_dump_once_one_killed_mid_range(
    world: World, ppf_bin: str, tmp_path: Path
) -> None:
    """Every item settled exactly once (items reached = items deposited = lines), the
    killed node's range finished by another from its cursor, every real proxy known."""
    judge_port = free_port()
    up = Up(
        ppf_bin, tmp_path / "data", "--no-seed", "--no-agents",
        *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
        *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
    )  # fmt: skip
    await asyncio.to_thread(up.start)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        dump = tmp_path / "dump.txt"
        dump.write_text("\n".join(_dump(world)) + "\n")
        out = await asyncio.to_thread(
            subprocess.run,
            [ppf_bin, "import", "proxies", str(dump), "--size", "2000", "--nats", up.nats],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        plan = json.loads(out.stdout)["plan"]
        for i in range(3):
            issued = await asyncio.to_thread(
                subprocess.run,
                [ppf_bin, "token", "issue", f"seed{i}", "--role", "seed", "--nats", up.nats],
                capture_output=True, check=True, timeout=60,
            )  # fmt: skip
            token = issued.stdout.decode().strip().splitlines()[-1]
            own = f"http://{LINK_HOST}:{judge_port}/judge"
            nodes.append(_seed_node(ppf_bin, up, world, own, token, tmp_path / f"seed{i}"))
        # Kill seed0 once it has deposited a batch and still holds a range.
        deadline = time.monotonic() + 240
        victim = None
        while time.monotonic() < deadline and victim is None:
            leases = await asyncio.to_thread(_json, up.base + "/v1/leases?kind=seed")
            for row in leases["leases"]:
                held = row["holder"] == "seed0" and row["status"] == "leased"
                if held and row["start"] < row["cursor"] <= row["end"]:
                    victim = row
            await asyncio.sleep(0.5)
        assert victim is not None, "seed0 never deposited a batch"
        os.kill(nodes[0].pid, signal.SIGKILL)
        cursor_at_kill = victim["cursor"]
        seed: dict[str, Any] = {}
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            seed = (await asyncio.to_thread(_json, up.base + "/v1/stats"))["seed"]
            p = seed["plans"][plan]
            if p["reached"] == LINES and seed["deposits"]["pending"] == 0:
                break
            await asyncio.sleep(2)
        p = seed["plans"][plan]
        assert (p["items"], p["reached"]) == (LINES, LINES), seed
        assert p["ranges"]["done"] == LINES // 2000 and p["ranges"]["failed"] == 0
        assert sum(n["items"] for n in seed["nodes"].values()) == LINES  # once each
        assert seed["deposits"]["poisoned"] == 0 and seed["deposits"]["pending"] == 0
        leases = await asyncio.to_thread(_json, up.base + "/v1/leases?kind=seed")
        finished = next(r for r in leases["leases"] if r["target"] == victim["target"])
        assert finished["holder"] != "seed0" or finished["status"] != "leased"
        assert finished["cursor"] > finished["end"] and cursor_at_kill > 0
        pool = await asyncio.to_thread(_json, up.base + "/v1/proxies?limit=0&status=all&mitm=any")
        known = {f"{x['ip']}:{x['port']}" for x in pool["proxies"]}
        real = {f"{x.addr}:{x.port}" for x in world.proxies}
        assert real <= known, sorted(real - known)
        assert known <= real, sorted(known - real)  # nothing dead got in
    finally:
        for node in nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(20)
            except subprocess.TimeoutExpired:
                node.kill()
        assert await asyncio.to_thread(up.stop) == 0
