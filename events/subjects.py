"""Subjects of the log (docs/architecture.md §2) and the ids they are built from.

The last token of every subject is its partition key, so the stream can be split
later. A token never holds ``.``, ``*``, ``>`` or white space.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from events.catalogue import (
    AgentEnrolled,
    Configured,
    Deposited,
    DepositFolded,
    DepositRejected,
    Discovered,
    Event,
    Extracted,
    Fetched,
    Heartbeat,
    Leased,
    LeaseReset,
    Located,
    ProxiesChecked,
    ProxyFailed,
    ProxyReported,
    ProxyWorked,
    Released,
    SeedPlanned,
    SiteRuled,
    SitesChecked,
    SourceAdded,
)

__all__ = [
    "AGENT_INBOX",
    "AGENT_PREFIX",
    "DLQ_PREFIX",
    "DLQ_STREAM",
    "LOG_SUBJECTS",
    "MAX_MESSAGE",
    "RESERVED_AGENT_NAMES",
    "STREAM",
    "STREAM_SUBJECTS",
    "SUBJECT_TAILS",
    "SubjectError",
    "agent_inbox",
    "agent_msg_id",
    "agent_name_ok",
    "agent_name_reserved",
    "agent_subject",
    "deposit_key_id",
    "dlq_subject",
    "enrolment_subject",
    "lease_subject",
    "normalize_url",
    "proxy_of",
    "proxy_token",
    "shard_of",
    "subject_for",
    "url_id",
]

STREAM = "PPF"
STREAM_SUBJECTS = "ppf.>"  # what readers of the log ask for (the DLQ is not in it)
# The log's own subjects: every one of ppf's but the DLQ's, which is a stream of its own
# (``DLQ_STREAM``), bounded, dropping its oldest entries.
LOG_SUBJECTS = (
    "ppf.in.>",
    "ppf.source.>",
    "ppf.proxy.>",
    "ppf.checked.>",
    "ppf.deposit.>",
    "ppf.lease.>",
    "ppf.agent.>",
    "ppf.geo.>",
    "ppf.config",
    "ppf.seed.>",
    "ppf.sites.>",
)
DLQ_STREAM = "PPF_DLQ"
DLQ_PREFIX = "ppf.dlq."
# An agent's own subjects: ``ppf.in.<agent>.<entity>.<key>``, the entity subject with the
# publisher's name in front, so a NATS permission can bind each agent to its own.
AGENT_PREFIX = "ppf.in."
# Where an agent's replies (JetStream acks) come: ``_INBOX_AGENT.<agent>.<id>``; each
# agent may read only its own.
AGENT_INBOX = "_INBOX_AGENT"
_ENTITIES = ("ppf.source.", "ppf.proxy.", "ppf.deposit.", "ppf.checked.")
# The largest message the stream stores (its max_msg_size): the largest honest event
# (an Extracted of 1,000 candidates, a Discovered of 50 long URLs) is well under it.
MAX_MESSAGE = 256 * 1024
SHARDS = 256

_AGENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_BAD_TOKEN = re.compile(r"[.*>\s]")


class SubjectError(ValueError):
    """An event whose fields cannot make a valid subject."""


def normalize_url(url: str) -> str:
    """Lower-case scheme and host, drop the fragment and a default port, keep the rest."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port is not None and not (
        (scheme == "http" and port == 80) or (scheme == "https" and port == 443)
    ):
        host = f"{host}:{port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urlunsplit((scheme, host, parts.path or "/", parts.query, ""))


def url_id(url: str) -> str:
    """First 16 hex digits of the SHA-256 of the normalized URL."""
    return hashlib.sha256(normalize_url(url).encode()).hexdigest()[:16]


def deposit_key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def proxy_token(ip: str, port: int) -> str:
    """``203.0.113.7``, 8080 -> ``203-0-113-7_8080`` (IPv6 colons are legal in a token)."""
    return f"{ip.replace('.', '-')}_{port}"


def proxy_of(token: str) -> tuple[str, int]:
    """``proxy_token`` undone: ``203-0-113-7_8080`` -> (``203.0.113.7``, 8080)."""
    host, _, port = token.rpartition("_")
    ip = host if ":" in host else host.replace("-", ".")
    return ip, int(port) if port.isdigit() else 0


def shard_of(ip: str, port: int) -> str:
    """The recheck shard of a proxy: a stable hash of ``ip:port``, never Python's hash()."""
    digest = hashlib.blake2b(f"{ip}:{port}".encode(), digest_size=2).digest()
    return f"s{digest[0]:03d}"


# Names the service publishes as ("admin" on what operators and `ppf up` configure,
# "fold" on lookups) and `ppf up`'s own agents: never issued to an agent, whatever its
# role, so nothing an agent publishes can pass for the service's.
RESERVED_AGENT_NAMES = frozenset(
    {"admin", "fold", "gateway", "ppf", "service", "sys", "local-worker", "local-checker"}
)


def agent_name_ok(name: str) -> bool:
    return bool(_AGENT_NAME.match(name))


def agent_name_reserved(name: str) -> bool:
    return name.lower() in RESERVED_AGENT_NAMES


def _proxy(e: Any) -> str:
    return f"proxy.{e.ip.replace('.', '-')}_{e.port}"


def _lease(e: Any) -> str:
    return f"lease.{e.kind}.{e.target}"


def _source(e: Any) -> str:
    return f"source.{e.url_id}"


# subject_for's subjects without the leading "ppf." and without its token checks (a
# regex per event), for the common types: what the fold compares a message's subject
# with (reducers/admission.py). Only a subject NATS accepted can be equal to one, and
# field nonsense those checks would have caught is refused by validation after.
SUBJECT_TAILS: dict[type, Callable[[Any], str]] = {
    ProxyWorked: _proxy,
    ProxyFailed: _proxy,
    ProxyReported: _proxy,
    Fetched: _source,
    Extracted: _source,
    SourceAdded: _source,
    Discovered: lambda e: "source." + e.parent,
    Located: lambda e: "geo." + e.ip.replace(".", "-"),
    ProxiesChecked: lambda e: "checked." + e.key,
    SitesChecked: lambda e: "checked." + e.key,
    SiteRuled: lambda e: "sites." + e.rule.site.replace(".", "-"),
    Leased: _lease,
    Released: _lease,
    LeaseReset: _lease,
    Heartbeat: lambda e: "agent." + e.agent,
    AgentEnrolled: lambda e: "agent." + e.name,
    Configured: lambda e: "config",
}


def agent_subject(event: Event) -> str:
    """The subject ``event``'s agent publishes it on itself: ``ppf.proxy.1-2-3-4_80`` from
    agent ``w1`` -> ``ppf.in.w1.proxy.1-2-3-4_80``. Only observations have one."""
    subject = subject_for(event)
    if not subject.startswith(_ENTITIES):
        raise SubjectError(f"{type(event).__name__} is published by the service only")
    return AGENT_PREFIX + _token(event.agent, "agent") + subject[3:]


def agent_inbox(agent: str) -> str:
    return f"{AGENT_INBOX}.{_token(agent, 'agent')}"


def agent_msg_id(event: Event) -> str:
    """``Nats-Msg-Id`` of an agent's event: scoped by its agent, so one agent's id can
    never make the stream drop another's event as a duplicate."""
    return f"{event.agent}:{event.id}"


def _token(value: str, what: str) -> str:
    if not value or _BAD_TOKEN.search(value):
        raise SubjectError(f"{what} {value!r} cannot be a subject token")
    return value


def enrolment_subject(name: str) -> str:
    """Where agent ``name``'s enrolments (and its heartbeats) are: ``ppf.agent.<name>``."""
    return "ppf.agent." + _token(name, "agent")


def lease_subject(kind: str, target: str) -> str:
    """The subject a target's leases are claimed, released and reset on."""
    return f"ppf.lease.{kind}." + _token(target, "target")


def dlq_subject(reason: str) -> str:
    return DLQ_PREFIX + _token(reason, "reason")


def subject_for(event: Event) -> str:
    match event:
        case ProxyWorked() | ProxyFailed() | ProxyReported():
            return "ppf.proxy." + _token(proxy_token(event.ip, event.port), "proxy")
        case SourceAdded() | Fetched() | Extracted():
            return "ppf.source." + _token(event.url_id, "url_id")
        case Discovered():
            return "ppf.source." + _token(event.parent, "parent")
        case Leased() | Released() | LeaseReset():
            return lease_subject(event.kind, event.target)
        case Deposited() | DepositFolded() | DepositRejected():
            return "ppf.deposit." + deposit_key_id(event.key)
        case Heartbeat():
            return "ppf.agent." + _token(event.agent, "agent")
        case AgentEnrolled():
            return enrolment_subject(event.name)
        case Configured():
            return "ppf.config"
        case SeedPlanned():
            return "ppf.seed." + _token(event.plan, "plan")
        case Located():
            return "ppf.geo." + _token(event.ip.replace(".", "-"), "ip")
        case ProxiesChecked() | SitesChecked():
            return "ppf.checked." + _token(event.key, "key")
        case SiteRuled():
            return "ppf.sites." + _token(event.rule.site.replace(".", "-"), "site")
    raise SubjectError(f"no subject for {type(event).__name__}")
