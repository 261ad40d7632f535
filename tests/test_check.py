"""Checks through real proxies (Debian's squid, tinyproxy, microsocks, dante) on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agents.check import Judge, check, check_many
from gateway.guard import listen
from ops.lab.testbed import ProxyLab, self_signed
from ops.nats.server import free_port
from tests.helpers import ppf_judge_app


@contextlib.asynccontextmanager
async def _judge_server(key: Path, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """The judge's URL on a free port, listening as ppf's judge does (gateway/guard.py),
    answering the operator's nonces made with ``key``."""
    app, _ = ppf_judge_app(key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = None
    try:
        site = await listen(runner, "127.0.0.1", port, tls)
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/judge"
    finally:
        await runner.cleanup()
        if site is not None:
            await _connections_closed(site)


async def _connections_closed(site: web.TCPSite, within_s: float = 5.0) -> None:
    """Wait for the judge's connections to end after its cleanup. A tunnel's TLS
    connection to it (through dante, say) ends only once the proxy passes its client's
    close on; one still open when the test's loop closes was left unclosed (a
    ResourceWarning, one CI run in five). asyncio's server counts its open transports,
    and on Python 3.11 has no public way to close or await them."""
    server = site._server
    deadline = time.monotonic() + within_s
    while getattr(server, "_active_count", 0) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _judge(tmp_path: Path, *, tls: bool) -> AsyncIterator[Judge]:
    """The judge alone, or with its TLS twin (tunnels then carry TLS to it)."""
    async with contextlib.AsyncExitStack() as stack:
        key = tmp_path / "judge.key"  # the data dir's judge secret (--data tmp_path)
        plain = await stack.enter_async_context(_judge_server(key))
        tls_url = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            (tmp_path / "tls").mkdir(exist_ok=True)  # its certificate's judge.key is not ours
            ctx.load_cert_chain(*self_signed(tmp_path / "tls", "judge"))
            tls_url = await stack.enter_async_context(_judge_server(key, ctx))
        _, signer = ppf_judge_app(key)
        yield await Judge.discover(plain, tls_url=tls_url, signer=signer)


@pytest.fixture(params=["plain", "tls"])
async def judge(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Judge]:
    async with _judge(tmp_path, tls=request.param == "tls") as j:
        yield j


@pytest.fixture
async def tls_judge(tmp_path: Path) -> AsyncIterator[Judge]:
    async with _judge(tmp_path, tls=True) as j:
        yield j


async def test_every_real_proxy_is_found_with_its_protocol_anonymity_and_exit(
    lab: ProxyLab, judge: Judge
) -> None:
    """Each lab proxy is confirmed with its protocol, anonymity and exit; fakes never."""
    assert judge.own_ip == "127.0.0.1"
    for proxy in lab.proxies:
        result = await check("127.0.0.1", proxy.port, None, judge, timeout=3)
        if proxy.proto is None:  # closed, tarpit, garbage: never a proxy
            assert not result.ok, (proxy.name, result)
            continue
        assert result.ok, (proxy.name, result.error)
        assert (result.proto, result.anonymity, result.exit_ip) == (
            proxy.proto,
            proxy.anonymity,
            proxy.exit_ip,
        ), proxy.name
        # An altered page shows to any judge; a replaced certificate only to a TLS one.
        seen = proxy.mitm == "body" or (proxy.mitm == "tls" and judge.tls is not None)
        assert result.mitm == seen, proxy.name
        assert result.latency_ms >= 0


async def test_tls_interception_is_told_by_the_certificate(lab: ProxyLab, tls_judge: Judge) -> None:
    """Through the interceptor the page is intact; only the pinned certificate differs."""
    judge = tls_judge
    assert judge.tls is not None and len(judge.tls.pin) == 64
    mitm = next(p for p in lab.proxies if p.name == "mitm-tls")
    squid = next(p for p in lab.proxies if p.name == "squid")
    dante = next(p for p in lab.proxies if p.name == "dante")
    intercepted = await check("127.0.0.1", mitm.port, "https", judge, timeout=3)
    assert intercepted.ok and intercepted.mitm and intercepted.exit_ip == "127.0.0.7"
    for honest in (
        await check("127.0.0.1", squid.port, "https", judge, timeout=3),  # CONNECT
        await check("127.0.0.1", dante.port, "socks5", judge, timeout=3),
    ):
        assert honest.ok and not honest.mitm, honest


async def test_explicit_protocols_and_socks4_on_dante(lab: ProxyLab, judge: Judge) -> None:
    """A protocol given with the address is checked as given, SOCKS4 included."""
    dante = next(p for p in lab.proxies if p.name == "dante")
    socks4 = await check("127.0.0.1", dante.port, "socks4", judge, timeout=3)
    assert socks4.ok and socks4.exit_ip == "127.0.0.6"
    squid = next(p for p in lab.proxies if p.name == "squid")
    wrong = await check("127.0.0.1", squid.port, "socks5", judge, timeout=3)
    assert not wrong.ok and wrong.error


@pytest.mark.serial
async def test_tarpit_costs_one_timeout_and_many_run_at_once(lab: ProxyLab, judge: Judge) -> None:
    """A tarpit costs one timeout while the other checks run at the same time."""
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    targets = [("127.0.0.1", p.port, p.proto) for p in lab.proxies] * 20
    targets += [("127.0.0.1", tarpit.port, None)] * 20
    started = time.monotonic()
    results = await check_many(targets, judge, concurrency=500, timeout=1.5)
    assert time.monotonic() - started < 6  # one timeout wide, not one per tarpit
    by_port = {p.port: p for p in lab.proxies}
    for (_, port, _), result in zip(targets, results, strict=True):
        assert result.ok == (by_port[port].proto is not None), (by_port[port].name, result)


async def test_five_thousand_at_once(lab: ProxyLab, tmp_path: Path) -> None:
    """The bench's 5,000 concurrent checks, for correctness: every one answered, right,
    in input order (their speed and memory are `ppf bench check`'s to measure)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 12_000:
        pytest.skip(f"needs 12,000 open files (ulimit -n); the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    working = [p for p in lab.proxies if p.name in ("squid", "microsocks", "dante")]
    targets = [("127.0.0.1", working[i % 3].port, working[i % 3].proto) for i in range(5_000)]
    try:
        async with _judge(tmp_path, tls=False) as judge:
            results = await check_many(targets, judge, concurrency=5_000, timeout=30)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    failed = [(i, r.error) for i, r in enumerate(results) if not r.ok]
    assert not failed, failed[:5]
    exits = {p.port: p.exit_ip for p in working}
    assert [r.exit_ip for r in results] == [exits[port] for _, port, _ in targets]


async def test_ppf_check_command(lab: ProxyLab, judge: Judge, ppf_bin: str, tmp_path: Path) -> None:
    """`ppf check` checks exactly what it is given, loopback included; --json per line;
    it asks ppf's judge with the operator's nonces from the data dir's key (--data)."""
    import json

    squid = next(p for p in lab.proxies if p.name == "squid")
    micro = next(p for p in lab.proxies if p.name == "microsocks")
    closed = next(p for p in lab.proxies if p.name == "closed")
    url = f"http://{judge.host}:{judge.port}{judge.path}"
    proc = await asyncio.create_subprocess_exec(
        ppf_bin,
        "check",
        f"127.0.0.1:{squid.port}",
        f"socks5://127.0.0.1:{micro.port}",
        f"127.0.0.1:{closed.port}",
        "--judge",
        url,
        "--json",
        "--timeout",
        "3",
        "--data",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["ok"], r["proto"], r["anonymity"]) for r in rows] == [
        (True, "http", "transparent"),
        (True, "socks5", "elite"),
        (False, None, ""),
    ]
    assert set(rows[0]) == {
        "addr",
        "ok",
        "proto",
        "anonymity",
        "exit_ip",
        "latency_ms",
        "mitm",
        "error",
    }


async def test_ppf_check_explain_tells_each_step(
    lab: ProxyLab, judge: Judge, ppf_bin: str, tmp_path: Path
) -> None:
    """`ppf check --explain --json`: for a working proxy every step passed, with its exit
    and anonymity; for a closed port the connect failed and the verdict says why."""
    import json

    squid = next(p for p in lab.proxies if p.name == "squid")
    closed = next(p for p in lab.proxies if p.name == "closed")
    argv = [ppf_bin, "check", f"127.0.0.1:{squid.port}", f"http://127.0.0.1:{closed.port}"]
    argv += ["--judge", f"http://{judge.host}:{judge.port}{judge.path}", "--explain", "--json"]
    argv += ["--timeout", "3", "--data", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    ok, dead = (json.loads(line) for line in out.splitlines())
    assert ok["verdict"] == "passed" and dead["verdict"] == "failed"
    steps = {s["step"]: s for s in ok["steps"]}
    assert steps["exit address"]["outcome"] == "passed" and steps["anonymity"]["why"]
    assert all(s["outcome"] in ("passed", "skipped") for s in ok["steps"])
    failed = [s for s in dead["steps"] if s["outcome"] == "failed"]
    assert failed[0]["step"] == "http: connect" and "Connection" in failed[0]["why"]
