"""Testing a proxy: does it carry a request to the judge, how fast, and what does it reveal.

One check opens a connection through the proxy (HTTP forwarding, HTTP CONNECT, SOCKS4,
SOCKS5 via python-socks) and sends a ``GET`` for the judge with a nonce; the judge
echoes the address it saw and every header, in its own format (``agents/judges.py``:
ppf's, httpbin's, azenv's). An answer without the nonce is not the judge's (a portal, an
error page): the proxy is not working. From the echo:

- ``exit_ip``: the address the judge saw;
- ``anonymity``: ``transparent`` when our own address appears in the headers,
  ``anonymous`` when proxy headers (Via, X-Forwarded-For, ...) appear without it,
  ``elite`` when neither;
- ``mitm``: the judge's echo came back inside another page than the judge's own (its
  frame differs from the direct answer's: a script appended), or, through a tunnel
  (CONNECT, SOCKS) to a TLS judge, the certificate that came back is not the one the
  judge showed us directly (pinned at discovery).

With a TLS judge, tunnels carry TLS to it (where an interceptor has to show its own
certificate); HTTP forwarding proxies are checked in plain HTTP, as they are used. Every
check is bounded by one timeout: a tarpit costs that and a failed result, never a hang.
python-socks and a hand-written request beat an aiohttp session a check by 30-60 %.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from agents.https import tunnels_https
from agents.judges import Echo, read_echo
from agents.speed import SPEED_BYTES, SpeedBudget, speed
from agents.tunnel import CONNECT_SHARE, TUNNELS, Stream, Tls, connect
from events.wire import NONCE_LIFETIME_S, judge_nonce

__all__ = [
    "Check",
    "Judge",
    "Judges",
    "Target",
    "TlsJudge",
    "check",
    "check_many",
    "judge_answers",
]

PROXY_HEADERS = (
    "via",
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "client-ip",
    "x-client-ip",
    "x-proxy-id",
    "proxy-connection",
)
# HTTP first: a SOCKS server hangs up on "GET" at once, while an HTTP proxy sent a SOCKS
# greeting waits for the rest of a request line until the timeout. CONNECT next, for
# proxies that tunnel but refuse to forward.
AUTO = ("http", "https", "socks5", "socks4")
MAX_RESPONSE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Check:
    addr: str
    ok: bool
    proto: str | None
    anonymity: str = ""
    exit_ip: str = ""
    latency_ms: int = 0
    mitm: bool = False
    error: str = ""
    judge: str = ""  # the judge's URL
    void: bool = False  # the judge failed, not the proxy: never counted against it
    https: str = ""  # tunnelled to a real HTTPS target: yes, no, "" (not tried)
    speed_kb_s: int = 0  # a bounded download from the judge through it (0: not measured)


@dataclass(frozen=True, slots=True)
class TlsJudge:
    """The judge over TLS, and the SHA-256 of the certificate it showed us directly."""

    host: str
    port: int
    path: str
    pin: str


@dataclass(frozen=True, slots=True)
class Judge:
    """Where checks are sent, and how the judge sees us without a proxy."""

    host: str
    port: int
    path: str
    own_ip: str
    tls: TlsJudge | None = None
    format: str = "ppf"  # as its direct answer showed (agents/judges.py)
    frame: str = ""  # what its direct answer holds besides the echo
    # (agent, key) for ppf's public judge: nonces it accepts, answers it signs.
    signer: tuple[str, bytes] | None = None

    def nonce(self) -> str:
        """A fresh nonce for one request; with our key, minted for this judge (judge.py)."""
        random_part = os.urandom(8).hex()
        if self.signer is None:
            return random_part
        (agent, key), at = self.signer, f"{self.host}:{self.port}"
        return judge_nonce(agent, key, at, int(time.time()) + NONCE_LIFETIME_S, random_part)

    @property
    def url(self) -> str:
        port = "" if self.port == 80 else f":{self.port}"
        return f"http://{self.host}{port}{self.path}"

    @classmethod
    async def discover(
        cls,
        url: str,
        timeout: float = 10.0,
        *,
        tls_url: str | None = None,
        signer: tuple[str, bytes] | None = None,
    ) -> Judge:
        """Ask the judge (and its TLS twin) directly who we are and what it looks like."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"judge must be an http:// URL: {url!r}")
        judge = cls(parts.hostname, parts.port or 80, parts.path or "/", "", signer=signer)
        async with asyncio.timeout(timeout):  # not wait_for: see agents/tunnel.py connect
            reader, writer = await asyncio.open_connection(judge.host, judge.port)
        try:
            nonce = judge.nonce()
            async with asyncio.timeout(timeout):
                echo = await _request(reader, writer, judge, nonce, True)
        finally:
            writer.close()
        if echo is None:
            raise ValueError(f"{url} is not a judge: its answer does not echo the query")
        if echo.forged:
            raise ValueError(f"{url}: its answer is not signed with our key")
        tls = await _discover_tls(tls_url, timeout, signer) if tls_url else None
        return cls(
            judge.host, judge.port, judge.path, echo.remote, tls, echo.format, echo.frame, signer
        )


async def judge_answers(judge: Judge, timeout: float = 5.0) -> bool:
    """Whether the judge answers us directly (a failed check means a dead proxy only then)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(judge.host, judge.port)
            return await _request(reader, writer, judge, judge.nonce(), True) is not None
    except (OSError, TimeoutError, ConnectionError, ValueError):
        return False
    finally:
        if writer is not None:
            writer.close()


async def _discover_tls(
    url: str, timeout: float, signer: tuple[str, bytes] | None = None
) -> TlsJudge:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"TLS judge must be an https:// URL: {url!r}")
    host, port, path = parts.hostname, parts.port or 443, parts.path or "/judge"
    async with asyncio.timeout(timeout):  # not wait_for: see agents/tunnel.py connect
        reader, writer = await asyncio.open_connection(host, port)
    try:
        tls = Tls(reader, writer, host)
        async with asyncio.timeout(timeout):
            pin = await tls.handshake()
        plain = Judge(host, port, path, "", signer=signer)
        nonce = plain.nonce()
        async with asyncio.timeout(timeout):
            echo = await _request(tls, tls, plain, nonce, True)
    finally:
        writer.close()
    if echo is None or not pin:
        raise ValueError(f"{url} is not a ppf judge over TLS")
    return TlsJudge(host, port, path, pin)


async def _request(
    reader: Stream | asyncio.StreamReader,
    writer: Stream | asyncio.StreamWriter,
    judge: Judge,
    nonce: str,
    origin_form: bool,
) -> Echo | None:
    """GET the judge; its echo, or None when the answer is not the judge's."""
    target = f"{judge.path}?n={nonce}"
    if not origin_form:  # an HTTP forwarding proxy wants the absolute URI
        target = f"http://{judge.host}:{judge.port}{target}"
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: {judge.host}:{judge.port}\r\n"
        "Accept: application/json\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    raw = await reader.read(MAX_RESPONSE)
    while raw and len(raw) < MAX_RESPONSE:
        more = await reader.read(MAX_RESPONSE - len(raw))
        if not more:
            break
        raw += more
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or status[1] != b"200":
        raise ConnectionError(f"proxy answered {head[:60]!r}")
    return read_echo(body, nonce, judge.signer[1] if judge.signer else b"")


def _classify(echo: Echo, own_ip: str) -> str:
    seen = {k.lower(): v for k, v in echo.headers}
    revealing = [v for k, v in seen.items() if k in PROXY_HEADERS]
    if own_ip and any(own_ip in v for v in revealing):
        return "transparent"
    return "anonymous" if revealing else "elite"


Step = tuple[str, str, str]  # (what, passed/failed/unavailable/skipped, why): --explain


def _note(trace: list[Step] | None, what: str, outcome: str, why: str) -> None:
    if trace is not None:
        trace.append((what, outcome, why))


async def _once(
    ip: str, port: int, proto: str, judge: Judge, timeout: float, trace: list[Step] | None = None
) -> Check:
    addr = f"{proto}://{ip}:{port}"
    started = time.perf_counter()
    writer = None
    tls = judge.tls if proto in TUNNELS else None
    target = (
        Judge(tls.host, tls.port, tls.path, judge.own_ip, signer=judge.signer) if tls else judge
    )
    frame = "" if tls else judge.frame  # the TLS twin is ppf's own judge
    altered_certificate = False
    step = f"{proto}: connect"
    try:
        async with asyncio.timeout(timeout):
            connect_s = CONNECT_SHARE * timeout
            origin_form = proto != "http"
            reader, writer = await connect(ip, port, proto, target.host, target.port, connect_s)
            _note(trace, step, "passed", "connected, and the proxy took the request")
            stream: Stream | None = None
            if tls is not None:
                step = f"{proto}: TLS to the judge"
                stream = Tls(reader, writer, tls.host)
                altered_certificate = await stream.handshake() != tls.pin
                _note(
                    trace,
                    step,
                    "failed" if altered_certificate else "passed",
                    "another certificate than the judge's"
                    if altered_certificate
                    else "the judge's own certificate",
                )
            step = f"{proto}: the judge's answer"
            nonce = target.nonce()
            echo = await _request(stream or reader, stream or writer, target, nonce, origin_form)
    except Exception as exc:  # python-socks raises its own errors for bad replies
        why = f"{type(exc).__name__}: {exc}"[:200]
        _note(trace, step, "failed", why)
        return Check(addr, False, proto, error=why)
    finally:
        if writer is not None:
            writer.close()
    latency = int((time.perf_counter() - started) * 1000)
    if echo is None:  # a portal, an error page: the request never reached the judge
        _note(trace, step, "failed", "an answer, but not the judge's (a portal, an error page)")
        return Check(addr, False, proto, latency_ms=latency, error="not the judge's answer")
    _note(trace, step, "passed", f"{target.url} echoed us in {latency} ms")
    return Check(
        addr,
        True,
        proto,
        anonymity=_classify(echo, judge.own_ip),
        exit_ip=echo.remote,
        latency_ms=latency,
        mitm=altered_certificate or echo.frame != frame or echo.forged,
    )


async def check(
    ip: str,
    port: int,
    proto: str | None,
    judge: Judge,
    timeout: float = 10.0,
    *,
    prefer: str | None = None,
    trace: list[Step] | None = None,
) -> Check:
    """Check one proxy as ``proto``; with none, detect it: HTTP, CONNECT, SOCKS5, SOCKS4,
    ``prefer`` first (a source's hint: usually right, and then one try is enough).
    ``trace`` gets each step with its outcome (``ppf check --explain``)."""
    if proto is not None:
        result = await _once(ip, port, proto, judge, timeout, trace)
        return dataclasses.replace(result, judge=judge.url)
    order = AUTO if prefer not in AUTO else (prefer, *(p for p in AUTO if p != prefer))
    last = Check(f"{ip}:{port}", False, None, error="no protocol answered")
    for candidate in order:
        result = await _once(ip, port, candidate, judge, timeout, trace)
        if result.ok:
            return dataclasses.replace(result, judge=judge.url)
        last = result
        if "Timeout" in last.error:
            break  # a tarpit: one timeout, not one per protocol
    return Check(f"{ip}:{port}", False, None, error=last.error, judge=judge.url)


Target = tuple[str, int, str | None] | tuple[str, int, str | None, str | None]


class Judges(Protocol):
    """A pool of judges (``agents/judgepool.py``): one for each check, and the blame."""

    async def acquire(self, ip: str) -> Judge | None: ...

    async def answers(self, judge: Judge, since: float) -> bool: ...


async def check_many(
    targets: Iterable[Target],
    judge: Judge | Judges,
    *,
    concurrency: int = 500,
    timeout: float = 10.0,
    https: Sequence[str] = (),
    on_result: Callable[[int, Check], None] | None = None,
    timeouts: Sequence[float] = (),
    speed_budget: SpeedBudget | None = None,
) -> list[Check]:
    """Check all, at most ``concurrency`` at once; results in input order. A target is
    (ip, port, proto) or (ip, port, proto, prefer): see ``check``. With a pool, each check
    takes a judge that can see the proxy, and a failure while that judge does not answer
    directly is ``void``. With ``https`` targets, a proxy that works is also tried once
    through a tunnel to one of them (in turn), and the check says ``https`` yes or no.
    ``on_result(index, check)`` hears of each check as it ends (a worker publishes the
    working ones at once instead of at the end of a long batch). ``timeouts``, when
    given, is each target's own timeout, in order (a recheck fits it to the proxy). With
    ``speed_budget``, a proxy that works through ppf's own judge is also timed through a
    download from it while the budget lasts (agents/speed.py)."""
    gate = asyncio.Semaphore(concurrency)
    turn = itertools.count()

    async def one(index: int, target: Target) -> Check:
        own = timeouts[index] if timeouts else timeout
        result = await _one(own, *target)
        if on_result is not None:
            on_result(index, result)
        return result

    async def _one(
        timeout: float, ip: str, port: int, proto: str | None, prefer: str | None = None
    ) -> Check:
        async with gate:
            if isinstance(judge, Judge):
                used = judge
                result = await check(ip, port, proto, judge, timeout, prefer=prefer)
            else:
                chosen = await judge.acquire(ip)
                if chosen is None:
                    error = "no healthy judge can see this address"
                    return Check(f"{ip}:{port}", False, proto, error=error, void=True)
                began = time.monotonic()
                result = await check(ip, port, proto, chosen, timeout, prefer=prefer)
                void = not result.ok and not await judge.answers(chosen, began)
                result = dataclasses.replace(result, judge=chosen.url, void=void)
                used = chosen
            if result.ok and result.proto is not None and https:
                url = https[next(turn) % len(https)]
                carried = await tunnels_https(ip, port, result.proto, url, timeout)
                result = dataclasses.replace(result, https="yes" if carried else "no")
            if (
                result.ok
                and result.proto is not None
                and speed_budget is not None
                and used.signer is not None
                and speed_budget.take(SPEED_BYTES, (ip, port))
            ):
                kb_s = await speed(ip, port, result.proto, used, timeout=2 * timeout)
                result = dataclasses.replace(result, speed_kb_s=kb_s)
            return result

    return await asyncio.gather(*(one(i, t) for i, t in enumerate(targets)))
