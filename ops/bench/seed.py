"""``ppf bench seed``: a candidate dump worked by seed nodes in the world in a box.

``ppf up`` beside the world (no lab mode, no local agents), its judge given to the world
on the link address; a dump of ``lines`` candidates, the world's working proxies (its
honest ones and ``extra_working`` relays) spread among refusing addresses (the box owns
them, nothing listens: a reset) and silent ones (nobody owns them: a connect times out),
imported with ``ppf import proxies``; ``nodes`` processes of ``ppf agent seed``, the first
killed with SIGKILL once it has deposited a batch of a range it still holds. It ends
when every item is reached and every deposit folded.

The figures: candidates settled a second per node (lines / wall seconds / nodes), and
what an honest run must show (tests/test_seed_world.py asserts them at 20,000 lines):
items reached once each, the killed node's range finished by another from its cursor,
the pool holding exactly the world's working proxies.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gatewayapi import GatewayApi
from ops.bench.options import Seed
from ops.bench.upbox import gateway_json, up_beside
from ops.lab.world import World

__all__ = ["bench_seed", "dump_lines", "seed_world"]

_PPF = [sys.executable, "-m", "ops.cli"]


def dump_lines(world: World, lines: int) -> tuple[list[str], set[str]]:
    """(the dump, the working proxies in it): the working ones spread evenly among
    refusing and silent addresses (one in ten silent), on many ports each."""
    real = [f"{p.addr}:{p.port}" for p in world.proxies] + [f"{a}:{p}" for a, p in world.extra]
    dead = []
    for i in range(lines - len(real)):
        addr, _ = (world.silent if i % 10 == 0 else world.refusing)[i % len(world.refusing)]
        dead.append(f"{addr}:{10_000 + i // len(world.refusing)}")
    step = max(1, len(dead) // (len(real) + 1))
    for n, line in enumerate(real):
        dead.insert((n + 1) * step, line)
    return dead, set(real)


def _run(*args: str, timeout: float = 120) -> str:
    done = subprocess.run([*_PPF, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ppf {' '.join(args[:3])} failed: {done.stderr[-2000:]}")
    return done.stdout


def _node(base: str, own_judge: str, token: str, data: Path, batch: int) -> subprocess.Popen[bytes]:
    with open(data.parent / f"{data.name}.log", "ab") as log:  # the child keeps its copy
        return subprocess.Popen(
            [
                *_PPF, "agent", "seed", "--gateway", base, "--token", token,
                # The fleet's own judge, where the world reaches it (public judges take
                # 5 checks a second each, which a dump of dead lines would spend).
                "--own-judge", own_judge,
                # The box's addresses sit in a few /24s: the per-network pace a real dump
                # wants would make every run a long one.
                "--per-net", "100000", "--check-timeout", "2", "--lease-ttl", "20",
                "--seed-batch", str(batch), "--data", str(data),
            ],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip


async def seed_world(
    world: World,
    root: Path,
    lines: int,
    *,
    nodes: int = 3,
    size: int = 2_000,
    batch: int = 250,
    timeout_s: float = 420.0,
) -> dict[str, Any]:
    """One run (see the module's docstring); what it saw, for a test or a benchmark."""
    dump, real = dump_lines(world, lines)
    procs: list[subprocess.Popen[bytes]] = []
    with up_beside(world, root, "--no-agents") as up:
        await up.started()
        try:
            path = root / "dump.txt"
            path.write_text("\n".join(dump) + "\n")
            imported = await asyncio.to_thread(
                _run, "import", "proxies", str(path), "--size", str(size),
                "--nats", up.nats_url, "--gateway", up.base,
            )  # fmt: skip
            plan = json.loads(imported)["plan"]
            tokens = []
            for i in range(nodes):
                issued = await asyncio.to_thread(
                    _run, "token", "issue", f"seed{i}", "--role", "seed", "--nats", up.nats_url
                )
                tokens.append(issued.strip().splitlines()[-1])
            began = time.monotonic()
            for i, token in enumerate(tokens):
                procs.append(_node(up.base, up.judge_url, token, root / f"seed{i}", batch))
            # Kill seed0 once it has deposited a batch and still holds the range.
            victim: dict[str, Any] | None = None
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and victim is None:
                leases = await gateway_json(up.base, lambda api: api.leases(kind="seed"))
                for row in leases["leases"]:
                    held = row["holder"] == "seed0" and row["status"] == "leased"
                    if held and row["start"] < row["cursor"] <= row["end"]:
                        victim = row
                await asyncio.sleep(0.5)
            if victim is not None:
                os.kill(procs[0].pid, signal.SIGKILL)
            seed: dict[str, Any] = {}
            while time.monotonic() < deadline:
                seed = (await gateway_json(up.base, GatewayApi.stats))["seed"]
                # The seed status is recomputed every few seconds: a plan imported just
                # now may not be in it yet.
                reached = seed["plans"].get(plan, {}).get("reached")
                if reached == lines and seed["deposits"]["pending"] == 0:
                    break
                await asyncio.sleep(1)
            seconds = time.monotonic() - began
            leases = (await gateway_json(up.base, lambda api: api.leases(kind="seed")))["leases"]
            everything = {"limit": 0, "status": "all", "mitm": "any"}
            pool = await gateway_json(up.base, lambda api: api.proxies(**everything))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
    p = seed.get("plans", {}).get(plan, {})
    finished = (
        next((r for r in leases if r["target"] == victim["target"]), None) if victim else None
    )
    known = {f"{x['ip']}:{x['port']}" for x in pool["proxies"]}
    return {
        "bench": "seed",
        "lines": lines,
        "nodes": nodes,
        "range_size": size,
        "batch": batch,
        "real": len(real),
        "seconds": round(seconds, 1),
        "settled_per_s_per_node": round(p.get("reached", 0) / seconds / nodes, 1),
        "plan": p,
        "by_node": {name: n["items"] for name, n in seed.get("nodes", {}).items()},
        # Per node over the whole run (the killed one's share is what it did before).
        "per_node_per_s": {
            name: round(n["items"] / seconds, 1) for name, n in seed.get("nodes", {}).items()
        },
        "deposits": seed.get("deposits", {}),
        "victim": victim,
        "victim_range_after": finished,
        "missing_real": sorted(real - known),
        "unexpected": sorted(known - real),
    }


async def bench_seed(seed: Seed) -> dict[str, Any]:
    lines, nodes, extra_working = seed.lines, seed.nodes, seed.working
    with tempfile.TemporaryDirectory(prefix="ppf-bench-seed-") as tmp:
        root = Path(tmp)
        with World(root / "world", extra_working=extra_working) as world:
            return await seed_world(world, root, lines, nodes=nodes, timeout_s=3_600)
