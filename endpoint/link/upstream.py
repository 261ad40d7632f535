"""An upstream proxy as the endpoint knows it: what the gateways say of it (``Facts``),
where it is and how it is spoken to (all a link needs), and what the router saw of it
(``router/choose.py`` keeps that)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Facts", "Upstream"]


class Facts(Protocol):
    """What the gateway says of a proxy (an ``Upstream`` says it too)."""

    ip: str
    port: int
    proto: str
    country: str
    asn: int
    anonymity: str
    https: str
    mitm: bool
    latency_ms: float
    exit_ip: str
    last_seen: int


@dataclass(slots=True)
class Upstream:
    ip: str
    port: int
    proto: str  # how we speak to it: http, https (an HTTP proxy), socks4, socks5
    country: str = ""
    asn: int = 0
    anonymity: str = ""
    https: str = ""
    mitm: bool = False
    latency_ms: float = 0.0
    exit_ip: str = ""  # where its requests come from, as the checks saw ("": unknown)
    last_seen: int = 0  # log ms of the last check it passed, as the gateway serves it
    # What this endpoint saw of it: the success EMA, when it was last used, until when
    # it is avoided.
    success: float = 1.0
    used_at: float = 0.0
    avoid_until: float = 0.0
    strikes: int = 0  # failures in a row
    # Its ``last_seen`` when this endpoint last reported it failing (-1: never).
    reported_seen: int = -1
    # By site: until when it is turned away (loop time); (minute, requests) sent there.
    turned_away: dict[str, float] = field(default_factory=dict)
    closed_by: tuple[str, float] = ("", 0.0)  # the one site that closed on it lately, until
    site_uses: dict[str, tuple[int, int]] = field(default_factory=dict)
    # By site: until when a rate limit (429) paces it there, and the requests a minute
    # the site let through before it said so (router/choose.py ``pace``).
    paced: dict[str, float] = field(default_factory=dict)
    tolerated: dict[str, int] = field(default_factory=dict)
    key: tuple[str, int] = field(init=False)  # (ip, port): asked at every request, made once

    def __post_init__(self) -> None:
        self.key = (self.ip, self.port)

    @property
    def tunnels(self) -> bool:
        return self.proto.startswith("socks") or self.https == "yes"

    def url(self) -> str:
        scheme = "http" if self.proto in ("http", "https") else self.proto
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{scheme}://{host}:{self.port}"
