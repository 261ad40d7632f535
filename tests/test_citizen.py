"""Agents as good citizens: no new work on battery or on a metered link, through a fake
sysfs root and a fake nmcli; said in the agent's heartbeat; resumed on mains."""

from __future__ import annotations

import asyncio
import dataclasses
import stat
from pathlib import Path

from agents.checker import Checker, CheckerConfig
from agents.citizen import Citizen, metered, on_battery
from eventlog.client import Log
from ops.lab.testbed import ProxyLab
from tests.test_checker import _rechecks


def _supply(root: Path, name: str, **files: str) -> Path:
    d = root / "sys/class/power_supply" / name
    d.mkdir(parents=True, exist_ok=True)
    for key, value in files.items():
        (d / key).write_text(value + "\n")
    return d


def _laptop(root: Path, *, plugged: bool) -> None:
    _supply(root, "AC", type="Mains", online="1" if plugged else "0")
    status = "Charging" if plugged else "Discharging"
    _supply(root, "BAT0", type="Battery", status=status, capacity="41")


def _nmcli(tmp: Path, metered_value: str) -> str:
    tool = tmp / "nmcli"
    tool.write_text(
        "#!/bin/sh\n"
        'echo "GENERAL.DEVICE:lo"\necho "GENERAL.METERED:no"\n'
        f'echo "GENERAL.DEVICE:wlan0"\necho "GENERAL.METERED:{metered_value}"\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(tool)


def test_a_laptop_on_its_battery_is_told_apart_from_one_on_mains(tmp_path: Path) -> None:
    """Discharging with the adapter offline is on battery; plugged in, or a server with
    no battery at all (or only a USB supply online), is not."""
    assert on_battery(tmp_path) == ""  # no power_supply at all: a server
    _laptop(tmp_path, plugged=False)
    assert on_battery(tmp_path) == "on battery (BAT0 at 41%)"
    _laptop(tmp_path, plugged=True)
    assert on_battery(tmp_path) == ""
    _supply(tmp_path, "AC", online="0")
    _supply(tmp_path, "BAT0", status="Discharging")
    _supply(tmp_path, "usb", type="USB", online="1")
    assert on_battery(tmp_path) == ""


def test_a_metered_link_is_read_from_networkmanager(tmp_path: Path) -> None:
    """Any device NetworkManager calls metered ("yes" or its guess) counts; none, or no
    nmcli at all, is not metered."""
    assert metered(_nmcli(tmp_path, "yes (guessed)")) == "metered link (wlan0: yes (guessed))"
    assert metered(_nmcli(tmp_path, "no")) == ""
    assert metered(str(tmp_path / "absent")) == ""


def test_the_policy_and_the_container_exemption(tmp_path: Path) -> None:
    """Both reasons are given together; ``work`` ignores one; a container (or an
    operator's ``exempt``) ignores both."""
    _laptop(tmp_path, plugged=False)
    tool = _nmcli(tmp_path, "yes")
    both = Citizen(root=tmp_path, nmcli=tool, every_s=0)
    assert both.reason() == "paused: on battery (BAT0 at 41%), metered link (wlan0: yes)"
    assert Citizen(root=tmp_path, nmcli=tool, battery="work", every_s=0).reason() == (
        "paused: metered link (wlan0: yes)"
    )
    assert Citizen(root=tmp_path, nmcli=tool, exempt=True, every_s=0).reason() == ""
    (tmp_path / ".dockerenv").touch()
    assert Citizen(root=tmp_path, nmcli=tool, every_s=0).reason() == ""


async def test_a_checker_on_battery_takes_no_work_says_so_and_resumes_on_mains(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """On battery, the checker leases nothing though two proxies are due, and the fleet
    reads "paused: on battery" as its outage; plugged in, it checks both and the outage
    is cleared."""
    root = tmp_path / "root"
    _laptop(root, plugged=False)
    known = [p for p in lab.proxies if p.name in ("squid", "microsocks")]
    stop = asyncio.Event()
    async with _rechecks(log_client, known) as r:
        citizen = Citizen(root=root, nmcli=str(tmp_path / "no-nmcli"), every_s=0)
        config = dataclasses.replace(
            CheckerConfig(shards=256, check_timeout_s=3, idle_s=0.1), citizen=citizen
        )
        checker = Checker(r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c1", config)
        task = asyncio.create_task(checker.run(stop))
        try:
            for _ in range(100):
                await r.fold.wait_for(await log_client.head_seq(), 5)
                if r.fold.state.agents["c1"].outage:
                    break
                await asyncio.sleep(0.1)
            assert r.fold.state.agents["c1"].outage == "paused: on battery (BAT0 at 41%)"
            await asyncio.sleep(1.0)  # ten idle cycles: none takes work
            assert checker.rechecked == 0
            assert not any(row.kind == "recheck" for row in r.fold.state.leases.values())
            _laptop(root, plugged=True)
            for _ in range(100):
                if checker.rechecked == 2:
                    break
                await asyncio.sleep(0.1)
            assert checker.rechecked == 2
            await r.fold.wait_for(await log_client.head_seq(), 5)
            assert r.fold.state.agents["c1"].outage == ""
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
