"""``ppf doctor`` against a real ``ppf up`` on the test's own ports: healthy, then with
everything stopped and another program on the gateway's port, then with the data
directory locked by a program that is not ppf: each says the cause and the fix in a
line, and exits 1 when something failed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest

from events.catalogue import Heartbeat
from events.mint import fresh_id, now_ms
from tests.test_cli import Up


def _connections_waiting(listener: socket.socket) -> int:
    """How many connections wait in ``listener``'s backlog (the kernel took them; the
    test's program never answers them)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _doctor(ppf_bin: str, data: Path, *extra: str) -> tuple[int, str]:
    done = subprocess.run(
        [ppf_bin, "doctor", "--data", str(data), *extra],
        capture_output=True,
        text=True,
        timeout=90,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.timeout(240)
def test_ppf_doctor_names_what_is_wrong_and_how_to_fix_it(ppf_bin: str, tmp_path: Path) -> None:
    """Healthy: exit 0, NATS, the gateway, the lock and the endpoint ok. Stopped, with a
    listener of this test's on the gateway's port that never answers: exit 1, nothing on
    the data directory, NATS not answering, the gateway's port another program's (named),
    asked on one connection, and no log line beside the report. Locked by a
    program that is not ppf: exit 1, naming it."""
    data = tmp_path / "data"
    up = Up(ppf_bin, data, "--lab", "--no-agents")
    up.start()
    endpoint = f"127.0.0.1:{up.serve_port}"
    try:
        up.caught_up()
        code, said = _doctor(ppf_bin, data, "--endpoint", endpoint)
        assert code == 0, said
        assert "ok    NATS at" in said and f"ok    the gateway at {up.base}" in said, said
        assert "is held by ppf (pid" in said and f"listens on {endpoint}" in said, said
        assert "ok    JetStream: stream PPF (file, 1 replica): no size limit of its own" in said
        # An agent whose own way out is down (it says so in its heartbeat): named, exit 1.
        token = subprocess.run(
            [ppf_bin, "token", "issue", "far-worker", "--role", "worker", "--nats", up.nats],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        beat = Heartbeat(
            id=fresh_id(), agent="far-worker", at=now_ms(), leases=[],
            outage="no judge answers directly: http://judge.example/get: DNS failed",
        )  # fmt: skip
        body = json.dumps({"events": [msgspec.to_builtins(beat)]}).encode()
        urllib.request.urlopen(
            urllib.request.Request(
                up.base + "/v1/events", data=body, headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"
                },
            ),
            timeout=10,
        )  # fmt: skip
        up.caught_up()
        code, said = _doctor(ppf_bin, data, "--endpoint", endpoint)
        assert code == 1, said
        assert "fail  1 agent reach no judge (far-worker): no judge answers directly" in said
    finally:
        assert up.stop() == 0
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", up.http))
    holder.listen()
    try:
        code, said = _doctor(ppf_bin, data, "--endpoint", endpoint)
        asked = _connections_waiting(holder)
    finally:
        holder.close()
    assert code == 1, said
    assert f"fail  nothing runs on {data}" in said, said
    assert "fail  NATS at" in said and "does not answer: Connection refused  -> " in said, said
    assert f"fail  the gateway at {up.base} does not answer as ppf's: no answer" in said, said
    assert f"port {up.http} is pid" in said, said
    # A port that never answers is asked once, not once a question (a wait each).
    assert asked == 1, f"the silent gateway port was asked on {asked} connections"
    # The report alone: the retries to a NATS that is down are its line, not log lines.
    assert '"event"' not in said and "start_waiting" not in said, said
    if shutil.which("flock") is None:
        pytest.skip("flock missing: apt-get install util-linux")
    locker = subprocess.Popen(["flock", str(data / "ppf.lock"), "sleep", "30"])
    try:
        time.sleep(0.5)
        code, said = _doctor(ppf_bin, data, "--endpoint", endpoint)
    finally:
        locker.kill()
        locker.wait()
    assert code == 1 and f"{data} is locked by pid" in said and "not a ppf up" in said, said
