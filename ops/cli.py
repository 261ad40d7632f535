"""``ppf``: the command line (ARCHITECTURE.md §9)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog

from events import Configured, DecodeError, Settings, decode
from ops import logs
from ops.log import Log, LogError, fresh_id, now_ms

__all__ = ["main"]

log = structlog.get_logger("ppf")

DEFAULT_NATS = "nats://127.0.0.1:4222"
REPO = Path(__file__).resolve().parent.parent


def _hostport(text: str, default_port: int = 0) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        return text, default_port
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}") from None
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {text!r}")
    return host, number


def _listen(text: str) -> str:
    """argparse type: check HOST:PORT at parse time, keep the text."""
    _hostport(text)
    return text


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _configure_lab(lg: Log, lab: bool) -> None:
    """Publish ``Configured`` when the log's last settings disagree with ``--lab``."""
    current = await lg.last_event("ppf.config")
    settings = current.settings if isinstance(current, Configured) else Settings()
    if settings.lab == lab:
        return
    event = Configured(
        id=fresh_id(),
        agent="admin",
        at=now_ms(),
        settings=msgspec.structs.replace(settings, lab=lab),
    )
    await lg.publish(event)
    log.info("settings_published", lab=lab)


async def enroll(lg: Log, name: str, role: str) -> str:
    """Publish ``AgentEnrolled`` with the SHA-256 of a fresh token; returns the token."""
    import hashlib
    import secrets

    from events import AgentEnrolled

    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    event = AgentEnrolled(
        id=fresh_id(), agent="admin", at=now_ms(), name=name, role=role, token_sha256=digest
    )  # type: ignore[arg-type]
    await lg.publish(event)
    return token


async def _serve(args: argparse.Namespace, *, embedded: bool) -> int:
    from aiohttp import web

    from gateway.app import make_app
    from gateway.http import GatewayConfig
    from ops.fold_service import FoldService
    from ops.natsd import ROLES, NatsServer
    from ops.tap import Tap, TapConfig

    server = None
    url = args.nats
    data = Path(getattr(args, "data", None) or "./data")
    if embedded and url is None:
        host, port = _hostport(args.nats_listen, 4222)
        server = NatsServer(data / "nats", host, port)
        await server.astart()
        url = server.url
    lg = await Log.connect(url or DEFAULT_NATS, name=f"ppf-{args.cmd}")
    runner = None
    runners: list[web.AppRunner] = []  # more sites to stop (the TLS judge)
    tls_judge: str | None = None
    fold = None
    agent_stop = None
    agent_task = None
    try:
        await lg.ensure_stream()
        local_tokens: dict[str, str] = {}
        if embedded:
            await _configure_lab(lg, args.lab)
            if not args.no_agents:
                # The local worker and checker get fresh tokens at every start, kept in
                # memory only; enrolling again revokes the previous run's tokens.
                for name, role in (("local-worker", "worker"), ("local-checker", "checker")):
                    local_tokens[name] = await enroll(lg, name, role)
                log.info("local_agents_enrolled", agents=sorted(local_tokens))
        db = data / "ppf.duckdb" if args.cmd in ("up", "fold") else None
        if db is not None:
            data.mkdir(parents=True, exist_ok=True)
        tap_config = TapConfig.from_env() if args.cmd in ("up", "fold") else None
        tap = Tap(tap_config) if tap_config is not None else None
        fold = FoldService(lg, db=db, dlq=args.cmd != "gateway", tap=tap)
        await fold.start()
        if args.cmd in ("up", "gateway"):
            host, port = _hostport(args.listen, 8080)
            # The embedded server's role users, offered to agents with their tokens; an
            # external NATS's users are its operator's, so agents there are told --nats.
            agent_nats = {r: server.agent_url(r) for r in ROLES} if server is not None else {}
            config = GatewayConfig(private_queries=args.private_queries, agent_nats=agent_nats)
            runner = web.AppRunner(make_app(fold, lg, config), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
            print(
                f"ppf {args.cmd}: gateway http://{host}:{port}  nats {lg.address}  data {data}",
                flush=True,
            )
            if args.cmd == "up" and args.judge_tls_listen != "off":
                tls_judge = await _serve_tls_judge(args.judge_tls_listen, data / "tls", runners)
        else:
            print(f"ppf fold: nats {lg.address}  db {db}", flush=True)
        log.info("started", role=args.cmd, nats=lg.address)
        if args.cmd == "up":
            # Caught up first: the local agents' tokens must be in the projection before
            # they ask the gateway, and an empty log tells a first start.
            await fold.wait_for(await lg.head_seq(), 30)
            if not args.lab and not fold.state.sources:
                # A first start has work to do, for the local agents or remote ones: the
                # built-in public lists (`ppf sources seed`). A lab starts empty.
                from agents.seeds import SEEDS, source_added

                await lg.publish_many(source_added(dict(SEEDS), "seed"))
                log.info("sources_seeded", count=len(SEEDS))
        if "local-worker" in local_tokens and args.cmd == "up":
            from agents.checker import Checker, CheckerConfig
            from agents.worker import Worker, WorkerConfig

            host, port = _hostport(args.listen, 8080)
            base = f"http://{host}:{port}"
            worker = Worker(
                base,
                local_tokens["local-worker"],
                "local-worker",
                base + "/judge",
                data / "agents" / "local-worker",
                WorkerConfig(lab=args.lab, tls_judge=tls_judge),
            )
            checker = Checker(
                base,
                local_tokens["local-checker"],
                "local-checker",
                base + "/judge",
                data / "agents" / "local-checker",
                CheckerConfig(tls_judge=tls_judge),
            )
            agent_stop = asyncio.Event()
            agent_task = asyncio.gather(worker.run(agent_stop), checker.run(agent_stop))
        # Fewer young-generation collections: every request allocates, and with the
        # default threshold (700) the collector's pauses set the lease p99 (measured in
        # `ppf bench lease`: 78 ms -> 59 ms). The projections themselves are untracked
        # Structs (gc=False), so less frequent collection costs little memory.
        gc.set_threshold(100_000, 50, 1000)
        await _wait_for_signal()
    finally:
        if agent_stop is not None and agent_task is not None:
            agent_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent_task, 15)
        for extra in runners:
            await extra.cleanup()
        if runner is not None:
            await runner.cleanup()
        if fold is not None:
            await fold.stop()
        await lg.close()
        if server is not None:
            await server.astop()
    return 0


async def _serve_tls_judge(listen: str, certs: Path, runners: list[Any]) -> str | None:
    """``/judge`` alone over TLS, for agents that watch tunnels for interception; its URL,
    or None where openssl is missing (checks then see altered pages only)."""
    from aiohttp import web

    from gateway.app import judge
    from ops.tls import judge_context

    ctx = judge_context(certs)
    if ctx is None:
        log.warning("no_tls_judge", reason="openssl not found: apt-get install openssl")
        return None
    host, port = _hostport(listen, 8443)
    app = web.Application()
    app.router.add_get("/judge", judge)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    runners.append(runner)
    try:
        await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    except OSError as exc:  # the port is taken: run on, watching pages only
        log.warning("no_tls_judge", listen=listen, error=repr(exc))
        return None
    url = f"https://{host}:{port}/judge"
    print(f"ppf up: TLS judge {url}", flush=True)
    return url


async def _replay(args: argparse.Namespace) -> int:
    from ops.firehose import Firehose
    from ops.progress import Progress
    from projections import digest
    from projections.replay import replay

    expected = None
    lg = await Log.connect(args.nats)
    head = await lg.head_seq()
    await lg.close()
    to = head if args.to is None else min(args.to, head)
    if args.verify:
        if not args.gateway:
            print("ppf replay: --verify needs --gateway URL", file=sys.stderr)
            return 2
        with urllib.request.urlopen(args.gateway.rstrip("/") + "/v1/stats", timeout=10) as r:
            stats = json.load(r)
        to, expected = int(stats["applied_seq"]), stats["digest"]
    progress = Progress("replay", to)
    folder = await replay(
        Firehose(args.nats).batches(until=to), args.db, on_progress=progress.update
    )
    progress.close()
    seq, dig = folder.state.last_seq, digest(folder.state)
    print(json.dumps({"seq": seq, "digest": dig}))
    if expected is not None and dig != expected:
        print(f"ppf replay: digest differs from the gateway's {expected}", file=sys.stderr)
        return 1
    return 0


async def _tail(args: argparse.Namespace) -> int:
    from ops.firehose import Firehose

    start = args.from_seq
    if start is None:
        lg = await Log.connect(args.nats)
        start = await lg.head_seq() + 1
        await lg.close()
    async for batch in Firehose(args.nats, start).batches():
        for seq, ts, subject, payload in batch:
            try:
                event = decode(payload)
            except DecodeError as exc:
                line = {"seq": seq, "ts": ts, "subject": subject.decode(), "error": str(exc)}
            else:
                if args.type and type(event).__name__ != args.type:
                    continue
                line = {
                    "seq": seq,
                    "ts": ts,
                    "subject": subject.decode(),
                    "event": msgspec.to_builtins(event),
                }
            print(json.dumps(line), flush=True)
    return 0


def _schemas(args: argparse.Namespace) -> int:
    from ops.schemas import generate

    out = Path(args.out)
    stale = []
    for name, text in generate().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path)
    if stale:
        print("out of date (run `ppf schemas`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


async def _token(args: argparse.Namespace) -> int:
    from events import agent_name_ok

    if not agent_name_ok(args.name):
        print(f"ppf token: bad agent name {args.name!r}: 1-64 of A-Z a-z 0-9 _ -", file=sys.stderr)
        return 2
    lg = await Log.connect(args.nats, name="ppf-token")
    try:
        await lg.ensure_stream()
        token = await enroll(lg, args.name, args.role)
    finally:
        await lg.close()
    print(token, flush=True)
    return 0


async def _sources(args: argparse.Namespace) -> int:
    from agents.seeds import SEEDS, source_added

    urls = list(args.urls)
    if args.action == "import":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        urls = [line.strip() for line in text.splitlines() if line.strip()]
        urls = [u for u in urls if not u.startswith("#")]
    hints = dict.fromkeys(urls, args.hint or "")
    if args.action == "seed":
        hints = dict(SEEDS)
        urls = list(hints)
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        print(f"ppf sources: not http(s) URLs: {', '.join(bad[:5])}", file=sys.stderr)
        return 2
    origin = "seed" if args.action == "seed" else "manual"
    events = source_added({u: hints[u] for u in dict.fromkeys(urls)}, origin)
    from ops.progress import Progress

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


def _extract(args: argparse.Namespace) -> int:
    from agents.extract import EXTRACTOR, extract

    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    out = sys.stdout
    for c in extract(data, args.hint, lab=args.lab):
        if args.json:
            row = {"ip": c.ip, "port": c.port, "proto": c.proto, "confidence": c.confidence}
            out.write(json.dumps(row) + "\n")
        else:
            out.write(f"{c}\n")
    log.debug("extracted", extractor=EXTRACTOR, file=args.file)
    return 0


async def _check(args: argparse.Namespace) -> int:
    import dataclasses

    from agents.check import Judge, check_many
    from agents.extract import PROTOS

    targets = []
    for addr in args.addrs:
        scheme, sep, rest = addr.partition("://")
        proto = PROTOS.get(scheme.lower()) if sep else None
        if sep and proto is None:
            print(f"ppf check: unknown protocol in {addr!r}", file=sys.stderr)
            return 2
        host, _, port = (rest if sep else addr).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            print(f"ppf check: not ip:port or proto://ip:port: {addr!r}", file=sys.stderr)
            return 2
        targets.append((host.strip("[]"), int(port), proto or args.proto))
    try:
        judge = await Judge.discover(args.judge, tls_url=args.tls_judge)
    except (OSError, ValueError, TimeoutError) as exc:
        print(f"ppf check: judge {args.judge}: {exc}", file=sys.stderr)
        return 1
    results = await check_many(targets, judge, concurrency=args.concurrency, timeout=args.timeout)
    for r in results:
        if args.json:
            print(json.dumps(dataclasses.asdict(r)))
        elif r.ok:
            print(
                f"{r.addr} ok {r.anonymity or '-'} exit={r.exit_ip} {r.latency_ms}ms"
                + (" MITM" if r.mitm else "")
            )
        else:
            print(f"{r.addr} failed {r.error}")
    return 0 if any(r.ok for r in results) else 1


async def _agent(args: argparse.Namespace) -> int:
    from agents.checker import Checker, CheckerConfig
    from agents.gateway_client import GatewayClient, GatewayError
    from agents.worker import Worker, WorkerConfig

    if args.role == "seed":
        print("ppf agent seed: the seed node is not built yet", file=sys.stderr)
        return 2
    data = Path(args.data)
    try:
        # Only to learn the agent's name: it publishes nothing, so it asks for no NATS.
        outbox = data / "outbox.jsonl"
        async with GatewayClient(args.gateway, args.token, "", outbox, http_only=True) as gw:
            me = await gw.whoami()
    except (GatewayError, OSError) as exc:
        print(f"ppf agent: {exc}", file=sys.stderr)
        return 1
    judge = args.judge or args.gateway.rstrip("/") + "/judge"
    agent: Worker | Checker
    if args.role == "worker":
        config = WorkerConfig(
            lab=args.lab,
            upstream=args.upstream,
            batch=args.batch,
            check_timeout_s=args.check_timeout,
            nats=args.nats,
            http_only=args.http_only,
            tls_judge=args.tls_judge,
        )
        agent = Worker(args.gateway, args.token, me["name"], judge, data / me["name"], config)
    else:
        checks = CheckerConfig(
            check_timeout_s=args.check_timeout,
            nats=args.nats,
            http_only=args.http_only,
            tls_judge=args.tls_judge,
        )
        agent = Checker(args.gateway, args.token, me["name"], judge, data / me["name"], checks)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("agent_started", agent=me["name"], role=me["role"], gateway=args.gateway)
    try:
        await agent.run(stop)
    except (OSError, ValueError, TimeoutError) as exc:  # the judges, asked at start
        print(f"ppf agent: cannot start: {exc!r}", file=sys.stderr)
        return 1
    return 0


async def _bench(args: argparse.Namespace) -> int:
    from ops.bench import bench_fold, print_fold
    from ops.bench_gateway import bench_lease, bench_query

    match args.what:
        case "fold":
            result = await bench_fold(args.events, args.proxies, args.seed, args.nats)
        case "lease":
            result = await bench_lease(args.clients, args.seconds, count=args.count)
        case "query":
            result = await bench_query(args.proxies)
        case "extract":
            from ops.bench_extract import bench_extract

            result = bench_extract(args.mb, args.seed)
        case "check":
            from ops.bench_check import bench_check

            result = await bench_check(args.checks, tls=args.tls)
        case _:
            print(f"ppf bench {args.what}: not built yet (see the open issues)", file=sys.stderr)
            return 2
    print_fold(result, args.json)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppf", description="open proxy discovery fleet")
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="the whole system on one machine")
    up.add_argument("--data", default="./data")
    up.add_argument("--listen", default="127.0.0.1:8080", type=_listen)
    up.add_argument("--nats-listen", default="127.0.0.1:4222", type=_listen)
    up.add_argument("--nats", default=None, help="use this NATS; start none")
    up.add_argument("--no-agents", action="store_true")
    up.add_argument("--lab", action="store_true", help="accept loopback and private addresses")
    up.add_argument("--private-queries", action="store_true", help="queries need a token")
    up.add_argument(
        "--judge-tls-listen",
        default="127.0.0.1:8443",
        help="the judge over TLS (self-signed, pinned by agents); 'off' for none",
    )

    gw = sub.add_parser("gateway", help="the HTTP gateway alone")
    gw.add_argument("--nats", default=DEFAULT_NATS)
    gw.add_argument("--listen", default="127.0.0.1:8080", type=_listen)
    gw.add_argument("--private-queries", action="store_true", help="queries need a token")

    fo = sub.add_parser("fold", help="the fold alone: projections to DuckDB, DLQ")
    fo.add_argument("--nats", default=DEFAULT_NATS)
    fo.add_argument("--data", default="./data")

    rp = sub.add_parser("replay", help="rebuild projections from the log")
    rp.add_argument("--db", required=True)
    rp.add_argument("--to", type=int, default=None)
    rp.add_argument("--verify", action="store_true")
    rp.add_argument("--gateway", default=None)
    rp.add_argument("--nats", default=DEFAULT_NATS)

    tl = sub.add_parser("tail", help="print live events")
    tl.add_argument("--type", default=None)
    tl.add_argument("--from", dest="from_seq", type=int, default=None)
    tl.add_argument("--nats", default=DEFAULT_NATS)

    sc = sub.add_parser("schemas", help="write the generated schemas")
    sc.add_argument("--check", action="store_true", help="fail when the files differ")
    sc.add_argument("--out", default=str(REPO / "schemas"))

    tk = sub.add_parser("token", help="agent tokens")
    tk_sub = tk.add_subparsers(dest="action", required=True)
    issue = tk_sub.add_parser("issue", help="enroll an agent; prints its token once")
    issue.add_argument("name")
    issue.add_argument("--role", required=True, choices=["worker", "checker", "seed", "admin"])
    issue.add_argument("--nats", default=DEFAULT_NATS)

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

    ex = sub.add_parser("extract", help="proxy candidates in a list, one a line")
    ex.add_argument("file", help="a file, or - for stdin")
    ex.add_argument("--hint", default=None, help="protocol of the list (http, socks4, socks5)")
    ex.add_argument("--json", action="store_true")
    ex.add_argument("--lab", action="store_true", help="accept loopback and private addresses")

    ag = sub.add_parser("agent", help="run an agent against a gateway")
    ag.add_argument("role", choices=["worker", "checker", "seed"])
    ag.add_argument("--gateway", required=True)
    ag.add_argument("--token", required=True)
    ag.add_argument(
        "--nats", default=None, help="publish here (default: the URL the gateway offers the role)"
    )
    ag.add_argument(
        "--http-only", action="store_true", help="publish through POST /v1/events, never NATS"
    )
    ag.add_argument("--upstream", default=None, help="socks5://127.0.0.1:9050 for Tor")
    ag.add_argument("--judge", default=None, help="default: the gateway's /judge")
    ag.add_argument(
        "--tls-judge", default=None, help="https://host:port/judge: tunnels are checked for MITM"
    )
    ag.add_argument("--lab", action="store_true", help="fetch and check private addresses")
    ag.add_argument("--data", default="./data/agents", help="outbox directory")
    ag.add_argument("--batch", type=int, default=5, help="sources leased a cycle")
    ag.add_argument("--check-timeout", type=float, default=10.0)

    ck = sub.add_parser("check", help="check proxies through a judge, one result a line")
    ck.add_argument("addrs", nargs="+", metavar="ADDR", help="ip:port or proto://ip:port")
    ck.add_argument("--judge", required=True, help="http://host:port/judge")
    ck.add_argument(
        "--tls-judge", default=None, help="https://host:port/judge: tunnels are checked for MITM"
    )
    ck.add_argument("--proto", default=None, choices=["http", "https", "socks4", "socks5"])
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--concurrency", type=int, default=500)
    ck.add_argument("--timeout", type=float, default=10.0)

    bn = sub.add_parser("bench", help="benchmarks")
    bn.add_argument("what", choices=["fold", "lease", "query", "extract", "check", "pool"])
    bn.add_argument("--events", type=int, default=1_000_000)
    bn.add_argument("--proxies", type=int, default=100_000)
    bn.add_argument("--seed", type=int, default=1)
    bn.add_argument("--clients", type=int, default=50, help="lease: concurrent agents")
    bn.add_argument("--seconds", type=float, default=10.0, help="lease: how long")
    bn.add_argument("--count", type=int, default=1, help="lease: targets per request")
    bn.add_argument("--mb", type=int, default=30, help="extract: size of the dense list")
    bn.add_argument("--checks", type=int, default=10_000, help="check: how many")
    bn.add_argument("--tls", action="store_true", help="check: tunnels carry TLS to a pinned judge")
    bn.add_argument("--nats", default=None)
    bn.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure()
    if getattr(args, "nats", None) and args.cmd != "agent":  # agents use their role's user
        from ops.natsd import with_credentials

        data = Path(getattr(args, "data", None) or os.environ.get("PPF_DATA", "./data"))
        args.nats = with_credentials(args.nats, data / "nats")
    try:
        match args.cmd:
            case "up":
                return asyncio.run(_serve(args, embedded=True))
            case "gateway" | "fold":
                return asyncio.run(_serve(args, embedded=False))
            case "replay":
                return asyncio.run(_replay(args))
            case "tail":
                return asyncio.run(_tail(args))
            case "schemas":
                return _schemas(args)
            case "extract":
                return _extract(args)
            case "check":
                return asyncio.run(_check(args))
            case "agent":
                return asyncio.run(_agent(args))
            case "bench":
                return asyncio.run(_bench(args))
            case "token":
                return asyncio.run(_token(args))
            case "sources":
                args.urls = getattr(args, "urls", [])
                return asyncio.run(_sources(args))
    except LogError as exc:
        print(f"ppf {args.cmd}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ppf extract big.txt | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
