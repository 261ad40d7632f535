"""The embedded server's users: agents publish their observations and nothing else."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

import events as ev
from ops.nats.client import Log, fresh_id, now_ms
from ops.nats.server import AGENT_INBOX, NatsServer, with_credentials


def _fetched() -> ev.Event:
    return ev.Fetched(
        id=fresh_id(), agent="w1", at=now_ms(), url_id="0123456789abcdef", lease="l", ok=True
    )


def _configured() -> ev.Event:
    return ev.Configured(id=fresh_id(), agent="w1", at=now_ms(), settings=ev.Settings(lab=True))


async def _as(url: str, errors: list[str]) -> nats.NATS:
    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(
        url, inbox_prefix=AGENT_INBOX, error_cb=error_cb, max_reconnect_attempts=0
    )


@pytest.mark.parametrize(
    ("role", "allowed", "refused"),
    [
        ("worker", [_fetched], [_configured]),
        ("checker", [], [_fetched, _configured]),
        ("seed", [], [_fetched, _configured]),
    ],
)
async def test_role_users_publish_only_their_subjects(
    log_client: Log, nats_server: NatsServer, role: str, allowed: list, refused: list
) -> None:
    """Each role's NATS user may publish only its role's subjects."""
    errors: list[str] = []
    nc = await _as(nats_server.agent_url(role), errors)
    js = nc.jetstream(timeout=2)
    try:
        for make in allowed:
            event = make()
            ack = await js.publish(
                ev.subject_for(event), ev.encode(event), headers={"Nats-Msg-Id": event.id}
            )
            assert ack.seq > 0
        head = await log_client.head_seq()
        for make in refused:
            event = make()
            with pytest.raises(nats.errors.TimeoutError):  # dropped by the server: no ack
                await js.publish(ev.subject_for(event), ev.encode(event))
        assert await log_client.head_seq() == head  # nothing refused was stored
        await nc.flush()
        refusals = [e for e in errors if "permissions violation for publish" in e.lower()]
        assert len(refusals) == len(refused), errors
    finally:
        await nc.close()


async def test_agents_cannot_read_the_log_or_the_service_replies(
    log_client: Log, nats_server: NatsServer
) -> None:
    """Agent users can neither read the stream nor the service's replies."""
    await log_client.publish(_fetched())
    errors: list[str] = []
    nc = await _as(nats_server.agent_url("worker"), errors)
    try:
        for subject in ("ppf.>", "_INBOX.>", "$JS.API.>"):
            await nc.subscribe(subject)
        await nc.flush()
        await asyncio.sleep(0.2)
        for subject in ("ppf.>", "_INBOX.>", "$JS.API.>"):
            said = f'permissions violation for subscription to "{subject.lower()}"'
            assert any(said in e.lower() for e in errors), errors
        with pytest.raises(nats.errors.Error):  # no stream API: no consumer, no reading
            await nc.jetstream(timeout=2).stream_info("PPF")
    finally:
        await nc.close()


async def test_a_wrong_password_is_refused(nats_server: NatsServer) -> None:
    """Spoken in the protocol itself: a refused nats-py client leaves its socket to the
    garbage collector, which then warns at whatever test runs next."""
    reader, writer = await asyncio.open_connection(nats_server.host, nats_server.port)
    try:
        assert (await reader.readline()).startswith(b"INFO")
        connect = {"user": "worker", "pass": "wrong", "verbose": False, "protocol": 1}
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 5)
        assert b"Authorization Violation" in answer, answer
    finally:
        writer.close()
        await writer.wait_closed()


def test_cli_credentials_go_only_to_this_machine(tmp_path: Path) -> None:
    """`ppf sources add` beside `ppf up` finds the service password; a remote server, or
    a URL that names its own user, is left as given."""
    (tmp_path / "auth.json").write_text(json.dumps({"ppf": "psecret"}))
    assert (
        with_credentials("nats://127.0.0.1:4222", tmp_path) == "nats://ppf:psecret@127.0.0.1:4222"
    )
    assert with_credentials("localhost:4223", tmp_path) == "nats://ppf:psecret@localhost:4223"
    for kept in ("nats://10.0.0.9:4222", "nats://me:pw@127.0.0.1:4222", "nats://a:1,nats://b:2"):
        assert with_credentials(kept, tmp_path) == kept
    assert with_credentials("nats://127.0.0.1:4222", tmp_path / "none") == "nats://127.0.0.1:4222"
