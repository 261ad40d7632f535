"""One ``ppf up`` per data directory: a second start on it is told so in one line and
touches nothing of the first (no agent enrolled again, no server started)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ops.nats.server import free_run
from tests.test_cli import Up, _get


def _agents(up: Up) -> dict[str, dict[str, object]]:
    status, body = _get(up.base + "/v1/agents")
    assert status == 200
    return {a["name"]: a for a in body["agents"]}


def test_a_second_ppf_up_on_a_data_directory_says_who_holds_it_and_harms_nothing(
    ppf_bin: str, tmp_path: Path
) -> None:
    """A ``ppf up`` runs with its local agents; a second one on the same data directory
    (other ports) exits 1 within seconds, its whole error one line naming the first's
    pid; the first's agents keep their enrolment (no token replaced), and their rounds
    keep reaching the log after it."""
    data = tmp_path / "data"
    up = Up(ppf_bin, data, "--lab")
    up.start()
    try:
        up.caught_up()
        before = _agents(up)
        log_before = up.logfile.read_text()
        assert {"local-worker", "local-checker", "local-seed"} <= set(before)
        nats, http, serve, tls = free_run(4)
        second = subprocess.run(
            [
                ppf_bin, "up", "--data", str(data), "--lab",
                "--listen", f"127.0.0.1:{http}", "--nats-listen", f"127.0.0.1:{nats}",
                "--serve-listen", f"127.0.0.1:{serve}", "--judge-tls-listen", f"127.0.0.1:{tls}",
            ],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr.decode()[-2000:]
        said = second.stderr.decode().strip().splitlines()
        assert said == [
            f"ppf up: another ppf (pid {up.proc.pid if up.proc else 0}) is running on the "
            f"data directory {data}: stop it first, or give this one a --data directory "
            "of its own"
        ], said
        assert not second.stdout.strip(), second.stdout
        up.caught_up()
        after = _agents(up)
        for name in ("local-worker", "local-checker", "local-seed", "local-endpoint"):
            assert after[name]["enrolled_at"] == before[name]["enrolled_at"], name
        # Nor are the first's agents refused anything after it (before: 401s and NATS
        # logins refused as bad credentials, hundreds a minute, until restarted).
        time.sleep(8)
        said_after = up.logfile.read_text()[len(log_before) :]
        for refusal in ("bad credentials", "status=401", "nats_auth_refused"):
            assert refusal not in said_after, said_after[-2000:]
    finally:
        assert up.stop() == 0


@pytest.mark.parametrize("flag", ["--listen", "--nats-listen"])
def test_ppf_up_on_a_port_another_program_holds_says_so_in_one_line(
    ppf_bin: str, tmp_path: Path, flag: str
) -> None:
    """The gateway's port, or NATS's, held by another program: ``ppf up`` exits 1 with
    one line naming the address, the program (its pid and name) and the flag, no
    traceback (before: 34 lines of one for the gateway; for NATS, "cannot connect to
    NATS ... TimeoutError()" after a "nats_started" that another program's answer
    passed for ours)."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    ports = dict(zip(["--listen", "--nats-listen", "--serve-listen", "--judge-tls-listen"],
                     free_run(4), strict=True))  # fmt: skip
    ports[flag] = taken
    try:
        out = subprocess.run(
            [ppf_bin, "up", "--data", str(tmp_path / "data"), "--no-agents", "--lab"]
            + [arg for f, port in ports.items() for arg in (f, f"127.0.0.1:{port}")],
            capture_output=True,
            timeout=120,
        )
    finally:
        holder.close()
    said = out.stderr.decode()
    assert out.returncode == 1, said[-2000:]
    me = f"pid {os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"
    line = f"ppf up: 127.0.0.1:{taken} is in use by {me}: stop it, or give {flag} another"
    assert line in said, said[-2000:]
    assert "Traceback" not in said, said[-2000:]
