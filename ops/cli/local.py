"""The agents `ppf up` runs itself: a worker, a checker and a seed node, enrolled afresh
at each start."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import structlog

from eventlog.client import Log
from events import Role
from gateway.judge import JudgeKeys
from ops.cli.admin import enroll
from ops.cli.common import stop_step

__all__ = ["enroll_local_agents", "local_agents"]

log = structlog.get_logger("ppf")

LOCAL_AGENTS: tuple[tuple[str, Role], ...] = (
    ("local-worker", "worker"),
    ("local-checker", "checker"),
    ("local-seed", "seed"),
    ("local-endpoint", "endpoint"),  # publishes what ppf up's endpoint sees of sites
)


async def enroll_local_agents(lg: Log) -> dict[str, str]:
    """Fresh tokens for the local worker and checker at every start, kept in memory only;
    enrolling again revokes the previous run's tokens."""
    tokens = {name: await enroll(lg, name, role) for name, role in LOCAL_AGENTS}
    log.info("local_agents_enrolled", agents=sorted(tokens))
    return tokens


async def local_agents(
    stack: AsyncExitStack,
    base: str,
    tokens: dict[str, str],
    data: Path,
    judges: list[str],
    own: tuple[str, ...],
    args: argparse.Namespace,
    tls_judge: str | None,
    keys: JudgeKeys | None,
) -> None:
    from agents.checker import Checker, CheckerConfig
    from agents.https import HTTPS_TARGETS
    from agents.seednode import SeedConfig, SeedNode
    from agents.worker import Worker, WorkerConfig

    lab = args.lab
    # A lab cannot reach the world's HTTPS endpoints: it tries none unless told.
    https = tuple(args.https_target) or (() if lab else HTTPS_TARGETS)

    def key(name: str) -> str:
        return keys.agent_key(name).hex() if keys is not None else ""

    wait = getattr(args, "agents_idle", None)
    # What the three are told alike; each its own judge key.
    common: dict[str, Any] = {
        "tls_judge": tls_judge,
        "own_judges": own,
        "https_targets": https,
        "require_judge": False,
        **({} if wait is None else {"idle_s": wait}),
    }

    def home(name: str) -> Path:
        return data / "agents" / name

    worker = Worker(
        base,
        tokens["local-worker"],
        "local-worker",
        judges,
        home("local-worker"),
        WorkerConfig(lab=lab, judge_key=key("local-worker"), **common),
    )
    checker = Checker(
        base,
        tokens["local-checker"],
        "local-checker",
        judges,
        home("local-checker"),
        CheckerConfig(judge_key=key("local-checker"), **common),
    )
    seed = SeedNode(
        base,
        tokens["local-seed"],
        "local-seed",
        judges,
        home("local-seed"),
        SeedConfig(lab=lab, judge_key=key("local-seed"), **common),
    )
    stop = asyncio.Event()
    task = asyncio.gather(worker.run(stop), checker.run(stop), seed.run(stop))

    async def _stop() -> None:
        stop.set()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(8):  # a cycle has 2 s, its releases 3 (agents/loop.py)
                await task

    stop_step(stack, "the local agents", _stop)
