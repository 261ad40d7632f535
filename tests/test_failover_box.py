"""The fleet through a NATS node's and a gateway's death, in the world in a box: three
nats-server nodes (`ppf up --cluster 3`, its gateway), a second `ppf gateway` on all
three, and a real worker and checker that know both gateways."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

import events as ev
from agents.checker import CheckerConfig
from eventlog.client import Log
from eventlog.stream import Firehose
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port, with_credentials
from tests.test_cli import Up, _get

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

# The agents' leases are the default 300 s. An agent asks a gateway at least every third
# of that, and sooner when it has no work (the checker's idle wait, 30 s, is the longest):
# they move off a dead gateway within that and a margin, well within a lease TTL.
MOVED_WITHIN_S = CheckerConfig().idle_wait_s + 5


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with World(tmp_path_factory.mktemp("world-failover")) as w:
        yield w


async def _run(*cmd: str) -> str:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, cmd
    return out.decode().strip()


def _spawn(
    cmd: list[str], logfile: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(logfile, "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)


def _status(url: str) -> int:
    try:
        return _get(url)[0]
    except OSError:  # not listening yet
        return 0


async def _until(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(cond):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.5)


async def _probe(
    base: str, token: str, grants: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    """A third checker asking for one shard every 0.3 s and giving it back at once,
    uncounted: when grants stop and start again."""
    body = {"agent": "c9", "kind": "recheck", "count": 1, "ttl_s": 30}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        while not stop.is_set():
            status = 0
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(
                    base + "/v1/leases", json=body, timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    status = r.status
                    leases = (await r.json()).get("leases", []) if r.status == 200 else []
                for g in leases:
                    async with http.post(
                        f"{base}/v1/leases/{g['lease']}/release",
                        json={"outcome": "abandoned", "counted": False},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ):
                        pass
                status = status if leases or status != 200 else 204  # 200, but none free
            grants.append((time.monotonic(), status))
            await asyncio.sleep(0.3)


def _node(name: str, port: int) -> tuple[int, list[str], dict[str, str]]:
    """The nats-server process of node ``name`` on ``port``: pid, command, environment
    (its store and secrets come through the environment)."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            cmd = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            if cmd and cmd[0].endswith("nats-server") and name in cmd and str(port) in cmd:
                raw = (proc / "environ").read_bytes().split(b"\0")
                env = dict(e.decode().split("=", 1) for e in raw if b"=" in e)
                return int(proc.name), cmd, env
    raise AssertionError(f"no nats-server {name} on {port}")


async def _audit(url: str) -> tuple[list[tuple[str, str, str]], list[str], list[str]]:
    """From the log: leases granted over a live one (target, held, new), the ids of
    every observation as often as they are stored, and the agents' leases never
    released (a lease an agent lost is refused its release, which the log never sees)."""
    lg = await Log.connect(url)
    head = await lg.head_seq()
    await lg.close()
    live: dict[str, tuple[str, int]] = {}
    ttl: dict[str, int] = {}
    overlaps, ids = [], []
    held_by_agents: set[str] = set()
    async for batch in Firehose(url).batches(until=head):
        for _seq, ts, _subject, payload in batch:
            event = ev.decode(payload)
            if isinstance(event, ev.Leased):
                held = live.get(event.target)
                if held is not None and ts <= held[1]:
                    overlaps.append((event.target, held[0], event.lease))
                live[event.target] = (event.lease, ts + event.ttl_s * 1000)
                ttl[event.lease] = event.ttl_s * 1000
                if event.agent in ("w1", "c1"):
                    held_by_agents.add(event.lease)
            elif isinstance(event, ev.Heartbeat):
                for target, (lease, _) in list(live.items()):
                    if lease in event.leases:
                        live[target] = (lease, ts + ttl[lease])
            elif isinstance(event, ev.Released):
                held_by_agents.discard(event.lease)
                if live.get(event.target, ("",))[0] == event.lease:
                    del live[event.target]
            elif isinstance(event, ev.ProxiesChecked | ev.ProxyWorked | ev.ProxyFailed):
                ids.append(event.id)
    return overlaps, ids, sorted(held_by_agents)


@pytest.mark.timeout(420)
async def test_a_nats_node_and_a_gateway_killed_while_the_fleet_works(
    world: World, ppf_bin: str, tmp_path: Path
) -> None:
    """kill -9 of the stream leader's node while a worker and a checker work through the
    second gateway: grants resume within 15 s, and once it is back both gateways have
    a fresh replay's digest. Then kill -9 of that gateway: the agents move to the other
    within their longest wait between asks (well within a lease TTL), losing no lease.
    Through both: every observation stored once, the agents' outboxes emptied, no lease
    granted over a live one."""
    judge_port = free_port()
    up = Up(
        ppf_bin, tmp_path / "data", "--no-agents", "--no-seed", "--cluster", "3",
        *("--judge", world.judges["httpbin"], "--judge", world.judges["azenv"]),
        *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
        *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
        *("--https-target", world.https_url),
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    await asyncio.to_thread(up.start)
    try:
        try:
            nodes = (tmp_path / "data" / "nats" / "listen").read_text().strip()
            service = with_credentials(nodes, tmp_path / "data" / "nats")
            g2_port = free_port()
            g2 = f"http://127.0.0.1:{g2_port}"
            g2_cmd = [
                ppf_bin, "gateway", "--nats", service, "--listen", f"127.0.0.1:{g2_port}",
                "--judge-key", str(tmp_path / "data" / "judge.key"),
            ]  # fmt: skip
            procs.append(_spawn(g2_cmd, tmp_path / "g2.log"))
            await _until("the second gateway", lambda: _status(g2 + "/readyz") == 200, 60)
            tokens = {
                name: await _run(ppf_bin, "token", "issue", name, "--role", role, "--nats", up.nats)
                for name, role in (("w1", "worker"), ("c1", "checker"), ("c9", "checker"))
            }
            await _run(ppf_bin, "sources", "add", world.page_url, "--nats", up.nats)
            judges = ("--judge", world.judges["httpbin"], "--judge", world.judges["azenv"])
            for name in ("w1", "c1"):
                role = "worker" if name == "w1" else "checker"
                cmd = [
                    ppf_bin, "agent", role, "--gateway", f"{g2},{up.base}",
                    f"--token={tokens[name]}", *judges, "--https-target", world.https_url,
                    "--data", str(tmp_path / name),
                ]  # fmt: skip
                procs.append(_spawn(cmd, tmp_path / f"{name}.log"))
            real = {f"{p.addr}:{p.port}" for p in world.proxies}

            def known() -> set[str]:  # a new worker's finds wait for a check to be served
                status, body = _get(up.base + "/v1/proxies?limit=0&status=all&mitm=any")
                rows = body["proxies"] if status == 200 else []
                return {f"{p['ip']}:{p['port']}" for p in rows}

            await _until("the world's proxies found", lambda: known() == real, 120)

            # A NATS node: the stream's leader.
            lg = await Log.connect(service)
            leader = (await lg.js.stream_info(ev.STREAM)).cluster.leader  # type: ignore[union-attr]
            await lg.close()
            index = int(str(leader).rsplit("-", 1)[1])
            port = int(nodes.split(",")[index - 1].rsplit(":", 1)[1])
            pid, cmdline, env = _node(str(leader), port)
            grants: list[tuple[float, int]] = []
            stop = asyncio.Event()
            probe = asyncio.create_task(_probe(up.base, tokens["c9"], grants, stop))
            try:
                await asyncio.sleep(3)
                killed = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                await _until(
                    "grants after the node's death",
                    lambda: any(t > killed + 0.5 and s == 200 for t, s in grants),
                    30,
                )
                back = min(t for t, s in grants if t > killed + 0.5 and s == 200)
                print(f"grants resumed {back - killed:.1f} s after the node's kill -9")
                assert back - killed <= 15, f"grants resumed {back - killed:.1f} s after the kill"
                # The same store, the same ports: it catches up from its peers.
                procs.append(_spawn(cmdline, tmp_path / "node-again.log", env))
                await asyncio.sleep(8)
            finally:
                stop.set()
                await probe
            assert 500 not in {s for _, s in grants}  # 503 while the cluster elects, never 500
            for base in (up.base, g2):
                verify = await asyncio.create_subprocess_exec(
                    ppf_bin, "replay", "--db", str(tmp_path / f"r{base[-5:]}.duckdb"),
                    "--verify", "--gateway", base, "--nats", service,
                    stdout=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                assert await asyncio.wait_for(verify.wait(), 120) == 0, f"{base}: digest differs"

            # The gateway the agents use.
            procs[0].kill()
            procs[0].wait()
            gone = time.monotonic()
            logs = [tmp_path / "w1.log", tmp_path / "c1.log"]

            def moved() -> bool:
                return all(b"gateway_failover" in path.read_bytes() for path in logs)

            await _until("both agents on the other gateway", moved, MOVED_WITHIN_S)
            print(f"both agents moved within {time.monotonic() - gone:.1f} s of the gateway's")
            assert time.monotonic() - gone <= MOVED_WITHIN_S
        finally:
            for proc in procs[1:]:  # the agents give their leases back as they stop
                proc.terminate()
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(20)
                if proc.poll() is None:
                    proc.kill()
        await asyncio.to_thread(up.caught_up, 60)
        overlaps, ids, unreleased = await _audit(service)
    finally:
        code = await asyncio.to_thread(up.stop)
        if up.proc is not None:  # never a node left behind, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.proc.pid, signal.SIGKILL)
    assert code == 0
    assert overlaps == [], overlaps[:3]
    assert unreleased == [], unreleased  # every lease the agents held was theirs to the end
    assert ids and len(ids) == len(set(ids))  # none stored twice
    for name in ("w1", "c1"):  # what they could not send went out after the failover
        outbox = tmp_path / name / "outbox.jsonl"
        assert not outbox.exists() or not outbox.read_text().strip(), name
