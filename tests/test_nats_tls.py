"""NATS over TLS with a CA of the test's own, and several URLs: the log client, the fold
(whose lean reader hands over to nats-py's ordered consumer over TLS: the two readers
give the same messages), and the commands that take ``--nats-ca``."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.client import Log, LogError, NatsTls
from eventlog.ordered import ordered_batches
from eventlog.protocol import SnapshotError
from eventlog.stream import Firehose
from ops.lab.tls import nats_certs
from ops.nats.server import NatsServer, ServerTls, free_port
from projections import Folder, digest
from projections.live import FoldService
from tests.helpers import worked


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[NatsServer, dict[str, str]]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found: apt-get install openssl")
    certs = nats_certs(tmp_path / "certs")
    tls = ServerTls(cert=certs["cert"], key=certs["key"], ca=certs["ca"], verify=True)
    server = NatsServer(tmp_path / "nats", port=free_port(), tls=tls)
    server.start()
    try:
        yield server, certs
    finally:
        server.stop()


async def test_the_fold_reads_a_tls_cluster_url_list_to_the_same_digest(
    tls_server: tuple[NatsServer, dict[str, str]],
) -> None:
    """Over TLS with a client certificate, through a URL list whose first node is down:
    published, folded by a FoldService (the ordered consumer), to the digest of the same
    messages folded in memory. Without the client certificate, or without TLS, refused."""
    server, certs = tls_server
    mine = NatsTls(ca=certs["ca"], cert=certs["client"], key=certs["client_key"])
    dead = f"tls://127.0.0.1:{free_port()}"
    urls = f"{dead},{server.url}"
    with pytest.raises(LogError):
        await Log.connect(server.url, tls=NatsTls(ca=certs["ca"]), timeout=3)
    with pytest.raises(LogError):
        await Log.connect(server.url.replace("tls://", "nats://"), timeout=3)
    lg = await Log.connect(urls, tls=mine)
    try:
        await lg.ensure_stream()
        for i in range(300):
            await lg.publish(worked(f"45.9.{i // 200}.{i % 200 + 1}"))
        fold = FoldService(lg)
        await fold.start()
        try:
            assert await fold.wait_for(300, 20)
            seen = [m async for batch in ordered_batches(lg.js, 1, 300) for m in batch]
            alone = Folder(type(fold.state)())
            alone.apply(seen)
            assert [m[0] for m in seen] == list(range(1, 301))
            assert digest(alone.state) == digest(fold.state)
        finally:
            await fold.stop()
    finally:
        await lg.close()


async def test_the_ordered_consumer_hands_the_fold_what_the_lean_reader_does(
    log_client: Log,
) -> None:
    """On one plain stream, both readers give the same (seq, server ms, subject,
    payload) for every message, from the middle of the stream to a given end."""
    for i in range(500):
        await log_client.publish(worked(f"45.8.{i // 200}.{i % 200 + 1}"))
    lean = [m async for b in Firehose(log_client.url, 123).batches(until=480) for m in b]
    ordered = [m async for b in ordered_batches(log_client.js, 123, 480) for m in b]
    assert lean == ordered and len(lean) == 358


async def test_ppf_snapshot_takes_the_ca_and_several_urls(
    tls_server: tuple[NatsServer, dict[str, str]], ppf_bin: str
) -> None:
    """A command given ``--nats A,B --nats-ca --nats-cert --nats-key`` reaches the
    server over TLS (``ppf snapshot``: an empty log's snapshot at seq 0)."""
    server, certs = tls_server
    lg = await Log.connect(
        server.url, tls=NatsTls(certs["ca"], certs["client"], certs["client_key"])
    )
    await lg.ensure_stream()
    await lg.close()
    done = await asyncio.to_thread(
        subprocess.run,
        [ppf_bin, "snapshot", "--nats", f"tls://127.0.0.1:{free_port()},{server.url}",
         "--nats-ca", certs["ca"], "--nats-cert", certs["client"],
         "--nats-key", certs["client_key"]],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["seq"] == 0


async def _published(url: str, tls: NatsTls, count: int) -> None:
    lg = await Log.connect(url, tls=tls)
    try:
        await lg.ensure_stream()
        for i in range(count):
            await lg.publish(worked(f"45.7.{i // 200}.{i % 200 + 1}"))
    finally:
        await lg.close()


@pytest.mark.timeout(240)
def test_ppf_fold_and_gateway_over_tls_with_several_urls(
    tls_server: tuple[NatsServer, dict[str, str]], ppf_bin: str, tmp_path: Path
) -> None:
    """`ppf fold` and `ppf gateway`, each given a URL list (first node down) and the CA
    and client certificate, fold the log; `ppf replay --verify` over TLS agrees with the
    gateway's digest; the fold's checkpoint, after SIGTERM, holds the same digest."""
    import signal
    import time
    import urllib.request

    from projections import Store

    server, certs = tls_server
    mine = NatsTls(ca=certs["ca"], cert=certs["client"], key=certs["client_key"])
    asyncio.run(_published(server.url, mine, 200))
    urls = f"tls://127.0.0.1:{free_port()},{server.url}"
    tls_args = ["--nats-ca", certs["ca"], "--nats-cert", certs["client"], "--nats-key",
                certs["client_key"]]  # fmt: skip
    port = free_port()
    log = open(tmp_path / "procs.log", "ab")  # noqa: SIM115
    fold = subprocess.Popen(
        [ppf_bin, "fold", "--nats", urls, "--data", str(tmp_path / "data"), *tls_args],
        stdout=log, stderr=log,
    )  # fmt: skip
    gateway = subprocess.Popen(
        [ppf_bin, "gateway", "--nats", urls, "--listen", f"127.0.0.1:{port}", *tls_args],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        stats: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/stats", timeout=2) as r:
                    stats = json.load(r)
                seqs = (stats["applied_seq"], stats["head_seq"], stats["digest_seq"])
                if seqs[0] == seqs[1] == seqs[2] and int(str(seqs[0])) >= 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert stats.get("digest_seq") == stats.get("head_seq"), (
            tmp_path / "procs.log"
        ).read_text()[-3000:]
        replay = subprocess.run(
            [ppf_bin, "replay", "--db", str(tmp_path / "r.duckdb"), "--verify", "--gateway",
             f"http://127.0.0.1:{port}", "--nats", urls, *tls_args],
            capture_output=True, timeout=120,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr.decode()[-2000:]
        for proc in (fold, gateway):
            proc.send_signal(signal.SIGTERM)
        assert fold.wait(10) == 0 and gateway.wait(10) == 0
        store = Store(tmp_path / "data" / "ppf.duckdb")
        try:
            assert digest(store.restore()) == stats["digest"]
        finally:
            store.close()
    finally:
        for proc in (fold, gateway):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.close()


async def test_bench_read_reads_every_message_three_ways() -> None:
    """`ppf bench read`, small: each reader (lean in plain, nats-py in plain, the fold's
    over TLS) took every message (it raises otherwise), and the ratios are its rates'."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found: apt-get install openssl")
    from ops.bench.options import Read
    from ops.bench.read import bench_read

    out = await bench_read(Read(messages=3_000, runs=1))
    assert out["messages"] == 3_000
    rates = {k: out[f"{k}_per_s"] for k in ("lean_plain", "nats_py_plain", "fold_reader_tls")}
    assert all(r > 0 for r in rates.values())
    assert abs(out["tls_vs_lean_plain"] - rates["fold_reader_tls"] / rates["lean_plain"]) < 0.01


async def test_over_tls_a_snapshot_object_that_lies_is_unusable(
    tls_server: tuple[NatsServer, dict[str, str]],
) -> None:
    """Over TLS the snapshot is read by nats-py, which checks the object's digest: one
    whose meta was rewritten is an unusable snapshot (the fold passes over it), as
    through the lean reader, not an error that stops the fold."""
    server, certs = tls_server
    lg = await Log.connect(
        server.url, tls=NatsTls(ca=certs["ca"], cert=certs["client"], key=certs["client_key"])
    )
    try:
        await lg.ensure_stream()
        await lg.snapshots.put(5, bytes(range(256)) * 4_000)
        assert await lg.snapshots.get(5) == bytes(range(256)) * 4_000
        store = await lg.js.object_store("ppf-snapshots")
        info = (await store.get_info(f"{5:012d}")).as_dict()
        info["digest"] = "SHA-256=" + base64.urlsafe_b64encode(bytes(32)).decode()
        meta = "$O.ppf-snapshots.M." + base64.urlsafe_b64encode(f"{5:012d}".encode()).decode()
        await lg.js.publish(meta, json.dumps(info).encode(), headers={"Nats-Rollup": "sub"})
        with pytest.raises(SnapshotError, match=f"snapshot {5:012d}"):
            await lg.snapshots.get(5)
    finally:
        await lg.close()
