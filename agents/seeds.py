"""Well-known public proxy lists that `ppf sources seed` adds: plain and per-protocol
lists, JSON APIs and HTML pages. (url, protocol hint or "".)"""

from __future__ import annotations

from events import Origin, SourceAdded, url_id
from events.mint import fresh_id, now_ms

__all__ = ["SEEDS", "source_added"]

_GH = "https://raw.githubusercontent.com"

SEEDS: tuple[tuple[str, str], ...] = (
    (f"{_GH}/monosans/proxy-list/main/proxies/all.txt", ""),
    (f"{_GH}/monosans/proxy-list/main/proxies/http.txt", "http"),
    (f"{_GH}/monosans/proxy-list/main/proxies/socks4.txt", "socks4"),
    (f"{_GH}/monosans/proxy-list/main/proxies/socks5.txt", "socks5"),
    (f"{_GH}/monosans/proxy-list/main/proxies.json", ""),
    (f"{_GH}/TheSpeedX/PROXY-List/master/http.txt", "http"),
    (f"{_GH}/TheSpeedX/PROXY-List/master/socks4.txt", "socks4"),
    (f"{_GH}/TheSpeedX/PROXY-List/master/socks5.txt", "socks5"),
    (f"{_GH}/clarketm/proxy-list/master/proxy-list-raw.txt", "http"),
    (f"{_GH}/clarketm/proxy-list/master/proxy-list.txt", "http"),
    (f"{_GH}/hookzof/socks5_list/master/proxy.txt", "socks5"),
    (f"{_GH}/ShiftyTR/Proxy-List/master/http.txt", "http"),
    (f"{_GH}/ShiftyTR/Proxy-List/master/socks4.txt", "socks4"),
    (f"{_GH}/ShiftyTR/Proxy-List/master/socks5.txt", "socks5"),
    (f"{_GH}/jetkai/proxy-list/main/online-proxies/txt/proxies-http.txt", "http"),
    (f"{_GH}/jetkai/proxy-list/main/online-proxies/txt/proxies-socks4.txt", "socks4"),
    (f"{_GH}/jetkai/proxy-list/main/online-proxies/txt/proxies-socks5.txt", "socks5"),
    (f"{_GH}/mmpx12/proxy-list/master/http.txt", "http"),
    (f"{_GH}/mmpx12/proxy-list/master/socks4.txt", "socks4"),
    (f"{_GH}/mmpx12/proxy-list/master/socks5.txt", "socks5"),
    (f"{_GH}/roosterkid/openproxylist/main/HTTPS_RAW.txt", "http"),
    (f"{_GH}/roosterkid/openproxylist/main/SOCKS4_RAW.txt", "socks4"),
    (f"{_GH}/roosterkid/openproxylist/main/SOCKS5_RAW.txt", "socks5"),
    ("https://api.proxyscrape.com/v2/?request=getproxies&protocol=http", "http"),
    ("https://api.proxyscrape.com/v2/?request=getproxies&protocol=socks4", "socks4"),
    ("https://api.proxyscrape.com/v2/?request=getproxies&protocol=socks5", "socks5"),
    ("https://www.proxy-list.download/api/v1/get?type=http", "http"),
    ("https://www.proxy-list.download/api/v1/get?type=socks5", "socks5"),
    ("https://proxylist.geonode.com/api/proxy-list?limit=500&page=1&sort_by=lastChecked", ""),
    ("https://spys.me/proxy.txt", "http"),
    ("https://spys.me/socks.txt", "socks5"),
    ("https://free-proxy-list.net/", "http"),
    ("https://www.sslproxies.org/", "https"),
    ("https://www.socks-proxy.net/", "socks4"),
)


def source_added(urls: dict[str, str], origin: Origin, agent: str = "admin") -> list[SourceAdded]:
    """``SourceAdded`` events from ``agent`` for ``urls`` (url -> protocol hint)."""
    return [
        SourceAdded(
            id=fresh_id(),
            agent=agent,
            at=now_ms(),
            url=u,
            url_id=url_id(u),
            proto_hint=hint,
            origin=origin,
        )
        for u, hint in urls.items()
    ]
