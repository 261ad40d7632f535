"""TARGET probes: a site's root asked through a proxy, read as the site's verdict.

The gateway hands probes out with recheck shards (projections/core/probes.py); the
checker asks each site's root through each proxy (HTTPS through a tunnel where the proxy
tunnels, plain HTTP through an HTTP proxy), reads the answer's head and the first
``HEAD_BYTES`` of its page (after its Content-Encoding), and reads it by the site's rule
(events/sites.py; a vendor's block page whatever the rule), or, for a site without one,
against what other proxies got from it lately (``Seen``). What goes to the log is the
site, the verdict, the status class, the latency and the bytes: the URL stays here.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import httptools
import structlog
from python_socks import ProxyError

from agents.gateway_client import GatewayClient
from agents.tunnel import TUNNELS, Stream, Tls, connect
from events.blockpages import SIGN_HEADERS
from events.catalogue import SiteResult
from events.pages import readable
from events.sites import (
    BLOCKED,
    HEAD_BYTES,
    NONE,
    THROUGH,
    Answer,
    SiteRule,
    compared,
    generic,
    read,
    rule_for,
    settled,
    tells,
)

__all__ = ["PROBE_TIMEOUT_S", "Probed", "Prober", "Seen", "probe"]

log = structlog.get_logger("ppf.probe")

PROBE_TIMEOUT_S = 10.0
_SEEN = 32  # answers per site kept to compare a site without rules against
_ALIKE = 4_096  # probes whose page said nothing, kept to be read again (``told``)


@dataclass(frozen=True, slots=True)
class Probed:
    """One probe's answer, how long it took (ms) and the bytes it read."""

    answer: Answer
    latency_ms: int
    bytes: int


class Seen:
    """What the latest probes of each site got (``_SEEN`` answers a site, for at most
    ``sites`` sites, each as comparing reads it: status, redirect, title, size): what a
    site without rules is read against, by its classes."""

    def __init__(self, sites: int = 1_024) -> None:
        self.sites = sites
        self._by: dict[str, deque[Answer]] = {}

    def of(self, site: str) -> list[Answer]:
        return list(self._by.get(site, ()))

    def add(self, site: str, answer: Answer) -> None:
        if answer.status == 0 and not answer.closed:  # no answer: nothing of the site
            return
        kept = self._by.get(site)
        if kept is None:
            if len(self._by) >= self.sites:
                self._by.pop(next(iter(self._by)))  # the site seen first goes first
            kept = self._by[site] = deque(maxlen=_SEEN)
        kept.append(compared(answer))


class _Head:
    """An answer as httptools reads it: status, ``Location``, the first ``HEAD_BYTES``."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.location, self.body, self.size, self.done = "", bytearray(), 0, False
        self.encoding = ""
        self.signs: list[tuple[str, str]] = []  # the headers a block page is told by

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"location":
            self.location = value.decode("latin-1")[:2048]
        elif lower == b"content-encoding":
            self.encoding = value.decode("latin-1")[:64]
        elif lower in SIGN_HEADERS:
            self.signs.append((lower.decode(), value.decode("latin-1")[:256]))

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        room = HEAD_BYTES - len(self.body)
        if room > 0:
            self.body += body[:room]

    def on_message_complete(self) -> None:
        self.done = True


async def probe(
    ip: str, port: int, proto: str, site: str, timeout: float, path: str = "/"
) -> Probed:
    """Ask ``site``'s ``path`` (its root, unless the operator gave its URL) through the
    proxy; never raises (a failure is an answer of status 0: ``closed`` when the way to
    the site was open and ended before any answer, or when the proxy would not tunnel to
    it)."""
    started = time.perf_counter()
    tunnel = proto in TUNNELS
    writer = None
    read = 0
    opened = False
    head = _Head()
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await connect(ip, port, proto, site, 443, timeout)
            except ProxyError as exc:
                refused = exc.error_code is not None and exc.error_code != 407
                return Probed(Answer(closed=refused), _ms(started), 0)
            opened = True
            stream: Stream | asyncio.StreamReader = reader
            out: Stream | asyncio.StreamWriter = writer
            if tunnel:
                tls = Tls(reader, writer, site)
                await tls.handshake()
                stream = out = tls
            target = path if tunnel else f"http://{site}{path}"
            out.write(
                f"GET {target} HTTP/1.1\r\nHost: {site}\r\nUser-Agent: Mozilla/5.0\r\n"
                "Accept: text/html\r\nAccept-Encoding: gzip, deflate, br\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await out.drain()
            while not head.done and head.size < HEAD_BYTES:
                data = await stream.read(65536)
                if not data:
                    break
                read += len(data)
                head.parser.feed_data(data)
    except TimeoutError:
        timed_out = True  # slow is not turned away
    except (OSError, ConnectionError, httptools.HttpParserError, ValueError):
        pass
    finally:
        if writer is not None:
            writer.close()
    try:
        status = head.parser.get_status_code() if read else 0
    except httptools.HttpParserError:
        status = 0  # not an answer's head
    answer = Answer(
        status=status,
        location=head.location,
        head=readable(bytes(head.body), head.encoding),
        size=head.size,
        closed=opened and not read and not timed_out,
        headers=tuple(head.signs),
    )
    return Probed(answer, _ms(started), read)


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


class Prober:
    """A checker's probes: the sites' rules as the gateway has them (``rules``), what
    the latest probes of each site got, and the agent's byte budget an hour (a probe
    past it is not made: counted in ``skipped``)."""

    def __init__(self, bytes_per_hour: int, timeout: float = PROBE_TIMEOUT_S) -> None:
        self.bytes_per_hour, self.timeout = bytes_per_hour, timeout
        self.rules: tuple[SiteRule, ...] = ()
        self.seen = Seen()
        self.skipped = 0
        self._hour, self._spent = -1, 0
        self._said_at = -1  # the hour the spent budget was last said in the log
        self._rules_at = -1e9  # loop time the sites' rules were last asked for
        self._alike: dict[tuple[str, int, str], Probed] = {}  # waiting for ``told``

    async def refresh_rules(self, gateway: GatewayClient, every_s: float) -> None:
        """The sites' rules, asked of ``gateway`` at most every ``every_s``."""
        now = asyncio.get_running_loop().time()
        if now - self._rules_at >= every_s:
            self._rules_at = now
            self.rules = await gateway.site_rules(self.rules)

    def _room(self) -> bool:
        hour = int(time.time() // 3600)
        if hour != self._hour:
            self._hour, self._spent = hour, 0
        return self._spent < self.bytes_per_hour

    async def result(
        self, ip: str, port: int, proto: str, site: str, path: str = "/"
    ) -> SiteResult | None:
        """One probe read as the site's verdict; None when the budget is spent or the
        answer says nothing either way (yet: see ``told``)."""
        if not self._room():
            if self._hour != self._said_at:
                log.warning("probe_budget_spent", bytes=self._spent, skipped=self.skipped + 1)
                self._said_at = self._hour  # once an hour, with the count so far
            self.skipped += 1
            return None
        got = await probe(ip, port, proto, site, self.timeout, path)
        self._spent += got.bytes
        rule, others = rule_for(site, self.rules), self.seen.of(site)
        if rule is not None:
            said = read(rule, got.answer, others)
        else:
            said = _by_classes(got.answer, others)
            if said == NONE and 200 <= got.answer.status < 400:  # a page, not told yet
                if len(self._alike) >= _ALIKE:  # a round cut short left its own: oldest go
                    del self._alike[next(iter(self._alike))]
                # Read again once the round is in, as comparing reads it (its status,
                # redirect, title and size: a few hundred bytes, not its page).
                kept = Probed(compared(got.answer), got.latency_ms, got.bytes)
                self._alike[(ip, port, site)] = kept
        self.seen.add(site, got.answer)
        return _result(ip, port, site, said, got)

    def told(self, asked: Iterable[tuple[str, int, str]]) -> list[SiteResult]:
        """The probes of ``asked`` whose page said nothing (on a site without a rule),
        read again against what the site's probes got since: the first probes of a round
        come before any block to tell their page from, and a probe of the same proxy and
        site is not handed out again for a quarter of an hour, so an answer read too
        early would leave that proxy unknown there for as long."""
        found = []
        for ip, port, site in asked:
            got = self._alike.pop((ip, port, site), None)
            if got is None:
                continue
            others = self.seen.of(site)
            if got.answer in others:
                others.remove(got.answer)  # the answer itself is no other
            if not others:
                continue  # nothing came since to read it by
            if result := _result(ip, port, site, _by_classes(got.answer, others), got):
                found.append(result)
        return found


def _by_classes(answer: Answer, others: list[Answer]) -> str:
    """A site without a rule, read by its classes as the endpoint reads a site that
    splits: a round of probes asks one page through many exits at once, and most may get
    the block alike, so only a page told from a block (or beside a refusal) is through."""
    return settled(generic(answer, others), tells(answer, others), True, others)


def _result(ip: str, port: int, site: str, said: str, got: Probed) -> SiteResult | None:
    """A probe's verdict for the log, when it says one."""
    if said not in (THROUGH, BLOCKED):
        return None
    return SiteResult(
        ip=ip,
        port=port,
        site=site,
        through=int(said == THROUGH),
        blocked=int(said == BLOCKED),
        status=got.answer.status // 100,
        latency_ms=got.latency_ms,
        bytes=got.bytes,
    )
