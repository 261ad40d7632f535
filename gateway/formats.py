"""The pool in the formats people paste proxies in: ``GET /v1/proxies?format=...``.

``csv``; ``proxychains`` (``[ProxyList]`` lines, ``socks5 1.2.3.4 1080``);
``clash`` (a ``proxies:`` list, one flow mapping a line: YAML that go-yaml reads, with
JSON-quoted strings, so nothing a name holds can break it; Clash has no SOCKS4, so those
are left out, and counted in a comment); ``singbox`` (sing-box ``outbounds``, JSON);
``pac`` (a proxy auto-config file browsers load: every proxy in turn, never ``DIRECT``,
``mitm`` proxies left out). A proxy's name in these is its ``proto://ip:port`` with its
country. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from projections.core.poolview import ProxyView

__all__ = ["FORMATS"]

_json = msgspec.json.Encoder()


def _name(v: ProxyView) -> str:
    return f"{v.country or 'XX'} {v.proto}://{v.ip}:{v.port}"


def _kind(v: ProxyView) -> str:
    """How a client speaks to it: HTTP proxies (``https`` ones too), SOCKS4, SOCKS5."""
    return "http" if v.proto in ("http", "https") else v.proto


def _csv(views: Sequence[ProxyView]) -> tuple[str, str]:
    lines = ["proto,ip,port,latency_ms,anonymity,exit_ip,last_seen\n"]
    lines += [
        f"{v.proto},{v.ip},{v.port},{v.latency:.1f},{v.anonymity},{v.exit_ip},{v.last_seen}\n"
        for v in views
    ]
    return "".join(lines), "text/csv"


def _proxychains(views: Sequence[ProxyView]) -> tuple[str, str]:
    lines = ["# ppf: paste under [ProxyList] in proxychains.conf\n[ProxyList]\n"]
    lines += [f"{_kind(v)} {v.ip} {v.port}\n" for v in views]
    return "".join(lines), "text/plain"


def _clash(views: Sequence[ProxyView]) -> tuple[str, str]:
    lines = ["proxies:\n"]
    left = 0
    for v in views:
        kind = _kind(v)
        if kind == "socks4":
            left += 1
            continue
        name, server = _json.encode(_name(v)).decode(), _json.encode(v.ip).decode()
        lines.append(f"  - {{name: {name}, type: {kind}, server: {server}, port: {v.port}}}\n")
    if left:
        lines.append(f"# {left} SOCKS4 proxies left out: Clash has no SOCKS4\n")
    return "".join(lines), "text/yaml"


def _singbox(views: Sequence[ProxyView]) -> tuple[str, str]:
    outbounds = []
    for v in views:
        kind = _kind(v)
        out: dict[str, object] = {
            "type": "http" if kind == "http" else "socks",
            "tag": _name(v),
            "server": v.ip,
            "server_port": v.port,
        }
        if kind != "http":
            out["version"] = kind[-1]
        outbounds.append(out)
    return _json.encode({"outbounds": outbounds}).decode(), "application/json"


def _pac(views: Sequence[ProxyView]) -> tuple[str, str]:
    """``FindProxyForURL`` answering the pool in its order, no ``DIRECT`` after it: a
    browser that reaches none of them fails the page rather than going out unproxied.
    A proxy seen reading or changing TLS (``mitm``) is never in it. With none left, a
    proxy on the discard port that refuses: still never direct."""
    kinds = {"http": "PROXY", "socks4": "SOCKS", "socks5": "SOCKS5"}
    hops = [
        f"{kinds[_kind(v)]} {f'[{v.ip}]' if ':' in v.ip else v.ip}:{v.port}"
        for v in views
        if not v.mitm and _kind(v) in kinds
    ]
    said = _json.encode("; ".join(hops) or "PROXY 127.0.0.1:9").decode()
    text = (
        f"// ppf: {len(hops)} proxies of the served pool, in turn; no DIRECT.\n"
        f"function FindProxyForURL(url, host) {{\n  return {said};\n}}\n"
    )
    return text, "application/x-ns-proxy-autoconfig"


FORMATS: dict[str, Callable[[Sequence[ProxyView]], tuple[str, str]]] = {
    "csv": _csv,
    "proxychains": _proxychains,
    "clash": _clash,
    "singbox": _singbox,
    "pac": _pac,
}
