"""Reading a judge's answer, whatever judge it is: ppf's own, httpbin-style, azenv-style.

A check asks the judge for its page with a nonce in the query; the answer is the judge's
only when the nonce comes back where that format echoes the query. From the echo come
the address the judge saw and the headers it was sent. Formats are told apart by the
answer itself, so a judge URL is all the configuration a judge needs:

- ppf ``/judge``: JSON ``{"remote", "path", "headers": [[name, value], ...]}``;
- httpbin ``/get``: JSON ``{"origin", "headers": {name: value}, "args": {query}}``;
- azenv: text (often inside ``<pre>``) with ``REMOTE_ADDR = ...``, ``HTTP_X_Y = ...`` and
  ``QUERY_STRING = ...`` (or ``REQUEST_URI``) lines.

An answer that is the judge's page with something added around it (a script appended by
an interceptor) still echoes the nonce; what surrounds the echo is its ``frame``, which a
check compares with the frame of the judge's direct answer: another frame is ``mitm``.
An answer without the nonce (a portal, an error page, garbage) is not the judge's: the
proxy did not carry the request, and it is not working.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from events.wire import judge_sign

__all__ = ["Echo", "read_echo"]

_AZENV_LINE = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*$", re.M)


@dataclass(frozen=True, slots=True)
class Echo:
    """What the judge saw: the caller's address, the headers, and in which format."""

    remote: str
    headers: tuple[tuple[str, str], ...]
    format: str  # ppf, httpbin, azenv
    frame: str = ""  # what the answer holds besides the echo (HTML around azenv lines...)
    # ppf's public judge signs what it echoed; True when the signature does not hold
    # (the page was rewritten inside, where its frame shows nothing).
    forged: bool = False


def _json_object(body: bytes) -> tuple[Any, str] | None:
    """The first JSON object of ``body``, and the text around it."""
    start = body.find(b"{")
    if start < 0:
        return None
    before = body[:start].decode("utf-8", "replace").strip()
    try:
        return msgspec.json.decode(body[start:]), before
    except msgspec.DecodeError:
        pass
    # Trailing bytes after the object (an appended script): cut at each closing brace,
    # from the last, until the prefix decodes. Bounded: a judge's echo is small.
    end = len(body)
    for _ in range(64):
        end = body.rfind(b"}", start, end)
        if end < 0:
            return None
        try:
            after = body[end + 1 :].decode("utf-8", "replace").strip()
            return msgspec.json.decode(body[start : end + 1]), before + after
        except msgspec.DecodeError:
            continue
    return None


def _from_json(doc: Any, nonce: str, frame: str, key: bytes) -> Echo | None:
    if not isinstance(doc, dict):
        return None
    if "origin" in doc and isinstance(doc.get("args"), dict):  # httpbin
        if doc["args"].get("n") != nonce:
            return None
        headers = doc["headers"] if isinstance(doc.get("headers"), dict) else {}
        pairs = tuple((str(k), str(v)) for k, v in headers.items())
        # httpbin's origin may list several addresses ("a, b") behind its own balancer.
        remote = str(doc["origin"]).split(",")[0].strip()
        return Echo(remote, pairs, "httpbin", frame)
    if "remote" in doc and "path" in doc:  # ppf
        if not str(doc.get("path", "")).endswith(f"n={nonce}"):
            return None
        raw = doc["headers"] if isinstance(doc.get("headers"), list) else []
        pairs = tuple((str(p[0]), str(p[1])) for p in raw if isinstance(p, list) and len(p) == 2)
        remote = str(doc.get("remote") or "")
        forged = False
        if key:
            want = judge_sign(key, nonce, remote, str(doc["path"]), [list(p) for p in pairs])
            forged = not hmac.compare_digest(str(doc.get("sig", "")), want)
        return Echo(remote, pairs, "ppf", frame, forged)
    return None


def _from_azenv(text: str, nonce: str) -> Echo | None:
    fields = dict(_AZENV_LINE.findall(text))
    query = fields.get("QUERY_STRING", "") or fields.get("REQUEST_URI", "").partition("?")[2]
    if f"n={nonce}" not in query.split("&") or "REMOTE_ADDR" not in fields:
        return None
    headers = tuple(
        (name[5:].replace("_", "-").title(), value)
        for name, value in fields.items()
        if name.startswith("HTTP_")
    )
    frame = re.sub(r"\s+", " ", _AZENV_LINE.sub("", text)).strip()
    return Echo(fields["REMOTE_ADDR"], headers, "azenv", frame)


def read_echo(body: bytes, nonce: str, key: bytes = b"") -> Echo | None:
    """The judge's echo in ``body`` for this ``nonce``, or None when it is not there;
    with ``key``, a ppf answer's signature is checked (``Echo.forged``)."""
    if nonce.encode() not in body:
        return None  # fast path: most answers that are not the judge's
    found = _json_object(body)
    if found is not None:
        echo = _from_json(found[0], nonce, found[1], key)
        if echo is not None:
            return echo
    return _from_azenv(body.decode("utf-8", "replace"), nonce)
