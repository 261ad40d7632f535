"""What the rotating endpoints did, as each of their processes reports it
(``POST /v1/endpoints/figures``, endpoint/figures.py), summed for ``/v1/stats``'
``endpoint`` and the dashboard.

Figures of a moment, kept in memory, not in the log: a gateway restarted shows them again
after two reports. Rates are over the last minute of each process's reports; a process
that has not reported for ``KEPT_S`` counts no more.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from events.wire import ENDPOINT_FIGURES_PATH, EndpointFigures
from gateway.http import authorize, decode_body, reply

__all__ = ["ENDPOINTS", "EndpointBoard", "routes"]

KEPT_S = 30.0
# Processes kept at once: an endpoint's token naming ever new processes evicts its own
# oldest (and any endpoint's silent ones) before it grows the gateway's memory.
MAX_PROCESSES = 1_024
WINDOW_S = 60.0  # the rates are over a process's reports of the last minute
# A request's end, by who it ended for: the pool answered it, the pool could not, or the
# client's own doing (a login, a limit, a destination, its own slowness or bytes).
ANSWERED = ("forwarded", "tunnel")
UNANSWERED = ("no_proxy", "no_answer")
CLIENTS = (
    "client_error",
    "login_refused",
    "login_revoked",
    "login_limited",
    "over_limit",
    "destination_refused",
    "slow_head",
    "slow_body",
)
# The 503s (no proxy for the request), by why: the two counts the endpoint keeps.
REFUSED_503 = {
    "nothing in the pool matches": ("no_proxy", "no_proxy_after_tries"),
    "every proxy that matched was tried": ("no_proxy_after_tries", ""),
}

routes = web.RouteTableDef()


@dataclass
class _Process:
    counts: dict[str, int]
    at: float
    # Its reports of the last WINDOW_S, oldest first: its rates and latencies are over them.
    reports: deque[tuple[float, dict[str, int], list[float]]] = field(default_factory=deque)

    def rates(self) -> dict[str, float]:
        if len(self.reports) < 2:
            return {}
        (t0, c0, _), (t1, c1, _) = self.reports[0], self.reports[-1]
        return {k: (v - c0.get(k, 0)) / (t1 - t0) for k, v in c1.items()}


class EndpointBoard:
    def __init__(self) -> None:
        self._processes: dict[tuple[str, str], _Process] = {}

    def take(self, endpoint: str, figures: EndpointFigures, at: float) -> None:
        key = (endpoint, figures.process)
        counts = dict(figures.counts)
        p = self._processes.get(key)
        if p is None and len(self._processes) >= MAX_PROCESSES:
            self._processes = {k: q for k, q in self._processes.items() if at - q.at <= KEPT_S}
            if len(self._processes) >= MAX_PROCESSES:
                del self._processes[min(self._processes, key=lambda k: self._processes[k].at)]
        if p is None or any(v < p.counts.get(k, 0) for k, v in counts.items()):
            p = self._processes[key] = _Process(counts, at)  # new, or restarted
        p.counts, p.at = counts, at
        p.reports.append((at, counts, figures.first_byte_ms))
        while len(p.reports) > 2 and at - p.reports[1][0] >= WINDOW_S:
            p.reports.popleft()

    def summary(self, at: float) -> dict[str, Any]:
        live = {k: p for k, p in self._processes.items() if at - p.at <= KEPT_S}
        self._processes = live
        rates: dict[str, float] = {}
        totals: dict[str, int] = {}
        latencies: list[float] = []
        for p in live.values():
            for k, v in p.rates().items():
                rates[k] = rates.get(k, 0.0) + v
            for k, n in p.counts.items():
                totals[k] = totals.get(k, 0) + n
            for _, _, ms in p.reports:
                latencies.extend(ms)
        answered = sum(rates.get(k, 0.0) for k in ANSWERED)
        unanswered = sum(rates.get(k, 0.0) for k in UNANSWERED)
        latencies.sort()
        return {
            "endpoints": len({endpoint for endpoint, _ in live}),
            "processes": len(live),
            "requests_per_s": round(
                answered + unanswered + sum(rates.get(k, 0.0) for k in CLIENTS), 2
            ),
            "answered_share": round(answered / (answered + unanswered), 4)
            if answered + unanswered
            else None,
            "first_byte_ms": {"p50": _quantile(latencies, 0.5), "p99": _quantile(latencies, 0.99)},
            "hedges_per_s": round(rates.get("hedge_started", 0.0), 2),
            "hedges_won": totals.get("hedge_won", 0),
            "refused_503": {
                why: {
                    "per_s": round(rates.get(count, 0.0) - rates.get(less, 0.0), 2),
                    "total": totals.get(count, 0) - totals.get(less, 0),
                }
                for why, (count, less) in REFUSED_503.items()
            },
            "totals": totals,
        }


def _quantile(ordered: list[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


ENDPOINTS = web.AppKey("endpoints", EndpointBoard)


@routes.post(ENDPOINT_FIGURES_PATH)
async def endpoint_figures(request: web.Request) -> web.Response:
    """An endpoint process's figures (endpoint role): the dashboard's traffic panel."""
    caller = authorize(request, "endpoint")
    figures = await decode_body(request, EndpointFigures)
    request.app[ENDPOINTS].take(caller.name, figures, time.monotonic())
    return reply({"taken": True})
