"""``ppf serve``: the rotating proxy endpoint (endpoint/), alone or inside ``ppf up``."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from contextlib import AsyncExitStack

import structlog

from endpoint.router.outcomes import Outcomes
from ops.cli.common import StopSignals, hostport, listen, stop_step

__all__ = ["DEFAULT_SERVE", "endpoint_site", "register", "serve_options"]

log = structlog.get_logger("ppf")

DEFAULT_SERVE = "127.0.0.1:8899"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sv = sub.add_parser(
        "serve",
        help="one proxy address (HTTP, CONNECT, SOCKS5) that rotates through the live pool",
    )
    sv.add_argument(
        "--gateway",
        required=True,
        help="gateway URL(s), comma-separated: the pool comes from the first that answers",
    )
    sv.add_argument("--listen", default=DEFAULT_SERVE, type=listen)
    sv.add_argument(
        "--lab",
        action="store_true",
        help="carry requests to loopback, private and internal destinations (a lab's own)",
    )
    sv.add_argument(
        "--name",
        help="the endpoint's own agent name (ppf token issue NAME --role endpoint): what its "
        "traffic shows of sites goes to the log under it",
    )
    sv.add_argument("--token", help="that agent's token")
    sv.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # workers.py's
    serve_options(sv, workers="--workers")
    # The data plane's processes run on uvloop (ops/cli/__init__.py): two workers' CPU a
    # request over one's went from 1.21x to 1.12x (docs/decisions.md, The endpoint).
    sv.set_defaults(run=_serve, uvloop=True)


def serve_options(parser: argparse.ArgumentParser, workers: str = "--serve-workers") -> None:
    parser.add_argument(
        workers,
        dest="serve_workers",
        type=int,
        default=1,
        metavar="N",
        help="endpoint processes on the one port (each a core), fed by one feed",
    )
    parser.add_argument(
        "--serve-max-conns",
        type=int,
        default=64,
        metavar="N",
        help="connections one consumer may have open through the endpoint",
    )
    parser.add_argument(
        "--serve-hedges",
        type=int,
        default=64,
        metavar="N",
        help="second upstreams started beside slow connects, at most N at once (0: none)",
    )
    parser.add_argument(
        "--serve-refresh",
        type=float,
        default=5.0,
        metavar="S",
        help="how often the endpoint asks the gateways for the pool",
    )


async def endpoint_site(
    stack: AsyncExitStack,
    listen_at: str,
    gateways: list[str],
    args: argparse.Namespace,
    outcomes: Outcomes | None = None,
    *,
    required: bool = True,
    identity: tuple[str, str] | None = None,
) -> str:
    """The endpoint on ``listen_at``, fed by ``gateways``; its address. Every client
    logs in (a consumer's name and token), so listening beyond loopback exposes nothing
    without a token; it is said in the log all the same."""
    from endpoint.connection.client import serve
    from endpoint.feed import SITES_S, Feed
    from endpoint.figures import FIGURES_S, Figures
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router
    from endpoint.router.tally import HOLD_S

    host, port = hostport(listen_at, 8899)
    if args.serve_workers > 1:
        from ops.cli.workers import start_workers

        if await start_workers(stack, f"{host}:{port}", gateways, args, identity) is None:
            if required:
                raise OSError(f"the endpoint's workers could not listen on {listen_at}")
            log.warning("no_proxy_endpoint", listen=listen_at, error="its workers did not start")
            return ""
        _said(host, port, listen_at)
        return f"{host}:{port}"
    worker = getattr(args, "worker", False)
    pool = Pool()
    # What the traffic showed of sites goes to the log once a minute; the box's test of
    # sites shortens it (``PPF_SITES_S``), as other periods are shortened for tests, and
    # the dashboard's test the hold of answers alike (``PPF_SITES_HOLD_S``).
    sites_s = float(os.environ.get("PPF_SITES_S", SITES_S))
    pool.tally.hold_s = float(os.environ.get("PPF_SITES_HOLD_S", HOLD_S))
    headers = None
    if worker:
        from ops.cli.workers import worker_headers

        headers = worker_headers()
    feed = Feed(
        gateways,
        pool,
        every_s=args.serve_refresh,
        identity=identity,
        sites_every_s=sites_s,
        headers=headers,
    )
    await feed.start()
    stop_step(stack, "the endpoint's feed", feed.stop)
    endpoint = Router(
        pool,
        feed.logins.ok,
        login_known=feed.logins.known,
        login_still=feed.logins.still,
        record=feed.record,
        max_per_consumer=args.serve_max_conns,
        hedges=args.serve_hedges,
        lab=args.lab,
        outcomes=outcomes or Outcomes(),
    )
    try:
        server = await serve(endpoint, host, port, reuse_port=worker)
    except OSError as exc:
        if required:
            raise
        # ppf up goes on without it (the port may be another program's): said, not fatal.
        log.warning("no_proxy_endpoint", listen=listen_at, error=repr(exc))
        return ""
    stack.callback(endpoint.close)
    stop_step(stack, "the endpoint", _closed, server)
    figures = Figures(feed, endpoint.outcomes, float(os.environ.get("PPF_FIGURES_S", FIGURES_S)))
    figures.start()
    stop_step(stack, "the endpoint's figures", figures.stop)
    _said(host, port, listen_at)
    return f"{host}:{port}"


def _said(host: str, port: int, listen_at: str) -> None:
    if not _loopback(host):
        log.warning("serve_listens_beyond_loopback", listen=listen_at, logins="required")
    print(f"ppf: proxy endpoint {host}:{port} (login NAME[-options]:TOKEN)", flush=True)


async def _closed(server: object) -> None:
    server.close()  # type: ignore[attr-defined]
    await server.wait_closed()  # type: ignore[attr-defined]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


async def _serve(args: argparse.Namespace) -> int:
    stop = StopSignals()
    async with AsyncExitStack() as stack:
        gateways = [g.strip() for g in args.gateway.split(",") if g.strip()]
        if args.worker and args.name and args.token is None:  # its endpoint's, from workers.py
            from ops.cli.workers import TOKEN_ENV

            args.token = os.environ.get(TOKEN_ENV)
        if (args.name is None) != (args.token is None):
            print("ppf serve: --name and --token go together", file=sys.stderr)
            return 2
        identity = (args.name, args.token) if args.token else None
        await endpoint_site(stack, args.listen, gateways, args, identity=identity)
        await stop.wait()
    return 0
