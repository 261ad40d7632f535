"""`ppf up` on a machine with no way out (as `make up` without internet): it says so once
per agent, within a minute, and blames no source for its own outage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ops.lab.world import unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _inside(ns: str, url: str) -> Any:
    """GET ``url`` from inside the namespace (its loopback is not ours)."""
    code = (
        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.timeout(150)
def test_ppf_up_without_a_way_out_warns_once_and_blames_no_source(
    ppf_bin: str, tmp_path: Path
) -> None:
    """No route but loopback: every local agent reports the outage (log, /v1/stats); the
    built-in sources are never fetched, so none has an error."""
    ns = f"ppfo{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    proc = None
    log = tmp_path / "up.log"
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, ppf_bin, "up", "--data", str(tmp_path / "data")],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        started = time.monotonic()
        outages: list[dict[str, Any]] = []
        while time.monotonic() - started < 60 and len(outages) < 3:
            time.sleep(1)
            try:
                outages = _inside(ns, "http://127.0.0.1:8080/v1/stats")["outages"]
            except (subprocess.CalledProcessError, json.JSONDecodeError):
                continue
        assert {o["agent"] for o in outages} == {
            "local-worker",
            "local-checker",
            "local-seed",
        }, log.read_text()
        assert all("no judge answers" in o["outage"] for o in outages)
        time.sleep(5)  # a few idle cycles more: still nothing blamed, nothing said twice
        sources = _inside(ns, "http://127.0.0.1:8080/v1/sources?limit=0")["sources"]
        assert len(sources) >= 100
        assert [s["url"] for s in sources if s["error"] or s["consecutive_errors"]] == []
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        warnings = [x for x in lines if x.get("level") == "warning"]
        assert sorted(x["agent"] for x in warnings if x["event"] == "network_down") == [
            "local-checker",
            "local-seed",
            "local-worker",
        ]
        assert [x["event"] for x in warnings if x["event"] != "network_down"] == []
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C on a terminal sends
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            subprocess.run(["kill", "-9", pid], check=False)
        subprocess.run(["ip", "netns", "del", ns], check=False)
