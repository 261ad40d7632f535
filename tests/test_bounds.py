"""Bounds per actor, tried as an attacker holding each role (and none) would, against
the real gateway and the real NATS of a guarded fleet: what one untested agent, one
consumer or a crowd of strangers can take is capped before it is taken
(gateway/bounds.py), and each refusal is counted where only the admin sees it."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgspec
import nats.errors
import pytest

import events as ev
from eventlog.client import Log
from events.batches import group
from events.ids import token_sha256
from events.mint import fresh_id, now_ms
from events.wire import judge_nonce
from gateway.bounds import ANONYMOUS_POOL_SHARE, JUDGE_BYTES_BURST, REPORTS_BURST
from gateway.judge import JUDGE_DOOR, MAX_SPEED_BYTES
from ops.nats.server import NatsServer
from tests.test_agent_identity import Agent, _me, _refused_login
from tests.test_guarded_fleet import _auth, _guarded, _pool, _served_at, _worked
from tests.test_walls_log import _stored

MB = 1_000_000


def _round(agent: str, r: int) -> ev.Event:
    """A round of 500 working proxies an untested worker made up: valid facts, about 60 KB."""
    worked = [
        _worked(agent, f"46.{r % 200}.{i // 250}.{i % 250 + 1}", 1000 + r) for i in range(500)
    ]
    [round_] = group(worked)
    return round_


async def _refused_by(client: Any, token: str, name: str) -> dict[str, int]:
    r = await client.get("/v1/agents", headers=_auth(token))
    [row] = [a for a in (await r.json())["agents"] if a["name"] == name]
    return dict(row.get("refused_by_bound", {}))


@pytest.mark.flood
async def test_an_untested_worker_adds_at_most_10_mb_to_the_log_however_it_sends(
    log_client: Log, nats_server: NatsServer
) -> None:
    """A fresh untested worker token tries its own NATS login (refused: it has none) and
    then the gateway, sending 250 KB of valid rounds a request as fast as it answers for
    8 s: the stream grows by at most 10 MB, past its bucket it is answered 429 with a
    wait, and the refusals are counted for the admin alone. The operator's worker keeps
    its NATS login and publishes at once."""
    async with _guarded(log_client, nats_server) as (client, fold, tokens):
        own = (await _me(client, tokens["w-own"]))["nats"]
        assert own
        url = nats_server.agent_auth().url_for("w1", token_sha256(tokens["w1"]))
        before = await _stored(log_client)
        junk = b"x" * 250_000
        # Its login, minted as a gateway would, straight at the server; were it let in,
        # junk as fast as the server takes it.
        said = await _refused_login(url)
        if "authorization violation" not in said.lower():
            w1 = await Agent.connect(url, "w1")
            started, n = time.monotonic(), 0
            try:
                while time.monotonic() - started < 3 and not w1.nc.is_closed:
                    subject = f"ppf.in.w1.proxy.45-70-98-{n}_80"
                    await w1.js.publish(subject, junk, headers={"Nats-Msg-Id": f"w1:f{n}"})
                    n += 1
            except (nats.errors.Error, TimeoutError):
                pass
            finally:
                await w1.close()
        statuses: dict[int, int] = {}
        started, r = time.monotonic(), 0
        while time.monotonic() - started < 8:
            body = {"events": [msgspec.to_builtins(_round("w1", r + k)) for k in range(4)]}
            answer = await client.post("/v1/events", json=body, headers=_auth(tokens["w1"]))
            statuses[answer.status] = statuses.get(answer.status, 0) + 1
            if answer.status == 429:
                assert int(answer.headers["Retry-After"]) >= 1
            r += 4
        await asyncio.sleep(0.5)
        grown = await _stored(log_client) - before
        assert grown <= 10 * MB, (grown, statuses)
        assert statuses.get(200) and statuses.get(429), statuses
        assert "authorization violation" in said.lower(), said
        assert (await _me(client, tokens["w1"]))["nats"] is None
        assert (await _refused_by(client, tokens["root"], "w1"))["log_bytes"] >= 1
        r2 = await client.get("/v1/agents")  # strangers do not see who was refused
        assert all("refused_by_bound" not in a for a in (await r2.json())["agents"])
        mine = await Agent.connect(own, "w-own")
        try:
            honest = _worked("w-own", "9.9.9.9")
            seq = await mine.publish(ev.agent_subject(honest), honest)
        finally:
            await mine.close()
        assert await fold.wait_for(seq, 10) and ("9.9.9.9", 8080) in fold.state.proxies


async def test_the_judge_sends_a_consumer_nothing_and_an_agent_its_bytes_an_hour(
    log_client: Log, nats_server: NatsServer
) -> None:
    """Every role gets a judge key. A consumer minting its own nonces gets 403 from
    ``/judge/bytes``, however many it mints; an untested worker pulls at most its hour's
    bytes (then 429 with a wait); each refusal counted for the admin."""
    async with _guarded(log_client, nats_server) as (client, _, tokens):
        here = f"{client.host}:{client.port}"
        door = client.app[JUDGE_DOOR]

        async def pull(name: str) -> tuple[int, int]:
            key = bytes.fromhex((await _me(client, tokens[name]))["judge_key"])
            nonce = judge_nonce(name, key, here, int(time.time()) + 60, os.urandom(8).hex())
            r = await client.get(f"/judge/bytes?n={nonce}&size={MAX_SPEED_BYTES}")
            return r.status, len(await r.read()) if r.status == 200 else 0

        consumer = [await pull("shop") for _ in range(20)]
        assert {s for s, _ in consumer} == {403} and not sum(n for _, n in consumer)
        got, status = 0, 200
        for _ in range(int(JUDGE_BYTES_BURST // MAX_SPEED_BYTES) + 8):
            status, n = await pull("w1")
            got += n
            if status != 200:
                break
        assert status == 429 and got <= JUDGE_BYTES_BURST, (status, got)
        assert door.refusals.of("shop")["judge_bytes"] == 20
        refused = await _refused_by(client, tokens["root"], "w1")
        assert refused["judge_bytes"] >= 1


async def test_strangers_popping_from_50_addresses_leave_the_pool_to_consumers(
    log_client: Log, nats_server: NatsServer
) -> None:
    """Callers without a token at 50 loopback addresses call ``/pop/`` until refused:
    together they hold at most their small share of a pool of 40, and at least 90 %
    of it is still served to a paying consumer."""
    import aiohttp

    async with _guarded(log_client, nats_server) as (client, fold, tokens):
        await _pool(log_client, fold, 40)
        base = f"http://{client.host}:{client.port}"
        held: list[str] = []
        for i in range(50):
            connector = aiohttp.TCPConnector(local_addr=(f"127.0.0.{i + 2}", 0))
            async with aiohttp.ClientSession(connector=connector) as stranger:
                for _ in range(3):
                    async with stranger.get(f"{base}/pop/") as r:
                        proxy = (await r.json()).get("proxy") if r.status == 200 else None
                    if proxy:
                        held.append(proxy)
        assert len(held) <= max(1, int(ANONYMOUS_POOL_SHARE * 40)), held
        assert client.app[JUDGE_DOOR].refusals.of("~anonymous")["anonymous_share"] >= 1
        served = await _served_at(client, await log_client.head_seq(), tokens["shop"])
        assert len(served) >= 36, len(served)


async def test_a_consumers_reports_of_every_outcome_are_budgeted_before_the_log(
    log_client: Log, nats_server: NatsServer
) -> None:
    """One consumer reports ``worked`` and ``blocked`` as fast as the gateway answers:
    past its burst each is a 429 counted for the admin, and nothing past it reaches
    the log."""
    async with _guarded(log_client, nats_server) as (client, fold, tokens):
        ips = await _pool(log_client, fold, 5)
        head = await log_client.head_seq()
        statuses: dict[int, int] = {}
        for n in range(REPORTS_BURST + 60):
            body = {"outcome": "worked"} if n % 2 else {"outcome": "blocked", "site": "shop.com"}
            r = await client.post(
                f"/v1/proxies/{ips[n % 5]}:8080/report", json=body, headers=_auth(tokens["shop"])
            )
            statuses[r.status] = statuses.get(r.status, 0) + 1
        assert statuses == {200: REPORTS_BURST, 429: 60}, statuses
        assert await log_client.head_seq() - head == REPORTS_BURST
        assert (await _refused_by(client, tokens["root"], "shop"))["reports"] == 60


async def test_an_agent_publishes_through_the_gateway_until_it_is_trusted(
    log_client: Log, nats_server: NatsServer, tmp_path: Any
) -> None:
    """The agent's own client: untested, its observations go through ``POST /v1/events``
    (its NATS login is refused) and are folded; once the operator trusts it, its next
    ask moves it to its NATS login, through which the next are folded."""
    from agents.gateway_client import GatewayClient

    async with _guarded(log_client, nats_server) as (client, fold, tokens):
        base = str(client.make_url("")).rstrip("/")
        agent = GatewayClient(base, tokens["w1"], "w1", tmp_path / "outbox")
        async with agent:
            assert agent.via == "http"
            assert await agent.publish([_worked("w1", "9.9.9.9")])
            assert await fold.wait_for(await log_client.head_seq(), 10)
            assert ("9.9.9.9", 8080) in fold.state.proxies
            trusted = msgspec.structs.replace(
                fold.state.settings, trusted_agents=(*fold.state.settings.trusted_agents, "w1")
            )
            said = ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=trusted)
            assert await fold.wait_for((await log_client.publish(said)).seq, 10)
            agent._notices.asked_at = -1e9  # its next ask is due (every 600 s)
            await agent._ask_again()
            assert agent.via == "nats"
            assert await agent.publish([_worked("w1", "9.9.9.10")])
            assert await fold.wait_for(await log_client.head_seq(), 10)
            assert ("9.9.9.10", 8080) in fold.state.proxies
