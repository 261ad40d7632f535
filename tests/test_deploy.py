"""The deployment files (deploy/): every ppf command in them is one ppf's own parser
accepts, every process is stopped by SIGTERM within 10 s, and nothing is published
beyond the host's loopback. (No Docker engine runs here: the compose file is checked
as text, the image is not built.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ops.cli import parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
yaml = pytest.importorskip("yaml", reason="PyYAML: pip install pyyaml (make test does)")


def _filled(arg: str) -> str:
    """Variables as compose and systemd fill them, with a stand-in value."""
    return re.sub(r"\$\{?(\w+)\}?", "x", arg).replace("%i", "worker")


def _parses(argv: list[str]) -> None:
    assert argv[0].endswith("ppf"), argv
    try:
        parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"ppf refuses {argv}") from exc


def test_the_compose_file_runs_ppfs_own_commands() -> None:
    """Each service of compose.yaml: a command ppf's parser takes (nats-server with
    ppf's nats.conf), SIGTERM with 10 s, ports on the host's loopback only."""
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"nats", "fold", "gateway", "serve", "worker", "checker"} <= set(services)
    for name, service in services.items():
        assert service["stop_signal"] == "SIGTERM" and service["stop_grace_period"] == "10s"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        argv = [_filled(str(a)) for a in service["command"]]
        if name == "nats":
            assert argv[:3] == ["nats-server", "-c", "/opt/ppf/nats.conf"]
        else:
            _parses(argv)
    assert services["worker"]["environment"]["PPF_TOKEN"]  # from the environment, never argv


def test_the_systemd_units_run_ppfs_own_commands() -> None:
    """Each unit's ExecStart is a command ppf's parser takes; each is stopped by SIGTERM
    within 10 s."""
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} >= {
        "ppf-nats.service",
        "ppf-fold.service",
        "ppf-gateway.service",
        "ppf-serve.service",
        "ppf-agent@.service",
    }
    for unit in units:
        lines = dict(line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line)
        assert lines["KillSignal"] == "SIGTERM" and lines["TimeoutStopSec"] == "10", unit.name
        # $NAME alone is a list of arguments (PPF_GATEWAY_ARGS): left out; ${NAME} is one.
        words = shlex.split(lines["ExecStart"])
        argv = [_filled(a) for a in words if not re.fullmatch(r"\$\w+", a)]
        if unit.name == "ppf-nats.service":
            assert argv[0].endswith("nats-server")
        else:
            _parses(argv)


def test_a_wrong_flag_is_caught() -> None:
    """The check is not vacuous: a flag ppf does not know fails it."""
    with pytest.raises(AssertionError):
        _parses(["ppf", "gateway", "--no-such-flag"])
