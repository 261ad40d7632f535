"""The log client and the firehose against a real nats-server."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest
from nats.js.api import DiscardPolicy, StorageType, StoreCompression, StreamConfig

import events as ev
from eventlog import stream
from eventlog.client import ConflictError, Log, fresh_id
from eventlog.stream import Firehose
from events.subjects import MAX_MESSAGE
from ops.nats.server import NatsServer
from tests.helpers import worked


async def test_stream_is_created_idempotently_with_the_contracted_settings(log_client: Log) -> None:
    """Stream PPF is created once with the contract's settings."""
    await log_client.ensure_stream()
    await log_client.ensure_stream()
    info = await log_client.js.stream_info(ev.STREAM)
    assert info.config.subjects == list(ev.LOG_SUBJECTS)  # the DLQ apart
    dlq = await log_client.js.stream_info(ev.DLQ_STREAM)
    assert dlq.config.subjects == ["ppf.dlq.>"] and dlq.config.max_bytes > 0
    assert dlq.config.discard == DiscardPolicy.OLD  # bounded: its oldest entries go first
    assert info.config.storage == StorageType.FILE
    assert info.config.compression == StoreCompression.NONE  # eventlog/client.py: why
    assert info.config.allow_direct
    assert info.config.duplicate_window is not None and info.config.duplicate_window >= 120


async def test_same_event_published_twice_is_stored_once(log_client: Log) -> None:
    """A re-published event id is stored once (Nats-Msg-Id)."""
    event = worked()
    first = await log_client.publish(event)
    again = await log_client.publish(event)
    assert (again.seq, again.duplicate, first.duplicate) == (first.seq, True, False)
    assert await log_client.head_seq() == first.seq


async def test_publish_many_keeps_order_and_dedups(log_client: Log) -> None:
    """Pipelined publishing keeps input order and deduplicates ids."""
    batch = [worked(f"8.8.{i // 250}.{i % 250 + 1}") for i in range(2000)]
    seqs = await log_client.publish_many(batch)
    assert seqs == list(range(1, 2001))
    assert await log_client.publish_many(batch[:10]) == seqs[:10]
    assert await log_client.head_seq() == 2000


async def test_compare_and_set_conflict_is_typed(log_client: Log) -> None:
    """A lost compare-and-set raises ConflictError."""
    claim = ev.Leased(
        id=fresh_id(), agent="w1", at=0, lease="l1", kind="source", target="t1", ttl_s=60
    )
    await log_client.publish(claim, expected_last_subject_seq=0)
    late = ev.Leased(
        id=fresh_id(), agent="w2", at=0, lease="l2", kind="source", target="t1", ttl_s=60
    )
    with pytest.raises(ConflictError):
        await log_client.publish(late, expected_last_subject_seq=0)


async def test_last_event_by_direct_get(log_client: Log) -> None:
    """last_event reads a subject's last event by direct get."""
    assert await log_client.last_event("ppf.config") is None
    config = ev.Configured(id=fresh_id(), agent="admin", at=0, settings=ev.Settings(lab=True))
    await log_client.publish(config)
    assert await log_client.last_event("ppf.config") == config


@pytest.mark.parametrize("buffer_bytes", [stream._BUFFER, 64])
@pytest.mark.parametrize("frames", ["native", "python"])
async def test_firehose_reads_in_order_from_a_sequence(
    log_client: Log, frames: str, buffer_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream reader hands out messages in order from a sequence, with the frame
    parser in C (eventlog/_frames.c) and with its Python twin, from a read buffer of
    megabytes and from one smaller than every frame (grown for each, its tail moved)."""
    if frames == "python":
        monkeypatch.setattr(stream, "_scan", stream._scan_py)
    elif not stream.native_frames():
        pytest.skip("eventlog/_frames.c was not built: install gcc and reinstall")
    batch = [worked(f"8.8.{i // 250}.{i % 250 + 1}") for i in range(3000)]
    await log_client.publish_many(batch)
    got = []
    hose = Firehose(log_client.url, start_seq=1001, buffer_bytes=buffer_bytes)
    async for chunk in hose.batches(until=3000):
        got.extend(chunk)
    assert [m[0] for m in got] == list(range(1001, 3001))
    assert [ev.decode(m[3]) for m in got] == batch[1000:]
    assert all(m[2].startswith(b"ppf.proxy.") for m in got)
    stamps = [m[1] for m in got]
    assert stamps == sorted(stamps) and stamps[0] > 1_700_000_000_000


async def test_firehose_reads_a_frame_larger_than_its_buffer(log_client: Log) -> None:
    """A message near the stream's largest (MAX_MESSAGE), between small ones, is read
    whole from a reader whose buffer is a sixtieth of it: the buffer grows for it, and
    the small ones around it stay in order."""
    big = os.urandom(MAX_MESSAGE - 4096)
    await log_client.publish(worked("8.8.1.1"))
    await log_client.js.publish("ppf.proxy.too_big", big)
    await log_client.publish(worked("8.8.1.2"))
    got = []
    async for chunk in Firehose(log_client.url, buffer_bytes=4096).batches(until=3):
        got.extend(chunk)
    assert [m[0] for m in got] == [1, 2, 3]
    assert got[1][2] == b"ppf.proxy.too_big" and got[1][3] == big
    assert ev.decode(got[2][3]).ip == "8.8.1.2"  # type: ignore[attr-defined]


async def test_firehose_follows_live_publishes(log_client: Log) -> None:
    """The stream reader follows messages published after it started."""
    hose = Firehose(log_client.url, start_seq=1)
    seen: list[int] = []

    async def follow() -> None:
        async for chunk in hose.batches():
            seen.extend(m[0] for m in chunk)
            if len(seen) >= 50:
                return

    task = asyncio.create_task(follow())
    for _ in range(50):
        await log_client.publish(worked())
    await asyncio.wait_for(task, 10)
    assert seen == list(range(1, 51))


async def test_firehose_survives_a_server_restart(nats_server: NatsServer) -> None:
    """The reader reconnects and resumes after the last sequence it handed out."""
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    await lg.publish_many([worked(f"8.8.8.{i}") for i in range(1, 101)])
    await lg.close()
    hose = Firehose(nats_server.url, start_seq=1)
    seen: list[int] = []

    async def follow() -> None:
        async for chunk in hose.batches(until=200):
            seen.extend(m[0] for m in chunk)

    task = asyncio.create_task(follow())
    while len(seen) < 100:
        await asyncio.sleep(0.05)
    await nats_server.astop()
    await nats_server.astart()
    lg = await Log.connect(nats_server.url)
    await lg.publish_many([worked(f"8.8.4.{i}") for i in range(1, 101)])
    await lg.close()
    await asyncio.wait_for(task, 30)
    assert seen == list(range(1, 201))


async def test_a_stream_made_with_s2_is_stored_plain_and_reads_whole(
    nats_server: NatsServer,
) -> None:
    """A stream of a version that compressed its blocks (S2) is moved to none by
    ``ensure_stream``; its sealed, compressed block and the plain ones after the server's
    restart read back in order."""
    lg = await Log.connect(nats_server.url)
    old = StreamConfig(
        name=ev.STREAM, subjects=[ev.STREAM_SUBJECTS], storage=StorageType.FILE,
        compression=StoreCompression.S2, allow_direct=True, max_msg_size=MAX_MESSAGE,
    )  # fmt: skip
    await lg.js.add_stream(old)
    body = os.urandom(100_000).hex().encode()  # 200 KB; 45 of them seal an 8 MB block
    for i in range(45):
        await lg.publish_raw("ppf.proxy.blob", body, msg_id=f"old-{i}")
    await lg.ensure_stream()
    info = await lg.js.stream_info(ev.STREAM)
    assert info.config.compression == StoreCompression.NONE
    await lg.close()
    first = next(nats_server.store_dir.rglob("1.blk"))
    for _ in range(100):  # the server compresses a sealed block in the background
        if first.stat().st_size < 45 * len(body) * 3 // 4:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the first block was never compressed: the test proves nothing")
    await nats_server.astop()
    await nats_server.astart()
    lg = await Log.connect(nats_server.url)
    for i in range(5):
        await lg.publish_raw("ppf.proxy.blob", body, msg_id=f"new-{i}")
    await lg.close()
    hose = Firehose(nats_server.url, start_seq=1)
    seen: list[tuple[int, bytes]] = []
    async for chunk in hose.batches(until=50):
        seen.extend((m[0], bytes(m[3])) for m in chunk)
    assert [seq for seq, _ in seen] == list(range(1, 51))
    assert all(data == body for _, data in seen)


async def test_a_server_that_never_greets_costs_the_client_no_socket(
    nats_server: NatsServer,
) -> None:
    """While its server is away, a listener on its port takes connections and never says
    INFO (a node still starting); the client dials it again and again, then gets its
    server back. nats-py would drop each of those sockets open (its transport dials the
    next server over the last one); eventlog/dial.py closes them, so the garbage
    collector finds no unclosed stream here (warnings are errors in this suite)."""
    lg = await Log.connect(nats_server.url, timeout=0.5)
    await lg.ensure_stream()
    await nats_server.astop()
    dialled: list[int] = []

    def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dialled.append(1)
        held.append(writer)

    held: list[asyncio.StreamWriter] = []
    listener = await asyncio.start_server(mute, "127.0.0.1", nats_server.port)
    for _ in range(60):  # bounded: 6 s at most
        if len(dialled) >= 2:
            break
        await asyncio.sleep(0.1)
    listener.close()
    for writer in held:
        writer.close()
    await listener.wait_closed()
    assert len(dialled) >= 2, "the client did not dial the mute listener twice"
    gc.collect()  # a socket dropped open is reported here, as a ResourceWarning
    await nats_server.astart()
    await lg.publish(worked())
    assert await lg.head_seq() >= 1
    await lg.close()
