"""``ppf token``, ``ppf sources``: what an operator tells the fleet."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventlog.client import Log
from eventlog.enrolled import holds_token
from events import (
    RESERVED_AGENT_NAMES,
    AgentEnrolled,
    Configured,
    Origin,
    Role,
    Settings,
    agent_name_ok,
    agent_name_reserved,
)
from events.mint import enrollment, fresh_id, now_ms
from ops.cli.common import DEFAULT_NATS

__all__ = ["enroll", "reconfigure", "register"]

ROLES = ["worker", "checker", "seed", "consumer", "endpoint", "admin"]


async def enroll(lg: Log, name: str, role: Role) -> str:
    """Publish ``AgentEnrolled`` for a fresh token; returns the token (shown once)."""
    token, event = enrollment(name, role)
    await lg.publish(event)
    return token


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tk = sub.add_parser("token", help="agent tokens")
    tk_sub = tk.add_subparsers(dest="action", required=True)
    issue = tk_sub.add_parser("issue", help="enroll an agent; prints its token once")
    issue.add_argument("name")
    issue.add_argument("--role", required=True, choices=ROLES, help="what the agent may do")
    issue.add_argument(
        "--rotate", action="store_true", help="replace the token of a name that has one"
    )
    issue.add_argument("--nats", default=DEFAULT_NATS)
    issue.set_defaults(run=_token)
    revoke = tk_sub.add_parser(
        "revoke", help="the agent's token stops working and its NATS connections are cut"
    )
    revoke.add_argument("name")
    revoke.add_argument("--nats", default=DEFAULT_NATS)
    revoke.set_defaults(run=_revoke)
    trust = tk_sub.add_parser(
        "trust",
        help="count the agent as the operator's own: its reports are served unchecked, "
        "and a checker's checks spot-check other agents",
    )
    untrust = tk_sub.add_parser(
        "untrust", help="the agent earns trust again by spot-checks, as any other agent"
    )
    for sp, on in ((trust, True), (untrust, False)):
        sp.add_argument("name")
        sp.add_argument("--nats", default=DEFAULT_NATS)
        sp.set_defaults(run=_trust, on=on)

    so = sub.add_parser("sources", help="add sources (admin)")
    so_sub = so.add_subparsers(dest="action", required=True)
    add = so_sub.add_parser("add")
    add.add_argument("urls", nargs="+")
    imp = so_sub.add_parser("import")
    imp.add_argument("file", help="one URL a line; - for stdin")
    seed = so_sub.add_parser("seed", help="add the built-in list of well-known sources")
    seed.add_argument("--nats", default=DEFAULT_NATS)
    seed.add_argument("--hint", default="")
    for sp in (add, imp):
        sp.add_argument("--hint", default="", help="protocol hint of these lists")
        sp.add_argument("--nats", default=DEFAULT_NATS)
    for sp in (add, imp, seed):
        sp.set_defaults(run=_sources)

    si = sub.add_parser("sites", help="how sites' answers are read (admin)")
    si_sub = si.add_subparsers(dest="action", required=True)
    rule = si_sub.add_parser("add", help="the operator's rule for a site (its target)")
    rule.add_argument("url", help="a page of the site, e.g. https://shop.example/")
    rule.add_argument("--through", default="200", help="statuses that are its page (200)")
    rule.add_argument("--blocked", default="403,429", help="statuses that turn away")
    rule.add_argument("--marker", action="append", default=[], help="words of a block page")
    rule.add_argument("--redirect", action="append", default=[], help="a block's path")
    rule.add_argument("--min-bytes", type=int, default=0, help="a page's least size")
    rule.add_argument(
        "--lab", action="store_true", help="a site on a loopback or private address (a lab's)"
    )
    gone = si_sub.add_parser("remove", help="back to the built-in or generic reading")
    gone.add_argument("url")
    for sp in (rule, gone):
        sp.add_argument("--nats", default=DEFAULT_NATS)
        sp.set_defaults(run=_sites)


async def _revoke(args: argparse.Namespace) -> int:
    """``AgentEnrolled`` with no token: the gateway then refuses the old token, the
    callout refuses its NATS login, and the gateways cut its open connections."""
    if not agent_name_ok(args.name):
        print(f"ppf token: bad agent name {args.name!r}", file=sys.stderr)
        return 2
    lg = await Log.connect(args.nats, name="ppf-token")
    try:
        await lg.ensure_stream()
        if not await holds_token(lg, args.name):
            print(
                f"ppf token: {args.name!r} has no token (never issued, or revoked)", file=sys.stderr
            )
            return 2
        # The role is kept by the fold: a revocation changes only the token.
        event = AgentEnrolled(
            id=fresh_id(),
            agent="admin",
            at=now_ms(),
            name=args.name,
            role="worker",
            token_sha256="",
        )
        seq = (await lg.publish(event)).seq
    finally:
        await lg.close()
    print(json.dumps({"revoked": args.name, "seq": seq}), flush=True)
    return 0


async def reconfigure(lg: Log, change: Callable[[Settings], Settings]) -> Settings | None:
    """Publish ``Configured`` with ``change`` applied to the log's last settings (the
    defaults when there are none); None when that changes nothing."""
    current = await lg.last_event("ppf.config")
    settings = current.settings if isinstance(current, Configured) else Settings()
    changed = change(settings)
    if changed == settings:
        return None
    await lg.publish(Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=changed))
    return changed


async def _trust(args: argparse.Namespace) -> int:
    """The operator's trusted agents are a setting (``trusted_agents``), so the fold
    applies a change at one point of the log and a replay applies it at the same."""
    if not agent_name_ok(args.name):
        print(f"ppf token: bad agent name {args.name!r}", file=sys.stderr)
        return 2

    def change(s: Settings) -> Settings:
        names = [n for n in s.trusted_agents if n != args.name]
        if args.on:
            names.append(args.name)
        return msgspec.structs.replace(s, trusted_agents=tuple(names))

    lg = await Log.connect(args.nats, name="ppf-token")
    try:
        await lg.ensure_stream()
        settings = await reconfigure(lg, change)
    finally:
        await lg.close()
    key = "trusted" if args.on else "untrusted"
    print(json.dumps({key: args.name, "changed": settings is not None}), flush=True)
    return 0


async def _token(args: argparse.Namespace) -> int:
    if not agent_name_ok(args.name):
        print(f"ppf token: bad agent name {args.name!r}: 1-64 of A-Z a-z 0-9 _ -", file=sys.stderr)
        return 2
    if agent_name_reserved(args.name):
        reserved = ", ".join(sorted(RESERVED_AGENT_NAMES))
        print(
            f"ppf token: {args.name!r} is reserved (the service's own: {reserved})", file=sys.stderr
        )
        return 2
    lg = await Log.connect(args.nats, name="ppf-token")
    try:
        await lg.ensure_stream()
        if not args.rotate and await holds_token(lg, args.name):
            print(
                f"ppf token: {args.name!r} has a token already: --rotate replaces it (the old "
                "one then stops working everywhere)",
                file=sys.stderr,
            )
            return 2
        token = await enroll(lg, args.name, args.role)
    finally:
        await lg.close()
    print(token, flush=True)
    return 0


def _urls(args: argparse.Namespace) -> dict[str, str]:
    """URL -> protocol hint, in the order given, once each."""
    from agents.seeds import SEEDS

    if args.action == "seed":
        return dict(SEEDS)
    urls = list(getattr(args, "urls", []))
    if args.action == "import":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        urls = [line.strip() for line in text.splitlines() if line.strip()]
        urls = [u for u in urls if not u.startswith("#")]
    return dict.fromkeys(urls, args.hint or "")


async def _sources(args: argparse.Namespace) -> int:
    from agents.seeds import source_added
    from ops.progress import Progress

    hints = _urls(args)
    bad = [u for u in hints if not u.startswith(("http://", "https://"))]
    if bad:
        print(f"ppf sources: not http(s) URLs: {', '.join(bad[:5])}", file=sys.stderr)
        return 2
    origin: Origin = "seed" if args.action == "seed" else "manual"
    events = source_added(hints, origin)
    lg = await Log.connect(args.nats, name="ppf-sources")
    progress = Progress("sources", len(events))
    try:
        await lg.ensure_stream()
        for start in range(0, len(events), 1000):
            await lg.publish_many(events[start : start + 1000])
            progress.update(min(start + 1000, len(events)))
    finally:
        progress.close()
        await lg.close()
    print(json.dumps({"added": len(events)}))
    return 0


async def _sites(args: argparse.Namespace) -> int:
    """``SiteRuled`` for the site of ``args.url``, checked as the fold checks it."""
    from urllib.parse import urlsplit

    from endpoint.router.verdicts import site_of
    from events import SiteRuled
    from events.mint import fresh_id, now_ms
    from events.sites import SiteRule, path_of
    from events.validate import host_can_be_public, problem

    host = urlsplit(args.url if "//" in args.url else "//" + args.url).hostname or ""
    if (
        host
        and args.action == "add"
        and not args.lab
        and not host_can_be_public(host, guarded=True)
    ):
        print(
            f"ppf sites: {host!r} is not on the public internet: the fleet's checkers would "
            "probe it through proxies, reaching their hosts' own (--lab for a lab's sites)",
            file=sys.stderr,
        )
        return 2
    site = site_of(host)
    try:
        rule = SiteRule(site=site)
        if args.action == "add":
            rule = SiteRule(
                site=site,
                through=tuple(int(c) for c in args.through.split(",") if c),
                blocked=tuple(int(c) for c in args.blocked.split(",") if c),
                markers=tuple(args.marker),
                redirects=tuple(args.redirect),
                min_bytes=args.min_bytes,
            )
    except ValueError:
        print("ppf sites: statuses are numbers, comma-separated", file=sys.stderr)
        return 2
    adding = args.action == "add"
    # The probes of the site ask the operator's URL, when it named more than the site.
    url = args.url if adding and "//" in args.url and path_of(args.url) != "/" else ""
    event = SiteRuled(
        id=fresh_id(), agent="admin", at=now_ms(), rule=rule, removed=not adding, url=url
    )
    field, why = problem(event, lab=False)
    if why:
        print(f"ppf sites: {field}: {why}", file=sys.stderr)
        return 2
    lg = await Log.connect(args.nats, name="ppf-sites")
    try:
        await lg.ensure_stream()
        await lg.publish(event)
    finally:
        await lg.close()
    print(json.dumps({"site": site, "ruled": args.action == "add"}))
    return 0
