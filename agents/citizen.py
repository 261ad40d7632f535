"""Whether this machine asks an agent to hold back: running on battery, or on a metered link.

An agent on someone's laptop takes no new work while the laptop runs on its battery or
its link is metered (a phone's hotspot), and resumes on mains (the scraper fleet's
"don't scrape on battery"). It says so through ``Heartbeat.outage`` ("paused: ..."),
which the fold keeps per agent and ``/v1/stats`` and the dashboard list: its silence is
then not its sources' fault. Servers and containers are exempt: a machine with no
battery is never on one, and a container (``/.dockerenv``, ``/run/.containerenv``)
reads its host's power supply, which is not its own business.

Read from files under ``root`` (``/`` in the field, a fake sysfs in tests):
``sys/class/power_supply/*/{type,online,status}`` as Linux publishes them, and
NetworkManager's metered flag through ``nmcli`` where it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["Citizen", "Policy", "metered", "on_battery"]

Policy = Literal["pause", "work"]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def on_battery(root: Path = Path("/")) -> str:
    """Why the machine runs on its battery ("" when it does not: on mains, or no battery
    at all). On battery means: a battery discharging and no mains adapter online."""
    supplies = sorted((root / "sys/class/power_supply").glob("*"))
    mains = [s for s in supplies if _read(s / "type") in ("Mains", "USB")]
    if any(_read(s / "online") == "1" for s in mains):
        return ""
    for s in supplies:
        if _read(s / "type") == "Battery" and _read(s / "status") == "Discharging":
            capacity = _read(s / "capacity")
            return f"on battery ({s.name}{f' at {capacity}%' if capacity else ''})"
    return ""


def metered(nmcli: str | None = None) -> str:
    """Why the link is metered, as NetworkManager says of any device ("" when none is,
    or NetworkManager is not there to say)."""
    tool = nmcli or shutil.which("nmcli")
    if tool is None:
        return ""
    try:
        out = subprocess.run(
            [tool, "-t", "-f", "GENERAL.DEVICE,GENERAL.METERED", "device", "show"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    device = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key == "GENERAL.DEVICE":
            device = value
        elif key == "GENERAL.METERED" and value.startswith("yes"):
            return f"metered link ({device or 'a device'}: {value})"
    return ""


def _in_container(root: Path) -> bool:
    return (root / ".dockerenv").exists() or (root / "run/.containerenv").exists()


@dataclass
class Citizen:
    """What the agent's machine asks of it now, read at most every ``every_s``.

    ``battery`` and ``metering``: ``pause`` (the default) holds new work back, ``work``
    ignores it. ``exempt`` (default: inside a container) ignores both."""

    battery: Policy = "pause"
    metering: Policy = "pause"
    root: Path = Path("/")
    nmcli: str | None = None
    every_s: float = 10.0
    exempt: bool | None = None
    _last: tuple[float, str] = field(default=(float("-inf"), ""), repr=False)

    def reason(self) -> str:
        """ "paused: <why>" while the agent should take no new work, else ""."""
        at, why = self._last
        now = time.monotonic()
        if now - at < self.every_s:
            return why
        why = self._read()
        self._last = (now, why)
        return why

    def _read(self) -> str:
        exempt = _in_container(self.root) if self.exempt is None else self.exempt
        if exempt:
            return ""
        reasons = []
        if self.battery == "pause" and (why := on_battery(self.root)):
            reasons.append(why)
        if self.metering == "pause" and (why := metered(self.nmcli)):
            reasons.append(why)
        return f"paused: {', '.join(reasons)}" if reasons else ""
