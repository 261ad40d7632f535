"""The load generator of `ppf bench serve --workers` (ops/bench/loadgen.py) through the
lab's squid: a count at a rate keeps the rate, every request ends one way (answered,
a server error, lost), long-lived tunnels carry request after request, and the
histogram keeps a fixed size whatever the count."""

from __future__ import annotations

import ssl
import time

from ops.bench.loadgen import Histogram, Load, generate
from ops.lab.testbed import ProxyLab
from tests.test_endpoint import _target


def test_the_histogram_keeps_its_size_and_its_quantiles_within_a_bucket() -> None:
    """100,000 latencies in the same few dozen buckets; each quantile within 25 % above
    the true one, never past the largest seen."""
    h = Histogram()
    size = len(h.counts)
    for i in range(100_000):
        h.add(1 + i / 1000)  # 1 to 101 ms, uniform
    assert len(h.counts) == size
    for q, true in ((0.5, 51.0), (0.99, 100.0)):
        assert true <= h.quantile_ms(q) <= true * 1.25
    assert h.quantile_ms(1.0) <= h.figures()["max_ms"]  # both rounded to 0.01 ms


async def test_a_count_at_a_rate_through_a_proxy(lab: ProxyLab) -> None:
    """60 plain GETs at 100 a second through squid: all answered, no sooner than the rate
    allows; a site's 503 is a server error, not an answer; a proxy that refuses loses
    every request; 30 requests ride 3 long-lived CONNECT tunnels."""
    squid = next(p for p in lab.proxies if p.name == "squid")
    closed = next(p for p in lab.proxies if p.name == "closed")
    tls = ssl.create_default_context()
    proxy = f"http://any:any@127.0.0.1:{squid.port}"
    refused = f"http://any:any@127.0.0.1:{closed.port}"
    async with _target() as (address, _):
        page, fail = f"http://{address}/page", f"http://{address}/?status=503"
        started = time.monotonic()
        got = await generate(Load("http", requests=60, rate=100), proxy, page, "", tls)
        assert (got.sent, got.answered, got.ok, got.lost) == (60, 60, 60, 0)
        assert time.monotonic() - started >= 0.59 and sum(got.latency.counts) == 60
        failed = await generate(Load("http", requests=10), proxy, fail, "", tls)
        assert (failed.server_errors, failed.answered, failed.lost) == (10, 0, 0)
        lost = await generate(Load("http", requests=10, timeout_s=5), refused, page, "", tls)
        assert (lost.lost, lost.answered) == (10, 0)
        tunnels = await generate(Load("tunnel", requests=30, concurrency=3), proxy, page, "", tls)
        assert (tunnels.ok, tunnels.lost) == (30, 0)
