"""The calls scrapers already make (gateway/dropin.py), the paste formats and /metrics,
against the real gateway over the real proxy lab: a scraper written for
jhao104/proxy_pool runs unchanged but for the address."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ops.lab.testbed import ProxyLab
from ops.nats.client import Log
from tests.test_endpoint import _endpoint, _target

requests = pytest.importorskip("requests")


def _proxy_pool_scraper(base: str, page: str) -> Any:
    """jhao104/proxy_pool's README example, unchanged but for its two addresses."""

    def get_proxy():  # type: ignore[no-untyped-def]
        return requests.get(f"{base}/get/").json()

    def delete_proxy(proxy):  # type: ignore[no-untyped-def]
        requests.get(f"{base}/delete/?proxy={{}}".format(proxy))

    def getHtml():  # type: ignore[no-untyped-def]
        retry_count = 5
        proxy = get_proxy().get("proxy")
        while retry_count > 0:
            try:
                html = requests.get(page, proxies={"http": "http://{}".format(proxy)})  # noqa: UP032
                return html
            except Exception:
                retry_count -= 1
        delete_proxy(proxy)
        return None

    return getHtml(), get_proxy, delete_proxy


async def test_a_proxy_pool_scraper_runs_against_ppf(lab: ProxyLab, log_client: Log) -> None:
    """Its get_proxy() gets an HTTP proxy of the live pool in proxy_pool's shape, its
    request goes through it (the site sees the proxy's exit), its delete_proxy() is a
    report without a token (with a site: that site turned it away); /all/, /count/
    (with and without the slash, type=https) and /random answer in their tools' shapes."""
    squid = next(p for p in lab.proxies if p.name == "squid")
    async with _target() as (site, seen), _endpoint(log_client, lab) as (_, _, _, feed):
        base = feed.gateways[0]
        html, get_proxy, delete_proxy = await asyncio.to_thread(
            _proxy_pool_scraper, base, f"http://{site}/page"
        )
        assert html is not None and html.status_code == 200 and seen == [squid.exit_ip]
        one = await asyncio.to_thread(get_proxy)
        assert one["proxy"] == f"127.0.0.1:{squid.port}" and one["https"] is True
        assert set(one) >= {"fail_count", "region", "anonymous", "source", "check_count"}
        await asyncio.to_thread(delete_proxy, one["proxy"])
        got = await asyncio.to_thread(lambda: requests.get(f"{base}/delete?proxy=1.2.3.4:1").json())
        assert got == {"code": 0, "src": False}  # not in the pool: nothing to report
        for path in ("/all/", "/all", "/all/?type=https"):
            rows = (await asyncio.to_thread(requests.get, base + path)).json()
            assert [r["proxy"] for r in rows] == [one["proxy"]], path
        count = (await asyncio.to_thread(requests.get, base + "/count/")).json()
        assert count == {"http_type": {"https": 1}, "source": {"ppf": 1}, "count": 1}
        plain = (await asyncio.to_thread(requests.get, base + "/random")).text
        assert plain == one["proxy"]
        # With a site: the site turned it away (a block for that site, never a failure).
        wrong = await asyncio.to_thread(requests.get, f"{base}/delete/?proxy={plain}&site=A b")
        assert wrong.status_code == 400 and wrong.json()["parameter"] == "site"
        got = await asyncio.to_thread(
            lambda: requests.get(f"{base}/delete/?proxy={plain}&site=example.org").json()
        )
        assert got == {"code": 0, "src": True}
        exposed = (await asyncio.to_thread(requests.get, f"{base}/metrics")).text
        assert 'ppf_site_proxies{latest="blocked",site="example.org"} 1' in exposed


async def test_paste_formats_and_metrics(lab: ProxyLab, log_client: Log) -> None:
    """proxychains lines, a Clash proxies list (YAML with JSON-quoted strings, read here
    as the flow mappings they are), sing-box outbounds; /metrics parses with the
    Prometheus parser and counts what the endpoint carried."""
    parser = pytest.importorskip("prometheus_client.parser")
    async with _target() as (site, _), _endpoint(log_client, lab) as (addr, token, _, feed):
        base = feed.gateways[0]

        def text(fmt: str) -> str:
            return str(requests.get(f"{base}/v1/proxies?limit=0&format={fmt}").text)

        chains = await asyncio.to_thread(text, "proxychains")
        kinds = sorted(line.split()[0] for line in chains.splitlines()[2:])
        assert kinds == ["http", "socks5", "socks5"]
        clash = (await asyncio.to_thread(text, "clash")).splitlines()
        assert clash[0] == "proxies:" and len(clash) == 4
        assert all(line.startswith("  - {name: ") and "port: " in line for line in clash[1:])
        outbounds = json.loads(await asyncio.to_thread(text, "singbox"))["outbounds"]
        assert sorted(o["type"] for o in outbounds) == ["http", "socks", "socks"]
        assert all(o["version"] == "5" for o in outbounds if o["type"] == "socks")
        proxies = {"http": f"http://shop:{token}@{addr}"}
        r = await asyncio.to_thread(requests.get, f"http://{site}/m", proxies=proxies, timeout=15)
        assert r.status_code == 200
        exposed = (await asyncio.to_thread(requests.get, f"{base}/metrics")).text
        families = {f.name: f for f in parser.text_string_to_metric_families(exposed)}
        pool = {s.labels["status"]: s.value for s in families["ppf_pool_proxies"].samples}
        assert pool["alive"] == 3 and pool["known"] == 3
        assert "ppf_fold_applied_seq" in families and "ppf_agents" in families
        carried = {
            s.labels["outcome"]: s.value
            for s in families["ppf_endpoint_requests"].samples
            if s.name == "ppf_endpoint_requests_total"
        }
        assert carried == {"forwarded": 1.0}
