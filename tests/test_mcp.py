"""``ppf mcp`` as its callers meet it outside the box: over streamable HTTP only with
the bearer token, its tools listed by the SDK's own client, a URL off the public
internet refused before anything is fetched, and a start without a gateway refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from ops.nats.server import free_port

mcp = pytest.importorskip("mcp", reason="pip install 'ppf[mcp]'")


def _listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=1)
        except urllib.error.HTTPError:
            return  # it answers (401 without the token)
        except OSError:
            time.sleep(0.2)
    raise AssertionError("ppf mcp --listen never answered")


@pytest.mark.timeout(90)
async def test_mcp_over_http_needs_its_bearer_token_and_lists_its_tools() -> None:
    """Without the token, 401; with it, the SDK's client lists the four tools, a fetch of
    loopback, a private address or an internal name is refused, a check of a private
    proxy address too, a gateway that does not answer is said to, not hidden, and a
    ``limit`` outside 1-1,000 is the tool's error (0 was one proxy, HTTP's 0 the pool)."""
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    env = {
        **os.environ,
        "PPF_GATEWAY": "http://127.0.0.1:9",
        "PPF_TOKEN": "a-consumer-token",
        "PPF_ENDPOINT": "127.0.0.1:9",
        "PPF_MCP_TOKEN": "the-bearer",
    }
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "ops.cli", "mcp", "--listen", str(port)],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        await asyncio.to_thread(_listening, port, proc)
        for shown in ({}, {"Authorization": "Bearer not-it"}):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", headers=shown)
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, request)
            assert refused.value.code == 401
        http = httpx2.AsyncClient(headers={"Authorization": "Bearer the-bearer"})
        async with (
            http,
            Client(
                streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            ) as client,
        ):
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == {"get_proxies", "check_proxies", "fetch_url", "report_proxy"}
            for url in ("http://127.0.0.1:8080/", "http://192.168.1.1/", "http://router.lan/"):
                got = await client.call_tool("fetch_url", {"url": url})
                text = " ".join(getattr(c, "text", "") for c in got.content)
                assert got.is_error and "refused" in text, (url, text)
            got = await client.call_tool("get_proxies", {"works_on": ["example.com"]})
            text = " ".join(getattr(c, "text", "") for c in got.content)
            assert got.is_error and "gave no answer" in text, text  # nothing on port 9
            got = await client.call_tool("get_proxies", {"min_uptme": 90, "limit": 5})
            text = " ".join(getattr(c, "text", "") for c in got.content)
            assert got.is_error and "get_proxies takes no min_uptme (it takes " in text, text
            for limit in (0, -1, 1_001):  # refused before any gateway is asked
                got = await client.call_tool("get_proxies", {"limit": limit})
                text = " ".join(getattr(c, "text", "") for c in got.content)
                assert got.is_error and f"limit: 1 to 1000, not {limit}" in text, text
            got = await client.call_tool("check_proxies", {"addresses": ["10.0.0.1:3128"]})
            assert got.is_error and "not public" in " ".join(
                getattr(c, "text", "") for c in got.content
            )
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_mcp_without_a_gateway_says_what_to_set() -> None:
    """No PPF_GATEWAY or PPF_TOKEN: exit 2, naming them, before any transport starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PPF_GATEWAY", "PPF_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "mcp"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert b"PPF_GATEWAY" in done.stderr and b"PPF_TOKEN" in done.stderr


def test_the_mcp_extra_declares_what_its_readable_text_imports() -> None:
    """trafilatura's cleaning imports lxml.html.clean, which lxml moved out into
    lxml_html_clean: an install whose pip did not bring it along raised ImportError at
    fetch_url's default. The extra names it, and it imports."""
    import importlib
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    extra = " ".join(project["project"]["optional-dependencies"]["mcp"])
    assert "lxml_html_clean" in extra and "trafilatura" in extra
    importlib.import_module("lxml.html.clean")
