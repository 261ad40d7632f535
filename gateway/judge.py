"""ppf's own judge: echoes the caller to ppf's checks, and to nobody else.

An echo service open to all is a gift to strangers (it tells anyone what a proxy
reveals, and repeats any header they inject), so every listener ppf opens for
``/judge`` (the API's, ``--judge-listen``'s, the TLS judge's) answers only nonces
that ppf's own checks minted. A nonce is ``<agent>.<expires>.<random>.<tag>``
(``events.wire.judge_nonce``): the tag is an HMAC under that agent's judge key
(``JudgeKeys.agent_key``, handed over with ``GET /v1/agents/me``) over the judge it is
for (the ``host:port`` it was sent to, which the judge reads from ``Host``), its
expiry and its random part. The judge refuses (403, nothing echoed) a nonce that is
absent, malformed, for another judge, expired or dated too far ahead, used once
already (``JudgeDoor`` remembers nonces until they expire, so the set is bounded by
their lifetime), or minted for a name that is not an enrolled agent now. The
operator's own commands mint as ``OPERATOR`` with the data dir's key. Its answer
carries ``sig``, an HMAC under the same key over the nonce and everything it echoed:
the agent checks it, so a proxy that rewrites the page is caught
(``agents/judges.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import ssl
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog
from aiohttp import web

from events.wire import (
    NONCE_GRACE_S,
    NONCE_LIFETIME_S,
    OPERATOR,
    judge_sign,
    nonce_parts,
    nonce_tag_ok,
)
from gateway.bounds import JUDGE_BYTES_BURST, JUDGE_BYTES_PER_HOUR, RateLimiter, Refusals

__all__ = [
    "JUDGE_DOOR",
    "MAX_SPEED_BYTES",
    "JudgeDoor",
    "JudgeKeys",
    "addressed",
    "echo",
    "enrolled_in",
    "judge",
    "judge_bytes",
]

_json = msgspec.json.Encoder()
log = structlog.get_logger("ppf.judge")


class JudgeKeys:
    """The judge's secret, made once per data dir (mode 0600), and the per-agent keys
    derived from it (so a restart keeps agents' keys valid)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    @classmethod
    def load(cls, path: Path) -> JudgeKeys:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        return cls(path.read_bytes())

    def agent_key(self, agent: str) -> bytes:
        return hmac.new(self.secret, f"judge:{agent}".encode(), hashlib.sha256).digest()

    def operator(self) -> tuple[str, bytes]:
        """The signer the operator's own commands check with."""
        return OPERATOR, self.agent_key(OPERATOR)


class JudgeDoor:
    """Which nonces a judge answers: its keys, who is enrolled now (``enrolled``: the
    gateway's projection; None: the operator alone, for a judge without one), and the
    nonces used, each until it expires."""

    def __init__(
        self,
        keys: JudgeKeys,
        enrolled: Callable[[str], object] | None = None,
        *,
        max_remembered: int = 1_000_000,
        share: float = 0.1,
        bytes_per_hour: float = JUDGE_BYTES_PER_HOUR,
        bytes_burst: float = JUDGE_BYTES_BURST,
    ) -> None:
        self.keys = keys
        # An agent's role now ("" or False: not enrolled), from the gateway's projection.
        self.enrolled = enrolled
        self.refusals = Refusals()
        # Bytes ``judge_bytes`` sends each agent (gateway/bounds.py): a bucket each.
        self.bytes_per_hour = bytes_per_hour
        self._sent = RateLimiter(bytes_per_hour / 3_600, bytes_burst)
        self.max_remembered = max_remembered
        # One agent's nonces in use, at most: one agent filling the memory would have
        # every other agent's checks refused.
        self.max_per_agent = max(1, int(max_remembered * share))
        self._used: set[str] = set()
        self._by_agent: dict[str, int] = {}
        self._expiring: deque[tuple[int, str, str]] = deque()
        self.refused = 0
        self.answered = 0

    def admit(self, nonce: str, judge: str, now_s: float) -> tuple[bytes, str]:
        """(the minting agent's key, "") when ``nonce`` may be answered by the judge at
        ``judge`` now, else (b"", why); an admitted nonce is spent."""
        parts = nonce_parts(nonce)
        if parts is None:
            return b"", "not a ppf check's nonce"
        agent, expires_s, _, _ = parts
        if not (now_s - NONCE_GRACE_S <= expires_s <= now_s + NONCE_LIFETIME_S + NONCE_GRACE_S):
            return b"", "expired, or dated past its lifetime"
        if agent != OPERATOR and (self.enrolled is None or not self.enrolled(agent)):
            return b"", "not minted for an enrolled agent"
        key = self.keys.agent_key(agent)
        if not nonce_tag_ok(key, judge, parts):
            return b"", "not minted for this judge by that agent"
        self._forget(now_s)
        if nonce in self._used:
            return b"", "used already"
        if len(self._used) >= self.max_remembered:
            return b"", "too many checks in flight; try again"
        held = self._by_agent.get(agent, 0)
        if held >= self.max_per_agent:
            return b"", f"{agent} has {held} checks in flight, its share; try again"
        self._used.add(nonce)
        self._by_agent[agent] = held + 1
        self._expiring.append((expires_s + NONCE_GRACE_S, nonce, agent))
        return key, ""

    def send(self, agent: str, size: int) -> tuple[str, float]:
        """Take ``size`` bytes of ``agent``'s hour for a download: ("", 0) when they may
        go, else (why not, seconds until they may; 0 never). Consumers get none, an
        agent its bucket; the operator's own commands are not bounded."""
        if agent == OPERATOR:
            return "", 0.0
        if self.enrolled is not None and self.enrolled(agent) == "consumer":
            return "consumers download nothing from the judge", 0.0
        wait = self._sent.take(agent, size)
        if wait:
            hour = self.bytes_per_hour / 2**20
            return f"{agent} took its {hour:.0f} MiB of the judge's bytes this hour", wait
        return "", 0.0

    def _forget(self, now_s: float) -> None:
        """Nonces past use (expiry plus grace) need not be remembered: the expiry check
        refuses them. Expiries come nearly in order; one out of order waits a little."""
        expiring, by_agent = self._expiring, self._by_agent
        while expiring and expiring[0][0] < now_s:
            _, nonce, agent = expiring.popleft()
            self._used.discard(nonce)
            if by_agent[agent] > 1:
                by_agent[agent] -= 1
            else:
                del by_agent[agent]


JUDGE_DOOR = web.AppKey("judge_door", JudgeDoor)


def enrolled_in(state_of: Callable[[], object]) -> Callable[[str], str]:
    """``JudgeDoor.enrolled`` from a projection (``state_of`` returns its live state):
    the role of an agent with a token now, "" for any other name."""

    def enrolled(name: str) -> str:
        agent = state_of().agents.get(name)  # type: ignore[attr-defined]
        return str(agent.role) if agent is not None and agent.token_sha256 else ""

    return enrolled


def echo(request: web.Request) -> dict[str, object]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return {
        "remote": request.remote,
        "peer": list(peer[:2]) if peer else None,
        "method": request.method,
        "path": request.path_qs,
        "headers": [[str(k), v] for k, v in request.headers.items()],
    }


def addressed(request: web.Request) -> str:
    """The judge as the caller addressed it: ``host:port`` from ``Host`` (the port its
    scheme implies when none is given), which is what a nonce was minted for."""
    host = request.host.lower()
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and not name.endswith("["):
        return f"{name.strip('[]')}:{port}"
    return f"{host.strip('[]')}:{443 if request.scheme == 'https' else 80}"


def _admitted(request: web.Request) -> tuple[JudgeDoor | None, bytes, web.Response | None]:
    """(the door, the minting agent's key, None) when the request's nonce may be
    answered here (``JudgeDoor.admit``: it is spent), else a 403 saying why (counted in
    the door's ``refused``)."""
    door = request.app.get(JUDGE_DOOR)
    if door is None:
        key, why = b"", "this listener has no judge key"
    else:
        key, why = door.admit(request.query.get("n", ""), addressed(request), time.time())
    if not why:
        return door, key, None
    if door is not None:
        door.refused += 1
    log.debug("judge_refused", peer=request.remote, path=request.path, why=why)
    return door, b"", web.json_response({"error": f"not a ppf check: {why}"}, status=403)


async def judge(request: web.Request) -> web.Response:
    """Echo the caller's address and every header, signed, to a nonce this judge may
    answer (``JudgeDoor``); 403 and nothing echoed to anything else."""
    door, key, refused = _admitted(request)
    if refused is not None:
        return refused
    assert door is not None
    door.answered += 1
    body = echo(request)
    nonce = request.query["n"]
    headers = body["headers"]
    assert isinstance(headers, list)
    body["sig"] = judge_sign(key, nonce, str(body["remote"]), request.path_qs, headers)
    return web.Response(body=_json.encode(body), content_type="application/json")


MAX_SPEED_BYTES = 1 << 20  # the most one download of ``judge_bytes`` sends
_FILLER = os.urandom(64 * 1024)  # incompressible: what a proxy carries is what is sent


async def judge_bytes(request: web.Request) -> web.StreamResponse:
    """``GET /judge/bytes?n=<nonce>&size=N``: N bytes (at most ``MAX_SPEED_BYTES``) for a
    check's download through a proxy (agents/speed.py), to a nonce this judge may
    answer, as ``judge``: a bandwidth sink for ppf's agents only, each nonce once."""
    raw = request.query.get("size", "")
    if not raw.isdigit() or not 0 < int(raw) <= MAX_SPEED_BYTES:
        why = f"size: 1-{MAX_SPEED_BYTES} bytes, not {raw!r}"
        return web.json_response({"error": why}, status=400)
    door, _, refused = _admitted(request)
    if refused is not None:
        return refused
    assert door is not None
    size = int(raw)
    agent = request.query["n"].split(".", 1)[0]  # admitted: a well-formed nonce
    why, wait_s = door.send(agent, size)
    if why:
        door.refusals.refused("judge_bytes", agent, why, size=size)
        if not wait_s:
            return web.json_response({"error": why}, status=403)
        retry = {"Retry-After": str(max(1, round(wait_s)))}
        return web.json_response({"error": why}, status=429, headers=retry)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = size
    await response.prepare(request)
    for start in range(0, size, len(_FILLER)):
        await response.write(_FILLER[: min(len(_FILLER), size - start)])
    await response.write_eof()
    return response


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate and key for ``name`` (openssl, in every Debian), made once."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    if not cert.exists():
        # Ten years: agents pin the certificate and never look at its dates.
        cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650"]
        cmd += ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"]
        subprocess.run(
            [*cmd, "-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        key.chmod(0o600)
    return cert, key


def judge_context(directory: Path) -> ssl.SSLContext | None:
    """A server context for the judge, or None where openssl is not installed."""
    if shutil.which("openssl") is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*self_signed(directory, "judge"))
    return ctx
