"""The whole worker loop, end to end: `ppf up --lab` with its local worker, a source page
listing the real proxy lab and fakes, and the pool that comes out of it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from ops.lab.testbed import ProxyLab
from tests.helpers import check_found_as_made
from tests.test_cli import Up


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _pool(base: str, mitm: str = "any") -> list[dict[str, Any]]:
    return list(_json(base + f"/v1/proxies?limit=0&status=all&mitm={mitm}")["proxies"])


@pytest.mark.timeout(180)
async def test_worker_turns_a_list_into_verified_proxies(
    lab: ProxyLab, ppf_bin: str, tmp_path: Path
) -> None:
    """A real ppf up --lab worker turns a list into verified proxies."""
    lines = []
    for p in lab.proxies:
        lines.append(
            f"socks5://127.0.0.1:{p.port}" if p.name == "microsocks" else f"127.0.0.1:{p.port}"
        )
    page = "# a proxy list\n" + "\n".join(lines) + "\nupdated 12:30:45\n"

    async def serve_list(_: web.Request) -> web.Response:
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/list.txt", serve_list)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    up = Up(ppf_bin, tmp_path / "data", "--lab")
    await asyncio.to_thread(up.start)
    try:
        added = await asyncio.create_subprocess_exec(
            ppf_bin,
            "sources",
            "add",
            str(server.make_url("/list.txt")),
            "--nats",
            up.nats,
            stderr=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
        )
        _, err = await asyncio.wait_for(added.communicate(), 60)
        assert added.returncode == 0, err.decode()
        real = {p.port: p for p in lab.proxies if p.proto is not None}
        deadline = time.monotonic() + 120
        pool: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            pool = await asyncio.to_thread(_pool, up.base)
            if len(pool) >= len(real):
                break
            await asyncio.sleep(1)
        found = {p["port"]: p for p in pool}
        assert set(found) == set(real), (sorted(found), sorted(real))  # no fake, none missed
        for port, proxy in real.items():
            # `ppf up` serves a TLS judge: the interceptor's certificate shows too.
            check_found_as_made(found[port], proxy)
        # By default the pool leaves the interceptors out.
        served = {p["port"] for p in await asyncio.to_thread(_pool, up.base, "false")}
        assert served == {port for port, p in real.items() if not p.mitm}
        sources = await asyncio.to_thread(_json, up.base + "/v1/sources")
        assert sources["sources"][0]["proxies_added"] == len(real)
        # The worker kept the page: reparse finds it by key and extracts it again, and
        # plans what the pool does not know (the fakes) for seed nodes.
        reparsed: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and reparsed.get("pages") != 1:
            out = await asyncio.to_thread(
                subprocess.run,
                [ppf_bin, "reparse", "--lab", "--nats", up.nats],
                capture_output=True, check=True, timeout=60,
            )  # fmt: skip
            reparsed = json.loads(out.stdout)
        assert (reparsed["pages"], reparsed["extracted"]) == (1, 1), reparsed
        assert reparsed["candidates"] == len(lines)
        assert reparsed["new"] == len(lab.proxies) - len(real) and reparsed["plan"]
    finally:
        assert await asyncio.to_thread(up.stop) == 0
        await server.close()
    # The local agents published straight to JetStream, each through its role's NATS
    # user, and no password reached the log.
    lines = [json.loads(x) for x in up.logfile.read_text().splitlines() if x.startswith("{")]
    via = {x["agent"]: x["via"] for x in lines if x.get("event") == "agent_events_via"}
    assert via == {"local-worker": "nats", "local-checker": "nats", "local-seed": "nats"}
    passwords = json.loads((tmp_path / "data" / "nats" / "auth.json").read_text())
    assert not any(pw in up.logfile.read_text() for pw in passwords.values())
