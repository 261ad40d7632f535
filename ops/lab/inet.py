"""The "internet" of the world in a box: run inside its network namespace by ``world.py``.

``python -m ops.lab.inet CONFIG.json`` starts, inside the namespace:

- the real proxies of ``testbed.ProxyLab`` on the namespace's own loopback, each exiting
  from its public-looking address, and in front of each a **delaying relay** on its
  public address (this kernel has no ``tc`` qdiscs: the round trip is added here, half
  each way, with jitter, per chunk in order);
- the dead: addresses that refuse at once (owned, nothing listening), and tarpits that
  accept and never answer (silent ones need nothing: routed here, owned by nobody,
  dropped by the kernel);
- a portal that answers every request with its own 200 page, and a garbage speaker;
- public judges in the formats public echo services use (httpbin JSON, azenv text);
- source pages on public hosts;
- an HTTPS endpoint with a known answer (204), for the proxies' HTTPS capability.

It writes ``ready.json`` (what it serves, as the lab knows it) and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.guard import listen
from ops.lab.churnbox import Churn
from ops.lab.sitebox import OTHERS, SITES, Pace, alerting_tls, serve_site
from ops.lab.testbed import ProxyLab, self_signed

__all__ = ["azenv_text", "httpbin_json", "relay"]


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: float,
    jitter_s: float,
    rate_b_s: float = 0,
) -> None:
    """Copy one way, each chunk delivered ``delay_s`` (+ jitter) after it arrived, in order;
    with ``rate_b_s``, no faster than that many bytes a second (a link of that rate)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    last_due = 0.0
    try:
        while data := await reader.read(65536):
            # Never before the previous chunk: jitter must not reorder a byte stream.
            last_due = max(last_due, time.monotonic() + delay_s + random.uniform(0, jitter_s))
            if rate_b_s:
                last_due += len(data) / rate_b_s  # the chunk's time on the link
            queue.put_nowait((last_due, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((last_due, b""))
    try:
        await sender
    except (ConnectionError, OSError):
        pass


def relay(inner_port: int, rtt_ms: float, *, proxy_header: bool = False, rate_kb_s: int = 0) -> Any:
    """A relay that adds ``rtt_ms``; with ``proxy_header`` it tells the proxy behind it
    who the client really is (PROXY protocol v1), as if there were no relay; with
    ``rate_kb_s``, it carries the answers at that many kilobytes a second at most."""
    half, jitter = rtt_ms / 2000, rtt_ms / 10000

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", inner_port)
        except OSError:
            writer.close()
            return
        if proxy_header:
            client = writer.get_extra_info("peername")
            local = writer.get_extra_info("sockname")
            up_writer.write(
                f"PROXY TCP4 {client[0]} {local[0]} {client[1]} {local[1]}\r\n".encode()
            )
        await asyncio.gather(
            _pipe(reader, up_writer, half, jitter),
            _pipe(up_reader, writer, half, jitter, rate_kb_s * 1000),
            return_exceptions=True,
        )

    return handle


async def _tarpit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)  # accepted, never answered


async def _portal(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A captive portal: every request, proxied or not, gets the same 200 page."""
    try:
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    body = b"<html><body><h1>Welcome to FreeWiFi</h1>Please log in.</body></html>"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    writer.close()


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(os.urandom(512) + b"\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{}")
    await writer.drain()
    writer.close()


def _remote(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return str(peer[0]) if peer else ""


def httpbin_json(request: web.Request) -> dict[str, Any]:
    """What httpbin's ``/get`` answers: the query in ``args``, headers, the caller."""
    return {
        "args": dict(request.query),
        "headers": {k: v for k, v in request.headers.items()},
        "origin": _remote(request),
        "url": str(request.url),
    }


def azenv_text(request: web.Request) -> str:
    """What azenv-style pages answer: one ``NAME = value`` line per CGI variable."""
    lines = [f"REMOTE_ADDR = {_remote(request)}", f"REQUEST_URI = {request.path_qs}"]
    lines.append(f"QUERY_STRING = {request.query_string}")
    for k, v in request.headers.items():
        lines.append(f"HTTP_{k.upper().replace('-', '_')} = {v}")
    return "<pre>\n" + "\n".join(lines) + "\n</pre>\n"


def _judge_app(fmt: str) -> web.Application:
    app = web.Application()
    if fmt == "httpbin":

        async def get(request: web.Request) -> web.Response:
            return web.json_response(httpbin_json(request))

        app.router.add_get("/get", get)
    else:

        async def azenv(request: web.Request) -> web.Response:
            return web.Response(text=azenv_text(request), content_type="text/html")

        app.router.add_get("/azenv.php", azenv)
    return app


def _pages_app(files: dict[str, str]) -> web.Application:
    async def page(request: web.Request) -> web.Response:
        text = files.get(request.path)
        if text is None:
            raise web.HTTPNotFound()
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


async def _site(
    app: web.Application,
    host: str,
    port: int,
    runners: list[web.AppRunner],
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    runners.append(runner)
    await listen(runner, host, port, ssl_context)


def _https_target(root: Path) -> tuple[web.Application, ssl.SSLContext]:
    async def no_content(request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def ip(request: web.Request) -> web.Response:  # who reached it (a proxy's exit)
        return web.Response(text=_remote(request))

    app = web.Application()
    app.router.add_get("/generate_204", no_content)
    app.router.add_get("/ip", ip)
    return app, _tls(root, "target")


def _tls(root: Path, name: str) -> ssl.SSLContext:
    cert, key = self_signed(root, name)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


async def serve(config: dict[str, Any]) -> None:
    # Thousands of listening addresses and held connections (a harvest): lift the limit.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = Path(config["root"])
    lab = ProxyLab(root / "proxies", exits=config["exits"], proxy_protocol=True).start()
    servers: list[asyncio.base_events.Server] = []
    runners: list[web.AppRunner] = []
    served = []
    churn: Churn | None = None
    try:
        for proxy in lab.proxies:
            spec = config["proxies"].get(proxy.name)
            if spec is None or proxy.name in ("closed", "tarpit", "garbage"):
                continue
            handle = relay(proxy.port, spec["rtt_ms"], proxy_header=proxy.name == "squid")
            servers.append(await asyncio.start_server(handle, spec["addr"], spec["port"]))
            served.append(
                {
                    "name": proxy.name,
                    "addr": spec["addr"],
                    "port": spec["port"],
                    "proto": proxy.proto,
                    "anonymity": proxy.anonymity,
                    "exit_ip": proxy.exit_ip,
                    "mitm": proxy.mitm,
                    "rtt_ms": spec["rtt_ms"],
                    # Every proxy here tunnels to any port but the page rewriter, which
                    # refuses CONNECT.
                    "https": "no" if proxy.name == "mitm-body" else "yes",
                }
            )
        by_name = {p.name: p for p in lab.proxies}
        for e in config.get("extra", []):
            handle = relay(by_name[e["via"]].port, e["rtt_ms"], proxy_header=e["via"] == "squid")
            servers.append(await asyncio.start_server(handle, e["addr"], e["port"]))
        for own in config.get("own", []):  # proxies with exits of their own
            proxy = lab.more(own["name"], own["server"], own["exit"])
            handle = relay(proxy.port, own["rtt_ms"])
            servers.append(await asyncio.start_server(handle, own["addr"], own["port"]))
        for addr, port in config["tarpits"]:
            servers.append(await asyncio.start_server(_tarpit, addr, port))
        addr, port = config["portal"]
        servers.append(await asyncio.start_server(_portal, addr, port))
        addr, port = config["garbage"]
        servers.append(await asyncio.start_server(_garbage, addr, port))
        for judge in config["judges"]:
            await _site(_judge_app(judge["format"]), judge["addr"], judge["port"], runners)
        pages = config["pages"]
        await _site(_pages_app(pages["files"]), pages["addr"], pages["port"], runners)
        app, ctx = _https_target(root)
        target = config["https_target"]
        await _site(app, target["addr"], target["port"], runners, ctx)
        by_site = {s.name: s for s in SITES}
        for spec in config.get("sites", []):
            site, turned = by_site[spec["name"]], frozenset(spec["turned_away"])
            pace = Pace() if site.way == "paced" else None  # one count for both ports
            alerting = alerting_tls() if site.way == "alert" else None
            for port, tls in ((80, None), (443, _tls(root, site.name))):
                handle = serve_site(site, turned, tls, root / "asks.log", pace, alerting)
                servers.append(await asyncio.start_server(handle, site.addr, port))
        if "others" in config:  # the sites that let every exit in, one server for all
            for port, tls in ((80, None), (443, _tls(root, "others"))):
                handle = serve_site(OTHERS, frozenset(), tls, root / "asks.log")
                servers.append(await asyncio.start_server(handle, config["others"], port))
        t0 = 0.0
        if "churn" in config:  # the churn lab: its proxies, then its clock
            churn = Churn(config["churn"], root, relay, _tarpit)
            t0 = await churn.start()
        ready = {"proxies": served, "pid": os.getpid(), "churn_t0": t0}
        # Whole or not at all: the lab reads it the moment it exists (written in place,
        # it was once read empty).
        (root / "ready.json.part").write_text(json.dumps(ready))
        (root / "ready.json.part").rename(root / "ready.json")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if churn is not None:
            await churn.stop()
        for server in servers:
            server.close()
        for runner in runners:
            await runner.cleanup()
        lab.stop()


if __name__ == "__main__":
    asyncio.run(serve(json.loads(Path(sys.argv[1]).read_text())))
