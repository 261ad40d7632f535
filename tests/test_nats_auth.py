"""The embedded server's own logins (agents' logins: tests/test_agent_identity.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ops.nats.server import NatsServer, with_credentials


async def test_a_wrong_password_is_refused(nats_server: NatsServer) -> None:
    """Spoken in the protocol itself: a refused nats-py client leaves its socket to the
    garbage collector, which then warns at whatever test runs next."""
    reader, writer = await asyncio.open_connection(nats_server.host, nats_server.port)
    try:
        assert (await reader.readline()).startswith(b"INFO")
        connect = {"user": "ppf", "pass": "wrong", "verbose": False, "protocol": 1}
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
