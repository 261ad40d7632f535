"""ppf's own judge: echoes the caller, and, when the world can reach it, signs.

On the API's loopback listener ``/judge`` answers anyone (a lab's proxies share that
loopback). Published to the world (``ppf up --public-url ... --judge-listen ...``) it
must be no free echo service for strangers, and a proxy must not be able to rewrite
its answer unseen: every agent gets its own key (``JudgeKeys.agent_key``, handed over
with ``GET /v1/agents/me``); a check's nonce is ``<agent>.<random>.<tag>`` with the tag
an HMAC of the random part under that key, the public judge answers only such nonces
(403 otherwise), and its answer carries ``sig``, an HMAC under the same key over the
nonce and everything it echoed. The agent checks it: a changed address or header in an
otherwise intact page is interception (``agents/judges.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import msgspec
from aiohttp import web

from events.wire import judge_nonce_tag, judge_sign

__all__ = ["JUDGE_KEYS", "JudgeKeys", "echo", "judge"]

_json = msgspec.json.Encoder()


class JudgeKeys:
    """The public judge's secret, made once per data dir (mode 0600), and the per-agent
    keys derived from it (so revoking nothing else, a restart keeps agents' keys valid)."""

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

    def key_for(self, nonce: str) -> bytes | None:
        """The asking agent's key when ``nonce`` is one it made, else None."""
        agent, _, rest = nonce.partition(".")
        random_part, _, tag = rest.partition(".")
        if not agent or not random_part or not tag:
            return None
        key = self.agent_key(agent)
        return key if hmac.compare_digest(judge_nonce_tag(key, random_part), tag) else None


JUDGE_KEYS = web.AppKey("judge_keys", JudgeKeys)


def echo(request: web.Request) -> dict[str, object]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return {
        "remote": request.remote,
        "peer": list(peer[:2]) if peer else None,
        "method": request.method,
        "path": request.path_qs,
        "headers": [[str(k), v] for k, v in request.headers.items()],
    }


async def judge(request: web.Request) -> web.Response:
    """Echo the caller's address and every header: agents classify anonymity from it.
    With keys (the public listener), only agents' nonces are answered, signed."""
    body = echo(request)
    keys = request.app.get(JUDGE_KEYS)
    if keys is not None:
        nonce = request.query.get("n", "")
        key = keys.key_for(nonce)
        if key is None:
            return web.json_response({"error": "not a ppf agent's check"}, status=403)
        headers = body["headers"]
        assert isinstance(headers, list)
        body["sig"] = judge_sign(key, nonce, str(body["remote"]), request.path_qs, headers)
    return web.Response(body=_json.encode(body), content_type="application/json")
