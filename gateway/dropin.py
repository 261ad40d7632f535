"""The calls scrapers already make, answered from the live pool: jhao104/proxy_pool's
``/get/``, ``/pop/``, ``/all/``, ``/count/``, ``/delete/?proxy=`` (with or without the
trailing slash, ``type=https`` for proxies that carried HTTPS), and Python3WebSpider's
ProxyPool ``/random`` (plain ``ip:port``).

Both pools hold HTTP proxies, which their users put in ``proxies={"http":
"http://<proxy>"}``, so these serve HTTP proxies only (``proto`` http or https), alive
and confirmed as ``GET /v1/proxies`` serves them. ``/delete/`` removes nothing from the
pool (the log keeps everything): the caller is not served that proxy again by these calls
for a day (gateway/deleted.py), and it is a report (without a token: an anonymous one),
which moves the proxy up the checkers' queue within the caller's budget
(reducers/reports.py); with ``site=SITE``, only calls naming that site leave it out, and
the report says the site turned the proxy away, which hides it from that site's
``works_on`` within the site's share of reports (reducers/sites.py). ``/pop/`` is a
checkout of one proxy for five minutes: nobody else is handed it meanwhile.
"""

from __future__ import annotations

import random
import time
from typing import Any

from aiohttp import web

from events.mint import now_ms
from events.sites import site_key_ok
from events.wire import CheckoutRequest
from gateway.checkout import take
from gateway.commands import anonymous_reporter, proxy_address, publish_report
from gateway.deleted import Deleted
from gateway.http import FOLD, ApiError, authorize, client_address, open_query, reply
from gateway.queries import QUALITY_PARAMS, WORKS_ON, hidden_for, quality_of, works_on_of
from gateway.views import POOL_VIEW
from projections.core.poolview import ProxyView
from projections.core.readmodels import ProxyFilter
from reducers.state import ProxyRow

__all__ = ["DELETED", "routes"]

routes = web.RouteTableDef()
_HTTP = ("http", "https")
DELETED = web.AppKey("dropin_deleted", Deleted)


def _client(request: web.Request) -> str:
    """Who calls, as ``/delete/`` remembers it: a token's agent, else the address."""
    if "Authorization" in request.headers:
        return "agent " + authorize(request, "worker", "checker", "seed", "consumer").name
    return "address " + client_address(request)


async def _served(request: web.Request) -> list[ProxyView]:
    """HTTP proxies served now (``type=https``: those that carried HTTPS)."""
    hidden = hidden_for(request)
    https = request.query.get("type", "").lower() == "https"
    view = await request.app[POOL_VIEW].get(request)
    works_on = works_on_of(WORKS_ON.read(request))
    hidden |= request.app[DELETED].hidden(_client(request), works_on or (), time.monotonic())
    quality = quality_of({p.name: p.read(request) for p in QUALITY_PARAMS})
    f = ProxyFilter(mitm=False, https=True if https else None, works_on=works_on, **quality)
    return [
        v
        for v in view.select(f, now_ms(), limit=0)
        if v.proto in _HTTP and (v.ip, v.port) not in hidden
    ]


def _address(v: ProxyView | ProxyRow) -> str:
    return f"[{v.ip}]:{v.port}" if ":" in v.ip else f"{v.ip}:{v.port}"


def _as_proxy_pool(v: ProxyView | ProxyRow) -> dict[str, Any]:
    """One proxy in proxy_pool's ``Proxy.to_dict`` shape (``last_time``: when it was last
    confirmed), from the pool view or the projection's row alike."""
    return {
        "proxy": _address(v),
        "https": v.https == "yes",
        "fail_count": v.fail_streak,
        "region": v.country,
        "anonymous": v.anonymity,
        "source": "ppf",
        "check_count": v.confirmations,
        "last_status": True,
        "last_time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.last_seen / 1000)),
    }


def _both(path: str) -> list[str]:
    return [path, path + "/"]


async def get(request: web.Request) -> web.Response:
    served = await _served(request)
    if not served:
        return reply({"code": 0, "src": "no proxy"})
    return reply(_as_proxy_pool(random.choice(served)))


async def all_(request: web.Request) -> web.Response:
    return reply([_as_proxy_pool(v) for v in await _served(request)])


async def count(request: web.Request) -> web.Response:
    served = await _served(request)
    https = sum(1 for v in served if v.https == "yes")
    kinds = {k: n for k, n in (("http", len(served) - https), ("https", https)) if n}
    return reply({"http_type": kinds, "source": {"ppf": len(served)}, "count": len(served)})


async def delete(request: web.Request) -> web.Response:
    """Not served to the caller again (gateway/deleted.py), and a report: under the
    caller's consumer token, or, without one, anonymous (the guarded setting)."""
    if "Authorization" in request.headers:
        reporter = authorize(request, "consumer").name
    else:
        open_query(request)
        reporter = ""
    raw = request.query.get("proxy", "")
    ip, port = proxy_address(raw, "proxy")
    state = request.app[FOLD].state
    if not reporter and not state.settings.guarded:
        raise ApiError(403, "forbidden", "reports without a token need the guarded setting")
    site = request.query.get("site", "")
    if site and not site_key_ok(site):
        raise ApiError(
            400, "bad-parameter", "site: a site key (a lower-case name)", parameter="site"
        )
    if (ip, port) in state.proxies:
        request.app[DELETED].hide(_client(request), ip, port, site, time.monotonic())
    outcome = "blocked" if site else "failed"
    try:
        await publish_report(
            request, reporter or anonymous_reporter(request), ip, port, outcome, "delete", site
        )
    except ApiError as exc:
        if exc.status != 404:
            raise
        return reply({"code": 0, "src": False})
    return reply({"code": 0, "src": True})


async def random_one(request: web.Request) -> web.Response:
    served = await _served(request)
    if not served:
        raise ApiError(404, "no-proxy", "no proxy in the pool")  # nothing to hand out
    return web.Response(text=_address(random.choice(served)), content_type="text/plain")


async def pop(request: web.Request) -> web.Response:
    """A checkout of one HTTP proxy for five minutes (gateway/checkout.py): the caller's
    with a consumer token, else held under ``~anonymous`` within its address's budget."""
    if "Authorization" in request.headers:
        name = authorize(request, "consumer").name
    else:
        open_query(request)
        name = anonymous_reporter(request)
    https = request.query.get("type", "").lower() == "https"
    body = CheckoutRequest(count=1, ttl_s=300, proto="http", https=https)
    deleted = request.app[DELETED].hidden(_client(request), (), time.monotonic())
    answer = await take(request, name, body, exclude=deleted)
    if not answer.proxies:
        return reply({"code": 0, "src": "no proxy"})
    p = answer.proxies[0]
    row = request.app[FOLD].state.proxies.get((p.ip, p.port))
    if row is None:  # evicted since it was handed out (dead three TTLs): nothing to give
        return reply({"code": 0, "src": "no proxy"})
    return reply(_as_proxy_pool(row))


for _path, _handler in (
    ("/get", get),
    ("/pop", pop),
    ("/all", all_),
    ("/count", count),
    ("/delete", delete),
):
    for _p in _both(_path):
        routes.get(_p)(_handler)
routes.get("/random")(random_one)
