"""A headless Chromium driven over the DevTools protocol, with aiohttp's websocket.

No driver package: Debian's chromium and the protocol are enough for loading a page,
reading the DOM, collecting console errors and taking a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from ops.nats.server import free_port

__all__ = ["Browser", "chromium_path"]

FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Browser:
        binary = chromium_path()
        assert binary is not None
        self.proc = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={self.profile}",
            f"--remote-debugging-port={self.port}",
            "about:blank",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.http = aiohttp.ClientSession()
        base = f"http://127.0.0.1:{self.port}"
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.put(f"{base}/json/new?about:blank") as r:
                    target = await r.json(content_type=None)
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("chromium did not open its DevTools port")
        self.ws = await self.http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Runtime", "Log", "Page"):
            await self.call(f"{domain}.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.proc is not None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 10)

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            data = msg.json()
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                self.errors.append(str([a.get("value") for a in params.get("args", [])]))
            elif method == "Runtime.exceptionThrown":
                self.errors.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                self.errors.append(str(params["entry"].get("text")))
            await self._events.put(data)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.ws is not None
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def text(self, selector: str) -> str | None:
        expr = f"(document.querySelector({selector!r}) || {{}}).textContent || null"
        result = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        value = result.get("result", {}).get("value")
        return value if isinstance(value, str) else None

    async def wait_text(self, selector: str, want: str, timeout: float = 20) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        seen = None
        while loop.time() < end:
            seen = await self.text(selector)
            if seen == want:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{selector}: wanted {want!r}, saw {seen!r}")

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def width(self, pixels: int, height: int = 900) -> None:
        """The page laid out as in a window ``pixels`` wide."""
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=pixels, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
