"""A consumer told what it got wrong in a query, against the real gateway: a parameter
``/v1/proxies`` does not take, or a value no proxy can have, is a 400 naming it, from the
one declaration of the parameters (``gateway/queries.py`` ``PROXY_PARAMS``)."""

from __future__ import annotations

from eventlog.client import Log
from tests.fleet import serving


async def test_proxy_queries_refuse_what_they_do_not_take(log_client: Log) -> None:
    """``min_uptme=90`` (a typo of ``min_uptime``), ``proto=gopher`` and
    ``anonymity=super``: each a 400 problem naming the parameter; the parameters it
    does take still answer 200."""
    async with serving(log_client) as (client, _):
        for query, parameter in (
            ("min_uptme=90", "min_uptme"),
            ("proto=gopher", "proto"),
            ("anonymity=super", "anonymity"),
            ("limit=0&colour=red", "colour"),
        ):
            r = await client.get(f"/v1/proxies?{query}")
            assert r.status == 400, query
            problem = await r.json()
            assert problem["parameter"] == parameter, problem
            assert parameter in problem["detail"], problem
        for query in ("min_uptime=90", "proto=socks5", "anonymity=elite&limit=0", ""):
            assert (await client.get(f"/v1/proxies?{query}")).status == 200, query
