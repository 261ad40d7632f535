"""The operator's targets are probed at the operator's URL (``ppf sites add URL``,
``SiteRuled.url``): kept in a meta piece of its own, never in the rule the endpoints and
agents read, left out of the digest while none is given (older logs keep theirs), and
handed to the checkers with the probes of that site."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web

import events as ev
from events.sites import SiteRule, path_of
from events.validate import problem
from gateway.rechecks import RecheckWork
from ops.lab.testbed import ProxyLab
from projections.core.digest import meta_digest
from tests.folded import FoldedLog
from tests.helpers import eid

URL = "https://shop.example/catalogue/shoes?size=42"


def _ruled(url: str = "", removed: bool = False) -> ev.SiteRuled:
    rule = SiteRule(site="shop.example")
    return ev.SiteRuled(id=eid(), agent="admin", at=0, rule=rule, removed=removed, url=url)


def test_a_targets_url_is_kept_apart_from_its_rule_and_goes_with_it() -> None:
    """The URL is meta of its own; the rule the agents read has none; a rule given again
    without one, or removed, takes it away."""
    log = FoldedLog()
    log.service(_ruled(URL))
    assert log.state.site_urls == {"shop.example": URL}
    assert "url" not in ev.encode(log.state.site_rules["shop.example"]).decode()
    log.service(_ruled())
    assert log.state.site_urls == {}
    log.service(_ruled(URL))
    log.service(_ruled(removed=True))
    assert log.state.site_urls == {} and "shop.example" not in log.state.site_rules


def test_a_log_without_urls_keeps_its_digest() -> None:
    """Rules without a URL leave the digest as it was before URLs existed (the piece
    is left out while empty); a URL moves it."""
    plain, with_url = FoldedLog(), FoldedLog()
    plain.service(_ruled())
    with_url.service(_ruled(URL))
    before = meta_digest(plain.state)
    plain.state.site_urls = {}
    assert meta_digest(plain.state) == before
    assert meta_digest(with_url.state) != before


def test_a_url_off_the_site_is_refused() -> None:
    """The URL must be the site's own: another host, or not http(s), is refused."""
    assert problem(_ruled("https://evil.example/x"), lab=False)[0] == "url"
    assert problem(_ruled("file:///etc/passwd"), lab=False)[0] == "url"
    assert problem(_ruled("https://www.shop.example/a"), lab=False) == ("", "")


def test_the_probes_of_a_target_ask_the_operators_path() -> None:
    """A checker's payload names the path of each probed site that has a URL; a site
    without one is asked at its root (left out)."""
    state: Any = SimpleNamespace(site_urls={"shop.example": URL})
    work = RecheckWork(SimpleNamespace(state=state))  # type: ignore[arg-type]
    assert work._paths({"shop.example", "news.example"}) == {
        "shop.example": "/catalogue/shoes?size=42"
    }
    assert path_of("https://shop.example") == "/"


async def test_a_probe_through_an_http_proxy_asks_the_path_it_was_given(lab: ProxyLab) -> None:
    """Through a real HTTP proxy (squid) the probe asks the site the operator's path, and
    reads the site's answer."""
    from aiohttp.test_utils import TestServer

    from agents.probe import probe

    asked: list[str] = []
    shoes = "<html><title>Shoes</title>size 42</html>"

    async def page(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        return web.Response(text=shoes, content_type="text/html")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", page)
    site = TestServer(app, host="127.0.0.17")
    await site.start_server()
    squid = next(p for p in lab.proxies if p.name == "squid")
    try:
        got = await probe("127.0.0.1", squid.port, "http", f"127.0.0.17:{site.port}", 10, "/x?y=1")
    finally:
        await site.close()
    assert got.answer.status == 200 and b"size 42" in got.answer.head
    assert asked == ["/x?y=1"]
