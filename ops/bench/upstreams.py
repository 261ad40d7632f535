"""Upstream proxies a bench runs on any Linux machine, each in its own process (so its
CPU is not the endpoint's): a SOCKS5 proxy (microsocks where installed, else a small one
of ours) and an HTTP proxy of ours (absolute URIs kept alive to the site, CONNECT).
Neither needs root or a package beyond ppf's own."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ops.bench.options import KINDS
from ops.nats.server import free_port

__all__ = ["KINDS", "Running", "upstream"]


# What both programs share: the import, a pipe, the server on argv[1] around ``handle``.
_HEAD = r"""
import asyncio, sys

async def pipe(src, dst):
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()
"""
_TAIL = r"""
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    print("ready", flush=True)
    await server.serve_forever()

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

# A forwarding HTTP proxy: a client connection's requests (absolute URIs, bodies by
# Content-Length) go to their site on one connection kept for it; answers are relayed
# by their Content-Length. CONNECT opens a tunnel. argv[1]: the port.
_HTTP = r"""


def length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0

async def handle(reader, writer):
    site = None
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, rest = head.split(b" ", 2)
            if method == b"CONNECT":
                host, _, port = target.decode().rpartition(":")
                sr, sw = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(pipe(reader, sw), pipe(sr, writer))
                return
            body = await reader.readexactly(length(head))
            url = target.split(b"://", 1)[1]
            hostport, _, path = url.partition(b"/")
            host, _, port = hostport.decode().partition(":")
            if site is None:
                site = await asyncio.open_connection(host, int(port or 80))
            sr, sw = site
            sw.write(method + b" /" + path + b" " + rest + body)
            answer = await sr.readuntil(b"\r\n\r\n")
            writer.write(answer + await sr.readexactly(length(answer)))
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()
        if site is not None:
            site[1].close()

"""

# A SOCKS5 proxy without authentication, CONNECT only. argv[1]: the port.
_SOCKS5 = r"""
import ipaddress


async def handle(reader, writer):
    try:
        _, n = await reader.readexactly(2)
        await reader.readexactly(n)
        writer.write(b"\x05\x00")
        _, cmd, _, atyp = await reader.readexactly(4)
        if atyp == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif atyp == 4:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        else:
            (n,) = await reader.readexactly(1)
            host = (await reader.readexactly(n)).decode()
        port = int.from_bytes(await reader.readexactly(2), "big")
        sr, sw = await asyncio.open_connection(host, port)
        writer.write(b"\x05\x00\x00\x01" + bytes(6))
        await asyncio.gather(pipe(reader, sw), pipe(sr, writer))
    except (OSError, asyncio.IncompleteReadError, ValueError):
        writer.close()

"""


@dataclass(frozen=True)
class Running:
    kind: str  # http or socks5: how the endpoint speaks to it
    port: int
    program: str  # what runs it: microsocks, or ppf's own

    @property
    def url(self) -> str:
        return f"{self.kind}://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def upstream(kind: str) -> AsyncIterator[Running]:
    """An upstream proxy of ``kind`` on a loopback port, for the block's length."""
    port = free_port()
    microsocks = shutil.which("microsocks") if kind == "socks5" else None
    if microsocks is not None:
        argv, program = [microsocks, "-i", "127.0.0.1", "-p", str(port)], "microsocks"
    else:
        code = _HEAD + (_HTTP if kind == "http" else _SOCKS5) + _TAIL
        argv, program = [sys.executable, "-c", code, str(port)], "ppf's own"
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        await _listening(port, proc)
        yield Running(kind, port, program)
    finally:
        proc.terminate()
        await proc.wait()


async def _listening(port: int, proc: asyncio.subprocess.Process) -> None:
    """Until the port takes a connection (microsocks says nothing when it is ready)."""
    async with asyncio.timeout(30):
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"the upstream on port {port} exited {proc.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return
