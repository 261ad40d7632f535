"""Sites in the world in a box that turn most of the pool away, each in its own way.

A scraper's next wall after dead proxies is the site: large sites turn free proxies'
exits away, each as it likes, and many do it with an answer that does not look like a
refusal. Here seven sites do, on names reserved for documentation (RFC 2606) and four
more made from them (``.example`` itself is no public name, and ppf refuses it); the
box's ``/etc/hosts`` maps them, so only its proxies resolve them. Each answers plain
HTTP on port 80 and HTTPS on 443:

- ``example.com`` closes the connection of a listed exit at once (before any byte, and
  before TLS's: what a firewall of listed networks does);
- ``example.net`` answers a listed exit 403 with a block page;
- ``example.org`` redirects a listed exit to its captcha page (``/captcha``, 200);
- ``example-captcha.com`` answers a listed exit 200 with a short captcha page that no rule
  and no vendor's sign names: only the other exits' answers tell it from the page;
- ``example-paced.com`` answers a listed exit 403, and any other 429 (``Retry-After: 60``)
  past ``PER_MINUTE`` requests in the last minute: it tolerates a pace, not a crowd;
- ``example-welcome.com`` redirects a listed exit (302) to ``/welcome``, a path without a
  block word, whose short page asks the visitor to go on;
- ``example-alert.com`` fails a listed exit's TLS handshake with an alert, and resets its
  plain-HTTP connection once the request came.

Each lists the exits of some of the box's proxies (``SITES``): most of the pool is
turned away by each site. The real page names its site, its path and the exit it was
asked from, so a client can tell the real page from a block, and an exit from a direct
visit. Proxies of the box with exits of their own (``OWN_EXITS``: the grown box of
``ppf bench sites``) are listed by a rule of their number (``_listed``).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httptools

__all__ = [
    "LEAVES",
    "OTHERS",
    "OTHERS_AT",
    "OWN_EXITS",
    "PER_MINUTE",
    "SITES",
    "BoxSite",
    "Pace",
    "alerting_tls",
    "other_site",
    "real_page_of",
    "serve_site",
]

REAL = "the real page of"  # what only a site's own page says
# The box's proxies with exits of their own, beside its seven (ops/lab/world.py).
OWN_EXITS = tuple(f"exit-{i:02d}" for i in range(1, 26))
PER_MINUTE = 10  # what example-paced.com lets one exit ask in a minute


OTHERS_AT = "45.68.10.9"  # where the sites that let everyone in live


def other_site(i: int) -> str:
    """The name of the ``i``-th site that lets every exit in (``World.other_sites``)."""
    return f"other-{i:04d}.com"


def _listed(order: int, share: float) -> frozenset[str]:
    """The own-exit proxies the site of ``order`` lists: ``share`` of them, a different
    few for each site (a rule of the proxy's number, so every run lists the same)."""
    count = len(OWN_EXITS)
    return frozenset(
        name for i, name in enumerate(OWN_EXITS) if (i * 7 + order * 11) % count < share * count
    )


@dataclass(frozen=True, slots=True)
class BoxSite:
    name: str  # its host and its site key
    addr: str  # where the box's /etc/hosts puts it
    # How it turns a listed exit away: "closed", "403", "captcha" (a redirect to it),
    # "captcha-200", "paced" (403, and 429 past a pace), "interstitial" or "alert".
    way: str
    blocks: frozenset[str]  # the box's proxies (ops/lab/world.py) it lists

    def turns_away(self, proxy: str) -> bool:
        """The box's truth: whether this site turns away the exit of proxy ``proxy``."""
        return proxy in self.blocks


SITES = (
    BoxSite("example.com", "45.68.10.1", "closed",
            frozenset({"squid", "tinyproxy-via", "tinyproxy-elite", "mitm-tls"}) | _listed(0, 0.6)),
    BoxSite("example.net", "45.68.10.2", "403",
            frozenset({"tinyproxy-elite", "microsocks", "dante", "mitm-body"}) | _listed(1, 0.6)),
    BoxSite("example.org", "45.68.10.3", "captcha",
            frozenset({"squid", "tinyproxy-via", "microsocks", "dante", "mitm-tls"})
            | _listed(2, 0.6)),
    BoxSite("example-captcha.com", "45.68.10.4", "captcha-200",
            frozenset({"squid", "tinyproxy-elite", "dante"}) | _listed(3, 0.6)),
    BoxSite("example-paced.com", "45.68.10.5", "paced",
            frozenset({"tinyproxy-via", "microsocks"}) | _listed(4, 0.4)),
    BoxSite("example-welcome.com", "45.68.10.6", "interstitial",
            frozenset({"squid", "microsocks", "dante", "mitm-body"}) | _listed(5, 0.6)),
    BoxSite("example-alert.com", "45.68.10.7", "alert",
            frozenset({"tinyproxy-via", "tinyproxy-elite", "dante", "mitm-tls"})
            | _listed(6, 0.6)),
)  # fmt: skip
# The one server of every other site: it lists no exit, so its `way` is never taken.
OTHERS = BoxSite("other sites", OTHERS_AT, "403", frozenset())


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


_CAPTCHA = b"<html><title>One more step</title><form>Are you a robot? captcha</form></html>"
# A page that asks the visitor on, in no words of a block (example-welcome.com's /welcome).
_WELCOME = b"<html><title>Welcome</title><p>Please go on to the site.</p><a href=/>On</a></html>"


def _respond(site: BoxSite, path: str, peer: str, turned: bool, over_pace: bool) -> bytes:
    if not turned and path in LEAVES:
        return _answer(302, "Found", b"", f"Location: {LEAVES[path]}\r\n")
    if site.way == "captcha" and path.startswith("/captcha"):
        return _answer(200, "OK", _CAPTCHA)
    if site.way == "interstitial" and path.startswith("/welcome"):
        return _answer(200, "OK", _WELCOME)
    if site.way == "paced" and not turned and over_pace:
        # Each block names the address it turned away, as many real ones do (a test's
        # failure then says which exit got it).
        body = f"<html><title>Too many requests</title>Slow down, {peer}.</html>".encode()
        return _answer(429, "Too Many Requests", body, "Retry-After: 60\r\n")
    if not turned:
        return _page(site, path, peer)
    if site.way in ("403", "paced"):
        body = f"<html><title>Access denied</title>{peer} is not allowed here.</html>".encode()
        return _answer(403, "Forbidden", body)
    if site.way == "captcha-200":
        return _answer(200, "OK", _CAPTCHA)
    if site.way == "interstitial":
        return _answer(302, "Found", b"", f"Location: /welcome?next={path}\r\n")
    return _answer(302, "Found", b"", f"Location: /captcha?return={path}\r\n")


class _Request:
    """One request's target and its end, as httptools reads it."""

    def __init__(self) -> None:
        self.url, self.done, self.parser = b"", False, httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        self.done = True


class Pace:
    """What example-paced.com counts: each exit's requests in the last minute, both ports."""

    def __init__(self) -> None:
        self.asked: dict[str, deque[float]] = {}

    def over(self, peer: str) -> bool:
        """One more request from ``peer``: whether it is past ``PER_MINUTE``."""
        now = time.monotonic()
        asked = self.asked.setdefault(peer, deque())
        while asked and asked[0] <= now - 60:
            asked.popleft()
        asked.append(now)
        return len(asked) > PER_MINUTE


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def alerting_tls() -> ssl.SSLContext:
    """A server context whose every handshake fails with an alert (no certificate
    needed: it fails on the ClientHello, SNI or none)."""
    refusing = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    refusing.sni_callback = lambda *_: ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
    return refusing


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), not a polite end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def serve_site(
    site: BoxSite,
    turned_away: frozenset[str],
    tls: ssl.SSLContext | None,
    asks: Path,
    pace: Pace | None = None,
    alerting: ssl.SSLContext | None = None,
) -> Handler:
    """A connection handler for ``site``: ``turned_away`` are the exit addresses it lists;
    ``tls`` its certificate (port 443) or None (port 80); ``pace`` what it counts of each
    exit (example-paced.com, both ports); ``alerting`` the context that fails a listed exit's
    handshake (example-alert.com). Each ask of its root (what a probe asks; a consumer here
    asks pages) is a line of ``asks``, its site's name."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername")[0])
        turned = peer in turned_away
        try:
            if turned and site.way == "closed":
                return  # closed before a byte of any answer (and of TLS's)
            if tls is not None:
                await writer.start_tls(alerting if turned and alerting is not None else tls)
            while True:
                request = _Request()
                while not request.done:
                    data = await reader.read(65536)
                    if not data:
                        return
                    request.parser.feed_data(data)
                if turned and site.way == "alert":
                    _reset(writer)  # plain HTTP: the request came, a reset answers it
                    return
                path = httptools.parse_url(request.url).path.decode() if request.url else "/"
                if path == "/":
                    with asks.open("a") as out:
                        out.write(site.name + "\n")
                over_pace = pace is not None and not turned and pace.over(peer)
                writer.write(_respond(site, path, peer, turned, over_pace))
                await writer.drain()
                # Read once the request has ended, llhttp's keep-alive is an HTTP/1.1
                # request's whatever its ``Connection: close`` said: these sites keep such
                # connections open, as some servers do, and a proxy that relays one on
                # (tinyproxy, after an empty answer) meets what it does in the world.
                if not request.parser.should_keep_alive():
                    return
        except (ConnectionError, OSError, ssl.SSLError, httptools.HttpParserError):
            return
        finally:
            writer.close()

    return handle
