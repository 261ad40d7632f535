"""``GET /metrics``: the gateway's figures in the Prometheus text format (0.0.4).

Gauges read from the projection when scraped (the fold's position and rate, leases by
kind and status, the pool by status and protocol, agents by role and trust), counters
kept by the processes (events folded, refused and re-sent, DLQ entries, the judge's
answers and refusals) and, where the rotating endpoint runs in this process (``ppf
up``), its requests by outcome and the time it adds before the upstream. Written here:
the format is lines of ``name{labels} value``, and a scrape must cost no more than
/v1/stats (it reads the same census).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from aiohttp import web

from events.mint import now_ms
from events.roles import ROLE_EVENTS
from gateway.http import CONFIG, FOLD, LOG, ROLE_ADMIN, authorize
from gateway.judge import JUDGE_DOOR
from gateway.views import pool_census
from reducers import sites, trust
from reducers.pool import FRESH_STATUSES, lease_live

__all__ = ["ENDPOINT_OUTCOMES", "EndpointCounts", "metrics_text", "routes"]

routes = web.RouteTableDef()


class EndpointCounts(Protocol):
    """What /metrics reads of the rotating endpoint (``endpoint.router.outcomes.Outcomes``): its
    requests by outcome and the time it added to the latest ones."""

    @property
    def counts(self) -> Mapping[str, int]: ...

    @property
    def added_ms(self) -> Iterable[float]: ...


ENDPOINT_OUTCOMES = web.AppKey("endpoint_outcomes", EndpointCounts)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    name: str, kind: str, help_: str, samples: Iterable[tuple[dict[str, Any], float]]
) -> list[str]:
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{inner}}} {value}" if inner else f"{name} {value}")
    return lines


# The site label of ppf_site_proxies for a caller that may not see sites' names: every
# site's cells summed under it.
ALL_SITES = "*"


def metrics_text(
    app: web.Application, head: int, census: dict[str, Any], *, named_sites: bool = False
) -> str:
    fold = app[FOLD]
    state = fold.state
    now = now_ms()
    leases: dict[tuple[str, str], int] = {}
    for row in state.leases.values():
        # A lease past its expiry is free, whatever the row says until the next event.
        status = row.status
        if status == "leased":
            status = "held" if lease_live(row, now) else "free"
        leases[(row.kind, status)] = leases.get((row.kind, status), 0) + 1
    agents: dict[tuple[str, str], int] = {}
    for a in state.agents.values():
        key = (a.role or "none", trust.level(state, a))
        agents[key] = agents.get(key, 0) + 1
    rate = fold.stats.rates().get("1m", {}).get("fold", 0.0)
    lines: list[str] = []
    lines += _family(
        "ppf_fold_applied_seq", "gauge", "last log sequence folded", [({}, fold.applied_seq)]
    )
    lines += _family("ppf_log_head_seq", "gauge", "last sequence in the log", [({}, head)])
    lines += _family(
        "ppf_fold_lag", "gauge", "messages not folded yet", [({}, max(head - fold.applied_seq, 0))]
    )
    lines += _family("ppf_fold_rate", "gauge", "events folded a second (1 min)", [({}, rate)])
    lines += _family(
        "ppf_fold_events_total",
        "counter",
        "events folded by this process",
        [({}, fold.folder.applied)],
    )
    lines += _family(
        "ppf_fold_rejected_total",
        "counter",
        "messages refused to the DLQ",
        [({}, fold.folder.rejected)],
    )
    lines += _family(
        "ppf_fold_resent_total",
        "counter",
        "agents' re-sends met and ignored",
        [({}, fold.folder.resent)],
    )
    lines += _family(
        "ppf_dlq_sent_total", "counter", "DLQ entries written", [({}, fold.dead_letters.sent)]
    )
    if (guard := app[CONFIG].disk_guard) is not None:
        lines += _family(
            "ppf_store_used_ratio",
            "gauge",
            "the log's or the deposits' bytes over the disk guard's limit (warned at 0.8)",
            [({}, round(guard.used_ratio, 4))],
        )
    lines += _family(
        "ppf_leases",
        "gauge",
        "lease targets by kind and status",
        [({"kind": k, "status": s}, n) for (k, s), n in sorted(leases.items())],
    )
    statuses = (*FRESH_STATUSES, "stale")
    lines += _family(
        "ppf_pool_proxies",
        "gauge",
        "proxies by status (alive: what is served)",
        [({"status": s}, census.get(s, 0)) for s in statuses]
        + [({"status": "known"}, census.get("known", 0))],
    )
    lines += _family(
        "ppf_pool_alive",
        "gauge",
        "served proxies by protocol",
        [({"proto": p}, n) for p, n in census.get("by_proto", {}).items()],
    )
    lines += _family(
        "ppf_agents",
        "gauge",
        "enrolled agents by role and trust",
        [({"role": r, "trust": t}, n) for (r, t), n in sorted(agents.items())],
    )
    by_site = sites.latest_counts(state)
    if not named_sites:  # which sites the traffic goes to: the admin's alone
        summed: dict[str, int] = {}
        for counts in by_site.values():
            for word, n in counts.items():
                summed[word] = summed.get(word, 0) + n
        by_site = {ALL_SITES: summed} if summed else {}
    lines += _family(
        "ppf_site_proxies",
        "gauge",
        "proxies by site and the latest verdict on them that steers (reducers/sites.py)",
        [
            ({"site": site, "latest": word}, n)
            for site, counts in sorted(by_site.items())
            for word, n in counts.items()
        ],
    )
    door = app.get(JUDGE_DOOR)
    if door is not None:
        lines += _family(
            "ppf_judge_answers_total",
            "counter",
            "judge requests by outcome",
            [({"outcome": "answered"}, door.answered), ({"outcome": "refused"}, door.refused)],
        )
    ops = app[LOG].ops
    lines += _family(
        "ppf_nats_ops_total",
        "counter",
        "NATS operations by outcome",
        [({"op": k}, v) for k, v in sorted(ops.items())],
    )
    outcomes = app.get(ENDPOINT_OUTCOMES)
    if outcomes is not None:
        lines += _family(
            "ppf_endpoint_requests_total",
            "counter",
            "rotating endpoint requests and tunnels by outcome",
            [({"outcome": k}, v) for k, v in sorted(outcomes.counts.items())],
        )
        added = sorted(outcomes.added_ms)
        median = added[len(added) // 2] if added else 0.0
        lines += _family(
            "ppf_endpoint_added_ms",
            "gauge",
            "median time the endpoint adds before its upstream (last 1,000)",
            [({}, round(median, 3))],
        )
    return "\n".join(lines) + "\n"


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    fold = request.app[FOLD]
    head = await fold.head_seq()
    census = await pool_census(request.app, fold.state, now_ms(), idle=head <= fold.applied_seq)
    admin = "Authorization" in request.headers and (
        authorize(request, *ROLE_EVENTS).role == ROLE_ADMIN
    )
    text = metrics_text(request.app, head, census, named_sites=admin)
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )
