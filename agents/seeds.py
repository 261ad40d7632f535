"""Well-known public proxy lists that `ppf sources seed` adds (and a first `ppf up`):
plain and per-protocol lists, JSON APIs and HTML pages, 101 of them. (url, protocol hint
or "".)"""

from __future__ import annotations

from events import Origin, SourceAdded, url_id
from events.mint import fresh_id, now_ms

__all__ = ["SEEDS", "source_added"]

_GH = "https://raw.githubusercontent.com"
_PS = "https://api.proxyscrape.com"

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
    # The lists monosans/proxy-scraper-checker keeps in its config.toml (read 2026-11),
    # by protocol group; "https" where the list is of CONNECT proxies.
    (f"{_PS}/v2/?request=displayproxies&protocol=http", "http"),
    (f"{_PS}/v3/free-proxy-list/get?request=getproxies&protocol=http", "http"),
    (f"{_PS}/v3/free-proxy-list/get?request=getproxies&protocol=https", "https"),
    (
        f"{_PS}/v4/free-proxy-list/get?request=display_proxies&proxy_format=protocolipport&format=text",
        "",
    ),
    ("https://openproxylist.xyz/http.txt", "http"),
    ("https://openproxylist.xyz/https.txt", "https"),
    (f"{_GH}/Anonym0usWork1221/Free-Proxies/refs/heads/main/proxy_files/http_proxies.txt", "http"),
    (f"{_GH}/ObcbO/getproxy/refs/heads/master/file/http.txt", "http"),
    (f"{_GH}/ObcbO/getproxy/refs/heads/master/file/https.txt", "https"),
    (f"{_GH}/TheSpeedX/PROXY-List/refs/heads/master/http.txt", "http"),
    (f"{_GH}/TuanMinPay/live-proxy/refs/heads/master/http.txt", "http"),
    (f"{_GH}/databay-labs/free-proxy-list/refs/heads/master/http.txt", "http"),
    (f"{_GH}/dinoz0rg/proxy-list/refs/heads/main/checked_proxies/http.txt", "http"),
    (f"{_GH}/dpangestuw/Free-PROXY/refs/heads/main/http_proxies.txt", "http"),
    (f"{_GH}/ebrasha/abdal-proxy-hub/refs/heads/main/http-proxy-list-by-EbraSha.txt", "http"),
    (f"{_GH}/ebrasha/abdal-proxy-hub/refs/heads/main/https-proxy-list-by-EbraSha.txt", "https"),
    (f"{_GH}/hproxy-com/free-proxy-list/refs/heads/main/http.txt", "http"),
    (f"{_GH}/hproxy-com/free-proxy-list/refs/heads/main/https.txt", "https"),
    (f"{_GH}/iplocate/free-proxy-list/refs/heads/main/protocols/http.txt", "http"),
    (f"{_GH}/mauricegift/free-proxies/refs/heads/master/files/http.json", "http"),
    (f"{_GH}/proxifly/free-proxy-list/refs/heads/main/proxies/protocols/http/data.txt", "http"),
    (f"{_GH}/proxifly/free-proxy-list/refs/heads/main/proxies/protocols/https/data.txt", "https"),
    (f"{_GH}/roosterkid/openproxylist/refs/heads/main/HTTPS_RAW.txt", "https"),
    (f"{_GH}/sunny9577/proxy-scraper/refs/heads/master/generated/http_proxies.txt", "http"),
    (f"{_GH}/zloi-user/hideip.me/refs/heads/main/connect.txt", "http"),
    (f"{_GH}/zloi-user/hideip.me/refs/heads/main/https.txt", "https"),
    ("https://us-proxy.org/", "http"),
    (f"{_PS}/v2/?request=displayproxies&protocol=socks4", "socks4"),
    (f"{_PS}/v3/free-proxy-list/get?request=getproxies&protocol=socks4", "socks4"),
    ("https://openproxylist.xyz/socks4.txt", "socks4"),
    (
        f"{_GH}/Anonym0usWork1221/Free-Proxies/refs/heads/main/proxy_files/socks4_proxies.txt",
        "socks4",
    ),
    (f"{_GH}/ObcbO/getproxy/refs/heads/master/file/socks4.txt", "socks4"),
    (f"{_GH}/TheSpeedX/PROXY-List/refs/heads/master/socks4.txt", "socks4"),
    (f"{_GH}/TuanMinPay/live-proxy/refs/heads/master/socks4.txt", "socks4"),
    (f"{_GH}/cyberh4ck3r/free-proxy-list/refs/heads/main/socks4-proxies.txt", "socks4"),
    (f"{_GH}/databay-labs/free-proxy-list/refs/heads/master/socks4.txt", "socks4"),
    (f"{_GH}/dinoz0rg/proxy-list/refs/heads/main/checked_proxies/socks4.txt", "socks4"),
    (f"{_GH}/dpangestuw/Free-PROXY/refs/heads/main/socks4_proxies.txt", "socks4"),
    (f"{_GH}/ebrasha/abdal-proxy-hub/refs/heads/main/socks4-proxy-list-by-EbraSha.txt", "socks4"),
    (f"{_GH}/hproxy-com/free-proxy-list/refs/heads/main/socks4.txt", "socks4"),
    (f"{_GH}/iplocate/free-proxy-list/refs/heads/main/protocols/socks4.txt", "socks4"),
    (f"{_GH}/mauricegift/free-proxies/refs/heads/master/files/socks4.json", "socks4"),
    (f"{_GH}/proxifly/free-proxy-list/refs/heads/main/proxies/protocols/socks4/data.txt", "socks4"),
    (f"{_GH}/roosterkid/openproxylist/refs/heads/main/SOCKS4_RAW.txt", "socks4"),
    (f"{_GH}/sunny9577/proxy-scraper/refs/heads/master/generated/socks4_proxies.txt", "socks4"),
    (f"{_GH}/zloi-user/hideip.me/refs/heads/main/socks4.txt", "socks4"),
    (f"{_PS}/v2/?request=displayproxies&protocol=socks5", "socks5"),
    (f"{_PS}/v3/free-proxy-list/get?request=getproxies&protocol=socks5", "socks5"),
    ("https://openproxylist.xyz/socks5.txt", "socks5"),
    (
        f"{_GH}/Anonym0usWork1221/Free-Proxies/refs/heads/main/proxy_files/socks5_proxies.txt",
        "socks5",
    ),
    (f"{_GH}/ObcbO/getproxy/refs/heads/master/file/socks5.txt", "socks5"),
    (f"{_GH}/TheSpeedX/PROXY-List/refs/heads/master/socks5.txt", "socks5"),
    (f"{_GH}/TuanMinPay/live-proxy/refs/heads/master/socks5.txt", "socks5"),
    (f"{_GH}/cyberh4ck3r/free-proxy-list/refs/heads/main/socks5-proxies.txt", "socks5"),
    (f"{_GH}/databay-labs/free-proxy-list/refs/heads/master/socks5.txt", "socks5"),
    (f"{_GH}/dinoz0rg/proxy-list/refs/heads/main/checked_proxies/socks5.txt", "socks5"),
    (f"{_GH}/dpangestuw/Free-PROXY/refs/heads/main/socks5_proxies.txt", "socks5"),
    (f"{_GH}/ebrasha/abdal-proxy-hub/refs/heads/main/socks5-proxy-list-by-EbraSha.txt", "socks5"),
    (f"{_GH}/hookzof/socks5_list/refs/heads/master/proxy.txt", "socks5"),
    (f"{_GH}/hproxy-com/free-proxy-list/refs/heads/main/socks5.txt", "socks5"),
    (f"{_GH}/iplocate/free-proxy-list/refs/heads/main/protocols/socks5.txt", "socks5"),
    (f"{_GH}/mauricegift/free-proxies/refs/heads/master/files/socks5.json", "socks5"),
    (f"{_GH}/proxifly/free-proxy-list/refs/heads/main/proxies/protocols/socks5/data.txt", "socks5"),
    (f"{_GH}/roosterkid/openproxylist/refs/heads/main/SOCKS5_RAW.txt", "socks5"),
    (f"{_GH}/sunny9577/proxy-scraper/refs/heads/master/generated/socks5_proxies.txt", "socks5"),
    (f"{_GH}/zloi-user/hideip.me/refs/heads/main/socks5.txt", "socks5"),
    ("https://socks-proxy.net/", "socks5"),
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
