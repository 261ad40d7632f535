"""Sites in the world in a box that turn most of the pool away, each in its own way.

A scraper's next wall after dead proxies is the site: large sites turn free proxies'
exits away, each as it likes. Here three sites do, on names reserved for documentation
(RFC 2606; the box's ``/etc/hosts`` maps them, so only its proxies resolve them), over
plain HTTP on port 80 and HTTPS on 443:

- ``example.com`` closes the connection of a listed exit at once (before any byte, and
  before TLS's: what a firewall of listed networks does);
- ``example.net`` answers a listed exit 403 with a block page;
- ``example.org`` redirects a listed exit to its captcha page (``/captcha``, 200).

Each lists the exits of some of the box's proxies (``SITES``): most of the pool is
turned away by each site, and each proxy gets through to at least one and is turned away
by at least one. The real page names its site, its path and the exit it was asked from,
so a client can tell the real page from a block, and an exit from a direct visit.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httptools

__all__ = ["LEAVES", "SITES", "BoxSite", "real_page_of", "serve_site"]

REAL = "the real page of"  # what only a site's own page says


@dataclass(frozen=True, slots=True)
class BoxSite:
    name: str  # its host and its site key
    addr: str  # where the box's /etc/hosts puts it
    way: str  # how it turns a listed exit away: "closed", "403" or "captcha"
    blocks: frozenset[str]  # the box's proxies (ops/lab/world.py PROXY_NAMES) it lists

    def turns_away(self, proxy: str) -> bool:
        """The box's truth: whether this site turns away the exit of proxy ``proxy``."""
        return proxy in self.blocks


SITES = (
    BoxSite("example.com", "45.68.10.1", "closed",
            frozenset({"squid", "tinyproxy-via", "tinyproxy-elite", "mitm-tls"})),
    BoxSite("example.net", "45.68.10.2", "403",
            frozenset({"tinyproxy-elite", "microsocks", "dante", "mitm-body"})),
    BoxSite("example.org", "45.68.10.3", "captcha",
            frozenset({"squid", "tinyproxy-via", "microsocks", "dante", "mitm-tls"})),
)  # fmt: skip


def real_page_of(site: str, body: bytes) -> str:
    """The exit a real page of ``site`` was asked from, or "" when ``body`` is none."""
    marker = f"{REAL} {site} ".encode()
    at = body.find(marker)
    if at < 0:
        return ""
    rest = body[at:].split(b"seen from ", 1)
    return rest[1].split(b"<", 1)[0].decode() if len(rest) == 2 else ""


def _answer(status: int, reason: str, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def _page(site: BoxSite, path: str, peer: str) -> bytes:
    filler = "<p>" + "Lorem ipsum dolor sit amet. " * 100 + "</p>"
    body = f"<html><title>{site.name}</title><h1>{REAL} {site.name} {path}, seen from {peer}</h1>"
    return _answer(200, "OK", (body + filler + "</html>").encode())


# Pages that send their reader off the public internet: what a fetch through the pool
# must refuse to follow (ppf mcp's fetch_url).
LEAVES = {
    "/leave/loopback": "http://127.0.0.1/",
    "/leave/private": "http://10.20.30.40/",
    "/leave/link-local": "http://169.254.169.254/latest/meta-data/",
    "/leave/internal": "http://db.internal/",
}


def _respond(site: BoxSite, path: str, peer: str, turned: bool) -> bytes:
    if not turned and path in LEAVES:
        return _answer(302, "Found", b"", f"Location: {LEAVES[path]}\r\n")
    if site.way == "captcha" and path.startswith("/captcha"):
        body = b"<html><title>One more step</title><form>Are you a robot? captcha</form></html>"
        return _answer(200, "OK", body)
    if not turned:
        return _page(site, path, peer)
    if site.way == "403":
        body = b"<html><title>Access denied</title>Your network is not allowed here.</html>"
        return _answer(403, "Forbidden", body)
    return _answer(302, "Found", b"", f"Location: /captcha?return={path}\r\n")


class _Request:
    """One request's target and its end, as httptools reads it."""

    def __init__(self) -> None:
        self.url, self.done, self.parser = b"", False, httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        self.done = True


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def serve_site(
    site: BoxSite, turned_away: frozenset[str], tls: ssl.SSLContext | None, asks: Path
) -> Handler:
    """A connection handler for ``site``: ``turned_away`` are the exit addresses it lists;
    ``tls`` its certificate (port 443) or None (port 80). Each ask of its root (what a
    probe asks; a consumer here asks pages) is a line of ``asks``, its site's name."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername")[0])
        turned = peer in turned_away
        try:
            if turned and site.way == "closed":
                return  # closed before a byte of any answer (and of TLS's)
            if tls is not None:
                await writer.start_tls(tls)
            while True:
                request = _Request()
                while not request.done:
                    data = await reader.read(65536)
                    if not data:
                        return
                    request.parser.feed_data(data)
                path = httptools.parse_url(request.url).path.decode() if request.url else "/"
                if path == "/":
                    with asks.open("a") as out:
                        out.write(site.name + "\n")
                writer.write(_respond(site, path, peer, turned))
                await writer.drain()
                if not request.parser.should_keep_alive():
                    return
        except (ConnectionError, OSError, ssl.SSLError, httptools.HttpParserError):
            return
        finally:
            writer.close()

    return handle
