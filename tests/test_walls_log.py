"""What one agent's refused input costs the log, tried as an agent would: its own NATS
login, publishing on its own subjects what the fold refuses. These floods run apart
from the rest of the suite (marker ``flood``: in the serial run beside the boxes)."""

from __future__ import annotations

import pytest

import events as ev
from eventlog.client import Log
from events.mint import fresh_id, now_ms
from ops.nats.server import NatsServer
from tests.test_agent_identity import Agent, _fleet, _me

pytestmark = pytest.mark.flood


async def _stored(lg: Log) -> int:
    """The bytes the log and its DLQ hold."""
    dlq = await lg.js.stream_info(ev.DLQ_STREAM)
    return (await lg.stored_bytes())[0] + int(dlq.state.bytes)


async def test_refused_rounds_and_junk_grow_the_log_by_at_most_twice_what_was_sent(
    log_client: Log, nats_server: NatsServer
) -> None:
    """A worker sends 10 rounds of 500 failed results (which workers may not report) and
    200 junk messages of 100 KB on its own subjects: every one is refused, each message
    gets one DLQ entry naming what it refused, and the stream grows by at most twice
    the bytes sent (a round's 500 results made 500 entries of 16 KiB each before)."""
    async with _fleet(log_client, nats_server) as (client, fold, tokens):
        w1 = await Agent.connect((await _me(client, tokens["w1"]))["nats"], "w1")
        before = await _stored(log_client)
        sent = 0
        try:
            for r in range(10):
                results = [
                    ev.CheckResult(
                        ip=f"45.70.{r}.{i % 250}",
                        port=1000 + i,
                        proto="http",
                        ok=False,
                        error="refused by the worker's own rule",
                    )
                    for i in range(500)
                ]
                round_ = ev.ProxiesChecked(
                    id=fresh_id(), agent="w1", at=now_ms(), key="0" * 16, source="0" * 16,
                    results=results,
                )  # fmt: skip
                sent += len(ev.encode(round_))
                await w1.publish(ev.agent_subject(round_), round_)
            junk = b"x" * 100_000
            for i in range(200):
                ack = await w1.js.publish(
                    f"ppf.in.w1.proxy.45-70-99-{i}_80", junk, headers={"Nats-Msg-Id": f"w1:j{i}"}
                )
                sent += len(junk)
            assert await fold.wait_for(int(ack.seq), 10)
        finally:
            await w1.close()
        for _ in range(200):
            if fold.dead_letters.sent >= 210 and not fold.dead_letters.pending:
                break
            await _sleep()
        assert fold.dead_letters.sent == 210, fold.dead_letters.sent
        grown = await _stored(log_client) - before
        assert grown <= 2 * sent, (grown, sent)
        assert not fold.state.proxies


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.05)


async def test_an_agent_flooding_refused_input_is_cut_off_and_its_login_refused(
    log_client: Log, nats_server: NatsServer
) -> None:
    """A worker publishes junk of 100 KB on its own subject as fast as its link takes
    it: once its refused bytes pass the bound a minute it is cut (its connection
    kicked, its login refused, its HTTP calls 403, counted in /v1/agents), within a few
    seconds; the stream grows by at most twice what it got out before the cut."""
    import asyncio
    import time

    import nats.errors

    from gateway.penalty import PENALTIES, REFUSED_BYTES_PER_MIN
    from tests.test_agent_identity import _refused_login

    async with _fleet(log_client, nats_server) as (client, _, tokens):
        url = (await _me(client, tokens["w1"]))["nats"]
        w1 = await Agent.connect(url, "w1")
        before = await _stored(log_client)
        junk, sent, passed_at = b"x" * 100_000, 0, 0.0
        started = time.monotonic()
        try:
            while time.monotonic() - started < 10 and not w1.nc.is_closed:
                subject = f"ppf.in.w1.proxy.45-70-98-{sent // len(junk)}_80"
                msg_id = f"w1:f{sent // len(junk)}"
                try:
                    await w1.js.publish(subject, junk, headers={"Nats-Msg-Id": msg_id})
                except (nats.errors.Error, TimeoutError):
                    break
                sent += len(junk)
                if not passed_at and sent > REFUSED_BYTES_PER_MIN:
                    passed_at = time.monotonic()
        finally:
            cut_at = time.monotonic()
            await w1.close()
        assert w1.nc.is_closed and passed_at, (sent, w1.disconnects)
        assert cut_at - passed_at < 5.0, cut_at - passed_at
        assert client.app[PENALTIES].penalized("w1") > 0
        assert "authorization violation" in (await _refused_login(url)).lower()
        r = await client.get("/v1/agents/me", headers={"Authorization": f"Bearer {tokens['w1']}"})
        assert r.status == 403 and "Retry-After" in r.headers
        r = await client.get("/v1/agents")
        [row] = [a for a in (await r.json())["agents"] if a["name"] == "w1"]
        assert row["cut_off"] == 1 and row["cut_off_s"] > 0
        await asyncio.sleep(0.5)
        grown = await _stored(log_client) - before
        assert grown <= 2 * sent + 64 * 1024, (grown, sent)
