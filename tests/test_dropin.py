"""The calls scrapers already make (gateway/dropin.py), the paste formats and /metrics,
against the real gateway over the real proxy lab: a scraper written for
jhao104/proxy_pool runs unchanged but for the address."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import events as ev
from eventlog.client import Log
from events.mint import fresh_id, now_ms
from ops.lab.testbed import ProxyLab
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
        for path in ("/all/", "/all", "/all/?type=https"):
            rows = (await asyncio.to_thread(requests.get, base + path)).json()
            assert [r["proxy"] for r in rows] == [one["proxy"]], path
        count = (await asyncio.to_thread(requests.get, base + "/count/")).json()
        assert count == {"http_type": {"https": 1}, "source": {"ppf": 1}, "count": 1}
        plain = (await asyncio.to_thread(requests.get, base + "/random")).text
        assert plain == one["proxy"]
        await asyncio.to_thread(delete_proxy, one["proxy"])
        got = await asyncio.to_thread(lambda: requests.get(f"{base}/delete?proxy=1.2.3.4:1").json())
        assert got == {"code": 0, "src": False}  # not in the pool: nothing to report
        # With a site: the site turned it away (a block for that site, never a failure).
        wrong = await asyncio.to_thread(requests.get, f"{base}/delete/?proxy={plain}&site=A b")
        assert wrong.status_code == 400 and wrong.json()["parameter"] == "site"
        got = await asyncio.to_thread(
            lambda: requests.get(f"{base}/delete/?proxy={plain}&site=example.org").json()
        )
        assert got == {"code": 0, "src": True}
        exposed = (await asyncio.to_thread(requests.get, f"{base}/metrics")).text
        # (site names only for the admin: anyone else reads every site's cells summed)
        assert 'ppf_site_proxies{latest="blocked",site="*"} 1' in exposed


async def test_paste_formats_and_metrics(lab: ProxyLab, log_client: Log) -> None:
    """proxychains lines, a Clash proxies list (YAML with JSON-quoted strings, read here
    as the flow mappings they are), sing-box outbounds; /metrics parses with the
    Prometheus parser and counts what the endpoint carried."""
    parser = pytest.importorskip("prometheus_client.parser")
    PACFile = pytest.importorskip("pypac.parser").PACFile
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
        # A PAC file, run by a PAC library as a browser runs it: every proxy of the pool in
        # turn, never DIRECT, never a proxy seen in the middle of TLS (mitm=any asks for
        # them too: the PAC format leaves them out all the same).
        mitm = ev.ProxyWorked(
            id=fresh_id(), agent="c-own", at=now_ms(), ip="127.0.0.1", port=9, proto="http",
            latency_ms=5, mitm=True,
        )  # fmt: skip
        await log_client.publish_raw(ev.agent_subject(mitm), ev.encode(mitm), msg_id=mitm.id)
        pac_text = ""
        for _ in range(50):
            everything = await asyncio.to_thread(text, "json&mitm=any")
            if '"port":9,' in everything:
                pac_text = await asyncio.to_thread(text, "pac&mitm=any")
                break
            await asyncio.sleep(0.2)
        said = PACFile(pac_text).find_proxy_for_url("http://example.com/", "example.com")
        hops = sorted(said.split("; "))
        ports = {p.port: p for p in lab.proxies}
        assert "DIRECT" not in said and len(hops) == 3 and ":9" not in said, said
        assert all(ports[int(h.rsplit(":", 1)[1])].proto is not None for h in hops)
        assert [h.split()[0] for h in hops] == ["PROXY", "SOCKS5", "SOCKS5"]
        proxies = {"http": f"http://shop:{token}@{addr}"}
        r = await asyncio.to_thread(requests.get, f"http://{site}/m", proxies=proxies, timeout=15)
        assert r.status_code == 200
        exposed = (await asyncio.to_thread(requests.get, f"{base}/metrics")).text
        families = {f.name: f for f in parser.text_string_to_metric_families(exposed)}
        pool = {s.labels["status"]: s.value for s in families["ppf_pool_proxies"].samples}
        assert pool["alive"] == 3 and pool["known"] == 4  # the mitm one is known, not alive
        assert "ppf_fold_applied_seq" in families and "ppf_agents" in families
        carried = {
            s.labels["outcome"]: s.value
            for s in families["ppf_endpoint_requests"].samples
            if s.name == "ppf_endpoint_requests_total"
        }
        assert carried == {"forwarded": 1.0}


async def test_a_deleted_proxy_is_not_served_again_to_the_client_that_deleted_it(
    lab: ProxyLab, log_client: Log
) -> None:
    """proxy_pool's client, unchanged but for the address: after delete_proxy(p), 100
    calls of get_proxy() never return p (nor /all/, /count/, /random, /pop/ to it); a
    second client on another address (127.0.0.2) still gets p, and the fleet still
    serves p to everyone in GET /v1/proxies. A deletion naming a site hides p only from
    that client's calls naming that site."""
    from requests.adapters import HTTPAdapter

    class FromAnotherAddress(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["source_address"] = ("127.0.0.2", 0)
            super().init_poolmanager(*args, **kwargs)

    async with _target() as (site, _), _endpoint(log_client, lab) as (_, _, _, feed):
        base = feed.gateways[0]
        _, get_proxy, delete_proxy = await asyncio.to_thread(
            _proxy_pool_scraper, base, f"http://{site}/page"
        )
        p = (await asyncio.to_thread(get_proxy))["proxy"]
        await asyncio.to_thread(delete_proxy, p)

        def hundred() -> set[str]:
            return {str(get_proxy().get("proxy")) for _ in range(100)}

        got = await asyncio.to_thread(hundred)
        assert p not in got, got
        for path in ("/all/", "/random", "/count/"):
            r = await asyncio.to_thread(requests.get, base + path)
            assert p not in r.text and (path != "/count/" or r.json()["count"] == 0), path
        popped = (await asyncio.to_thread(requests.get, base + "/pop/")).json()
        assert popped.get("proxy") != p

        def other() -> set[str]:
            with requests.Session() as s:
                s.mount("http://", FromAnotherAddress())
                return {str(s.get(f"{base}/get/").json().get("proxy")) for _ in range(20)}

        assert p in await asyncio.to_thread(other)
        everyone = (await asyncio.to_thread(requests.get, base + "/v1/proxies?limit=0")).json()
        assert p in {f"{r['ip']}:{r['port']}" for r in everyone["proxies"]}

        def by_site() -> tuple[str, str]:
            with requests.Session() as s:
                s.mount("http://", FromAnotherAddress())
                s.get(f"{base}/delete/?proxy={p}&site=example.org")
                plain = s.get(f"{base}/get/").json().get("proxy")
                named = s.get(f"{base}/get/?works_on=example.org").json().get("proxy")
                return str(plain), str(named)

        plain, named = await asyncio.to_thread(by_site)
        assert plain == p and named != p
