"""Each benchmark's options, declared once: the bench takes them as one Struct and
``ppf bench NAME`` makes its flags from the same fields (ops/cli/bench.py ``flags``);
NAME is the class's name in kebab case, its help the docstring, ``run`` what runs it
(``module:function``, called with the options).

A field is a flag ``--its-name`` with its default (required where it has none); its
``Meta`` gives the help, and in ``extra`` what argparse needs beyond the type:
``metavar``, ``group`` (flags of one group exclude each other), ``append`` (the flag
may be given again, each value kept). Light on purpose: every ``ppf`` command builds
these parsers, and no benchmark module is loaded until its bench runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal, get_args

from msgspec import Meta, Struct

__all__ = [
    "KINDS",
    "MODES",
    "Bench",
    "Check",
    "Extract",
    "Fold",
    "FoldSites",
    "Harvest",
    "Ingest",
    "Lease",
    "Marks",
    "Pick",
    "Pool",
    "Quality",
    "Query",
    "Read",
    "Seed",
    "Serve",
    "ServeChurn",
    "SiteState",
    "Sites",
    "Snapshot",
    "Stats",
]

Kind = Literal["http", "socks5"]  # the upstreams a bench of the endpoint stands up
KINDS: tuple[str, ...] = get_args(Kind)
Mode = Literal["http", "https", "tunnel"]  # the loads of ``ppf bench serve --workers``
MODES: tuple[str, ...] = get_args(Mode)


def _(text: str | None = None, **extra: object) -> Meta:
    """A flag's help, and what argparse needs beyond its type."""
    return Meta(description=text, extra=extra)


class Bench(Struct, kw_only=True):
    """A benchmark's options."""

    run: ClassVar[str]  # "module:function", called with the options


_OTHER_TREE = _("another commit's checkout")


class Fold(Bench, kw_only=True):
    """what a gateway catching up with a real stream delivers"""

    run = "ops.cli.bench:fold_run"
    events: Annotated[int, _("observations, as rounds (or --singles)")] = 1_000_000
    singles: Annotated[bool, _("single events, as agents sent before rounds")] = False
    proxies: int = 100_000
    seed: int = 1
    nats: Annotated[str | None, _("an existing NATS (default: its own)")] = None
    rounds: Annotated[
        bool,
        _("the pinned workload as single events and as rounds, folded side by side", group="mode"),
    ] = False
    located: Annotated[
        bool,
        _(
            "what Located adds (the stream without and with one Located per distinct proxy)",
            group="mode",
        ),
    ] = False
    observations: Annotated[int, _("--rounds: proxy checks made")] = 1_000_000
    pairs: Annotated[int, _("--located: runs of each in turn")] = 3
    interleaved: Annotated[int, _("--located: runs side by side, in turns")] = 3
    versus: Annotated[
        Path | None,
        _(
            "against the checkout in DIR, side by side (with --rounds: on the single events)",
            metavar="DIR",
        ),
    ] = None
    runs: Annotated[int, _("--versus, --rounds: runs")] = 5
    catch_up: Annotated[
        bool, _("with --versus: a fresh gateway's catch-up in each tree, in turns")
    ] = False


class Lease(Bench, kw_only=True):
    """lease grants under concurrent agents"""

    run = "ops.bench.gateway:bench_lease"
    clients: Annotated[int, _("concurrent agents")] = 50
    seconds: float = 10.0
    count: Annotated[int, _("targets per request")] = 1


class Query(Bench, kw_only=True):
    """GET /v1/proxies over a large pool"""

    run = "ops.bench.gateway:bench_query"
    proxies: int = 100_000


class Snapshot(Bench, kw_only=True):
    """a new gateway ready from a snapshot, against from seq 1"""

    run = "ops.bench.snapshot:bench_snapshot"
    observations: int = 10_000_000
    proxies: int = 1_000_000
    runs: Annotated[int, _("A B runs, interleaved")] = 2


class Stats(Bench, kw_only=True):
    """/v1/stats and lease latency while the fold works"""

    run = "ops.cli.bench:stats_run"
    proxies: int = 100_000
    seconds: float = 10.0
    rate: Annotated[int, _("events/s folded meanwhile")] = 10_000
    backlog_rounds: Annotated[
        int, _("observations, as rounds over --proxies new proxies, of the backlog phase (0: none)")
    ] = 1_000_000
    backlog_runs: Annotated[int, _("backlog phases, each caught up with, then asked for 10 s")] = 1
    singles: Annotated[
        int, _("observations over --proxies new proxies, as single events and as rounds (0: none)")
    ] = 300_000
    singles_runs: Annotated[int, _("runs of each form, interleaved")] = 5


class Extract(Bench, kw_only=True):
    """extraction of a dense list"""

    run = "ops.bench.extract:bench_extract"
    mb: Annotated[int, _("size of the dense list")] = 30
    seed: int = 1


class Check(Bench, kw_only=True):
    """proxy checks through real proxies"""

    run = "ops.bench.check:bench_check"
    checks: int = 10_000
    tls: Annotated[bool, _("tunnels carry TLS to a pinned judge")] = False


class Harvest(Bench, kw_only=True):
    """a worker harvesting a list of mostly dead proxies"""

    run = "ops.bench.harvest:bench_harvest"
    candidates: int = 10_000
    working_share: float = 0.05


class Pool(Bench, kw_only=True):
    """pool truth under churn"""

    run = "ops.bench.pool:bench_pool"
    profile: Annotated[str, _("steady, flappy or outage")] = "steady"
    proxies: int = 200
    seed: int = 1
    speed: Annotated[float, _("simulated s a second")] = 10.0
    duration: Annotated[int, _("simulated seconds")] = 3_600
    budget: Annotated[int, _("rechecks an hour (0: none)")] = 0
    interval: Annotated[int, _("recheck interval (0: defaults)")] = 0
    failing: Annotated[int, _("a failing proxy's interval (0: half --interval)")] = 0


class Ingest(Bench, kw_only=True):
    """the deposit ingest never lists the store"""

    run = "ops.bench.ingest:bench_ingest"
    sweeps: Annotated[int, _("idle sweep periods")] = 50
    sweep_s: Annotated[float, _("the sweep period")] = 0.1
    deposits: Annotated[int, _("pages deposited")] = 200
    missing: Annotated[int, _("announced, never stored")] = 10


class Serve(Bench, kw_only=True):
    """the rotating endpoint, against going directly or by workers"""

    run = "ops.cli.bench_serve:serve_run"
    requests: Annotated[int | None, _("requests a run (a count)")] = None
    concurrency: Annotated[int, _("requests in flight at most")] = 20
    runs: Annotated[int, _("runs of each, in turns")] = 5
    tunnels: Annotated[int, _("tunnels held open")] = 1_000
    workers: Annotated[
        str | None,
        _(
            "through `ppf serve --workers N` fed by a real gateway, for each N in turn, under "
            "the load generator (its figures per N, and the CPU a request of each N over the "
            "first)",
            metavar="N[,N...]",
        ),
    ] = None
    duration: Annotated[float | None, _("--workers: for S s", metavar="S")] = None
    rate: Annotated[float | None, _("--workers: requests a second")] = None
    mode: Annotated[list[Mode] | None, _("--workers: the loads (default: each)", append=True)] = (
        None
    )
    keepalive: Annotated[Literal["on", "off", "both"], _("--workers")] = "both"
    versus: Annotated[
        Path | None,
        _(
            "the endpoint's CPU a request against another checkout's (git worktree add DIR "
            "REV), in interleaved runs: plain HTTP through each upstream, and inside tunnels",
            metavar="DIR",
        ),
    ] = None
    upstream: Annotated[
        list[Kind] | None,
        _(
            "the upstream's kind (default: each; --workers: http; --versus: plain HTTP "
            "through each, no tunnels)",
            append=True,
        ),
    ] = None
    site_closes: Annotated[
        bool,
        _(
            "--versus: the site closes each connection after its answer (an HTTP/1.0 site): "
            "every request through a SOCKS5 upstream opens a link"
        ),
    ] = False
    site_html: Annotated[
        bool,
        _(
            "--versus: the site answers a titled page of HTML (about 20 KB), which the "
            "endpoint reads for a block, not 512 bytes of text"
        ),
    ] = False


class ServeChurn(Bench, kw_only=True):
    """the endpoint in the churn lab, hedged and not (root)"""

    run = "ops.bench.servechurn:bench_serve_churn"
    requests: Annotated[int, _("through the hedged one")] = 10_000
    concurrency: int = 40


class Pick(Bench, kw_only=True):
    """the endpoint's pick at five sites where a pick walked its pool, by pool size"""

    run = "ops.bench.pick:bench_pick"
    sizes: Annotated[str, _("pool sizes", metavar="N[,N...]")] = "1000,10000,100000"
    picks: Annotated[int, _("picks a measurement")] = 5_000
    runs: Annotated[int, _("runs of each size, in turns")] = 3
    versus: Annotated[Path | None, _("the same in another checkout, in turns", metavar="DIR")] = (
        None
    )


class Sites(Bench, kw_only=True):
    """routing by site in the world in a box (root)"""

    run = "ops.bench.sites:bench_sites"
    learn_s: Annotated[float, _("seconds of learning, the first minute's share said")] = 240.0
    measured_s: Annotated[float, _("seconds measured after learning")] = 120.0
    rate: Annotated[float, _("requests a second to each site, HTTP and HTTPS in turn")] = 2.0
    paced_rate: Annotated[float, _("requests a second to the site that paces")] = 1.0
    own_exits: Annotated[int, _("proxies with exits of their own, beside the seven")] = 25
    other_sites: Annotated[int, _("sites visited once each before learning")] = 0
    tree: Annotated[Path | None, _OTHER_TREE] = None


class FoldSites(Bench, kw_only=True):
    """the fold with site verdicts, against another tree's"""

    run = "ops.bench.sitefold:bench_fold_sites"
    tree: Annotated[Path, _("the other commit's checkout")]
    observations: int = 300_000
    proxies: int = 100_000
    runs: Annotated[int, _("runs of each, in turns")] = 5


class SiteState(Bench, kw_only=True):
    """per-site standing's cost to a gateway"""

    run = "ops.bench.sitestate:bench_site_state"
    observations: int = 300_000
    proxies: int = 100_000
    sites: int = 200
    cells: Annotated[int, _("proxies with a verdict a site")] = 10_000
    runs: Annotated[int, _("runs of each, in turns")] = 3
    tree: Annotated[
        Path | None, _("without: another commit's checkout, on its own snapshot of the same log")
    ] = None
    asks: Annotated[int, _("/v1/stats and leases a run")] = 200


class Read(Bench, kw_only=True):
    """the fold's reader, in plain and over TLS"""

    run = "ops.bench.read:bench_read"
    messages: int = 200_000
    runs: Annotated[int, _("runs of each, in turns")] = 3


class Marks(Bench, kw_only=True):
    """the memory of the re-send window at many agents"""

    run = "ops.bench.marks:bench_marks"
    agents: int = 1_000
    window: int = 512


class Quality(Bench, kw_only=True):
    """uptime and speed against the churn lab's truth (root)"""

    run = "ops.bench.quality:bench_quality"
    proxies: int = 30
    speed: Annotated[float, _("simulated seconds a second")] = 10.0
    duration: Annotated[int, _("simulated seconds")] = 1_800


class Seed(Bench, kw_only=True):
    """seed nodes working a dump"""

    run = "ops.bench.seed:bench_seed"
    lines: Annotated[int, _("lines of the dump")] = 200_000
    nodes: Annotated[int, _("seed node processes")] = 3
    working: Annotated[int, _("working relays in the world")] = 300
