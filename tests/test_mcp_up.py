"""``ppf mcp`` as an AI agent's host runs it: over stdio, driven by the SDK's own client,
against a ``ppf up --lab`` on the test's own ports and the real proxy lab."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ops.lab.testbed import ProxyLab
from tests.test_cli import Up

mcp = pytest.importorskip("mcp", reason="pip install -e '.[mcp]' (make test does)")


def _text(got: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in got.content)


@pytest.mark.timeout(180)
async def test_mcp_over_stdio_checks_a_lab_proxy_through_ppf_ups_judge(
    ppf_bin: str, lab: ProxyLab, tmp_path: Path
) -> None:
    """``check_proxies`` in a lab: every check was the gateway judge's 403 (the tool
    asked it with nonces no enrolled name signed); it now signs them as the consumer
    and squid passes. ``get_proxies`` answers, a misspelt argument is the tool's error,
    and ``report_proxy`` and ``fetch_url`` say the gateway's and the endpoint's reasons
    (an empty pool: no agents here) rather than failing unsaid."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    up = Up(ppf_bin, tmp_path / "data", "--lab", "--no-agents")
    await asyncio.to_thread(up.start)
    try:
        issued = await asyncio.to_thread(
            subprocess.run,
            [ppf_bin, "token", "issue", "shop", "--role", "consumer", "--nats", up.nats],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert issued.returncode == 0, issued.stderr
        token = issued.stdout.strip().splitlines()[-1]
        squid = next(p for p in lab.proxies if p.name == "squid")
        server = StdioServerParameters(
            command=ppf_bin,
            args=["mcp", "--lab"],
            env={
                "PPF_GATEWAY": up.base,
                "PPF_TOKEN": token,
                "PPF_ENDPOINT": f"127.0.0.1:{up.serve_port}",
            },
        )
        async with Client(stdio_client(server)) as client:
            got = await client.call_tool(
                "check_proxies", {"addresses": [f"127.0.0.1:{squid.port}"], "timeout_s": 10}
            )
            assert not got.is_error, _text(got)
            said = json.loads(_text(got))
            [checked] = said if isinstance(said, list) else [said]
            # Every step passed or was skipped: the judge refusing the check (a 403) is a
            # step failed. (Not "403" in the text: the proxy's port may hold those digits.)
            assert checked["verdict"] == "passed", _text(got)
            assert {s["outcome"] for s in checked["steps"]} <= {"passed", "skipped"}, _text(got)
            got = await client.call_tool("get_proxies", {"limit": 5})
            assert not got.is_error and "proxies" in _text(got), _text(got)
            got = await client.call_tool("get_proxies", {"contry": ["de"]})
            assert got.is_error and "get_proxies takes no contry" in _text(got)
            got = await client.call_tool("fetch_url", {"url": "http://93.184.216.34/"})
            assert got.is_error and "503" in _text(got), _text(got)
    finally:
        await asyncio.to_thread(up.stop)
