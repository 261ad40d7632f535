"""The world in a box: an "internet" network namespace with public-looking addresses.

The lab on loopback is kinder than the world: there a proxy shares the judge's
loopback. Here the proxies, judges and source pages live in their own namespace, joined
to ours by one veth link, and the caller (ppf, a test) stays in its own: a proxy asked
for ``127.0.0.1`` reaches the internet namespace's loopback, never ours, as a public
proxy would. No lab mode is needed: every address is public-looking.

Routing, not one flat link: the public-looking addresses sit on the
inner namespace's ``lo`` as /32s and our side routes ``45.68.0.0/16`` over the /30 of
the link, so thousands of addresses cost one neighbour entry, and an address nobody
owns inside is dropped silently (a connect that times out, like most dead proxies).
The inner namespace gets no default route: nothing in it can reach past the box.

Needs root and iproute2 (CI runs as root); ``unavailable()`` says why not, for skips.
Cleanup is certain: ``stop()`` runs from the context manager, from ``atexit`` and on
SIGTERM; a box left by a process killed with SIGKILL is removed by the next ``start()``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.lab.churn import Plan
from ops.lab.sitebox import OTHERS_AT, OWN_EXITS, SITES, other_site
from ops.lab.testbed import missing

__all__ = ["LINK_HOST", "World", "WorldProxy", "unavailable"]

PREFIX = "ppfw"  # namespaces and links of this module: ppfw<pid>, ppfw<pid>h
LINK_HOST, LINK_INNER = "45.67.0.1", "45.67.0.2"  # our end and the box's, a /30
PUBLIC = "45.68.0.0/16"  # everything in the box

PROXY_NAMES = (
    "squid",
    "tinyproxy-via",
    "tinyproxy-elite",
    "microsocks",
    "dante",
    "mitm-tls",
    "mitm-body",
)
PORTS = {"squid": 3128, "microsocks": 1080, "dante": 1080}  # the rest 8080
RTT_MS = {  # each live proxy its own round trip, 100-400 ms as the world's
    "squid": 120,
    "tinyproxy-via": 160,
    "tinyproxy-elite": 240,
    "microsocks": 100,
    "dante": 300,
    "mitm-tls": 180,
    "mitm-body": 140,
}
HONEST = ("squid", "tinyproxy-via", "tinyproxy-elite", "microsocks", "dante")


def _spread(block: int, i: int) -> str:
    """The i-th address of a /20 block of the box (45.68.<block>.0/20, .1-.250 each /24)."""
    return f"45.68.{block + i // 250}.{1 + i % 250}"


def own_exit_proxies(count: int, seed: int) -> list[dict[str, Any]]:
    """The box's first ``count`` proxies with exits of their own: name, address, port,
    exit, server (a tinyproxy or a microsocks, in turn) and round trip."""
    rng = random.Random(seed + 1)
    return [
        {
            "name": name,
            "addr": f"45.68.11.{i}",
            "port": 8080 if i % 2 else 1080,
            "exit": f"45.68.12.{i}",
            "server": "tinyproxy" if i % 2 else "microsocks",
            "rtt_ms": rng.randint(100, 400),
        }
        for i, name in enumerate(OWN_EXITS[:count], 1)
    ]


def unavailable() -> str | None:
    """Why a box cannot be built here (a sentence naming what to do), or None."""
    if os.geteuid() != 0:
        return "the world in a box needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "the world in a box needs iproute2: apt-get install iproute2"
    lacking = missing()
    if lacking:
        return f"the world in a box needs {' '.join(lacking)}: apt-get install {' '.join(lacking)}"
    return None


def _ip(*args: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True, slots=True)
class WorldProxy:
    """A proxy as the lab knows it: the truth a check is measured against."""

    name: str
    addr: str
    port: int
    proto: str | None
    anonymity: str
    exit_ip: str
    mitm: str
    rtt_ms: float
    https: str  # "yes" when it tunnels to the box's HTTPS endpoint

    @property
    def url(self) -> str:
        return f"{self.proto or 'http'}://{self.addr}:{self.port}"


@dataclass
class World:
    root: Path
    dead_each: int = 3  # addresses of each dead kind
    # More working addresses (a harvest): relays, each with its own round trip (100-400
    # ms, from ``seed``), in front of the honest proxies in turn. They exit where their
    # proxy does: many addresses, few exits, as behind a NAT.
    extra_working: int = 0
    # Working proxies with exits of their own (``sitebox.OWN_EXITS``, at most 25): a
    # tinyproxy or a microsocks each, behind a delaying relay, so a site sees as many
    # exits as the world's pools have.
    own_exits: int = 0
    seed: int = 1
    name: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    proxies: list[WorldProxy] = field(default_factory=list)
    judges: dict[str, str] = field(default_factory=dict)  # format -> URL
    refusing: list[tuple[str, int]] = field(default_factory=list)
    silent: list[tuple[str, int]] = field(default_factory=list)
    tarpits: list[tuple[str, int]] = field(default_factory=list)
    extra: list[tuple[str, int]] = field(default_factory=list)
    portal: tuple[str, int] = ("45.68.5.1", 8080)
    garbage: tuple[str, int] = ("45.68.5.2", 8080)
    page_url: str = ""
    https_url: str = "https://45.68.9.1/generate_204"
    # The churn lab (ops/lab/churn.py): its proxies at 45.68.96.0/20, played
    # at ``speed`` simulated seconds a second from ``churn_t0`` (wall clock), listed on
    # ``churn_page_url``.
    churn: Plan | None = None
    speed: float = 1.0
    churn_t0: float = 0.0
    churn_page_url: str = "http://45.68.4.1/churn.txt"
    # The sites that turn most of the pool away (ops/lab/sitebox.py), their names in the
    # box's /etc/hosts.
    sites: bool = False
    # Sites that let every exit in, beside them (``sitebox.other_site``): what a pool's
    # consumers visit besides, to fill the maps of sites that learning keeps.
    other_sites: int = 0
    _proc: subprocess.Popen[bytes] | None = None
    _up: bool = False

    @property
    def link(self) -> str:
        return f"{self.name}h"

    def start(self) -> World:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        remove_stale()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o777)  # the proxies drop root for their own users
        atexit.register(self.stop)
        _exit_on_sigterm()
        self._up = True
        self._network()
        config = self._config()
        (self.root / "world.json").write_text(json.dumps(config))
        with open(self.root / "inet.log", "ab") as log:
            self._proc = subprocess.Popen(
                [
                    *("ip", "netns", "exec", self.name, sys.executable, "-m", "ops.lab.inet"),
                    str(self.root / "world.json"),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        ready = self.root / "ready.json"
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.root / "inet.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the box's internet did not start:\n{tail}")
            time.sleep(0.05)
        answer = json.loads(ready.read_text())
        self.proxies = [WorldProxy(**p) for p in answer["proxies"]]
        self.churn_t0 = answer["churn_t0"]
        return self

    def churn_addresses(self) -> list[tuple[str, int]]:
        """The churn lab's proxies, in the plan's order."""
        if self.churn is None:
            return []
        return [
            (_spread(96, i), 1080 if server == "microsocks" else 8080)
            for i, server in enumerate(self.churn.servers)
        ]

    def churn_up(self, i: int, at: float | None = None) -> bool:
        """The lab's truth: whether churn proxy ``i`` works at wall time ``at`` (now)."""
        assert self.churn is not None
        now = time.time() if at is None else at
        return self.churn.up(i, int((now - self.churn_t0) * self.speed * 1000))

    def via(self) -> dict[str, str]:
        """Each working address (``addr:port``) and the box's proxy it exits through."""
        named = {f"{p.addr}:{p.port}": p.name for p in self.proxies}
        extra = {f"{a}:{p}": HONEST[i % len(HONEST)] for i, (a, p) in enumerate(self.extra)}
        own = {f"{o['addr']}:{o['port']}": o["name"] for o in self._own()}
        return named | extra | own

    def exit_ips(self) -> set[str]:
        """Every address the box's working proxies exit from."""
        return {p.exit_ip for p in self.proxies} | {o["exit"] for o in self._own()}

    def _own(self) -> list[dict[str, Any]]:
        return own_exit_proxies(self.own_exits, self.seed)

    def gets_through(self, site: str) -> set[str]:
        """The box's truth: the working addresses whose exit ``site`` lets through."""
        (box_site,) = [s for s in SITES if s.name == site]
        return {addr for addr, name in self.via().items() if not box_site.turns_away(name)}

    def root_asks(self) -> dict[str, int]:
        """How often each site's root was asked for (a probe's ask), from the start."""
        asks = self.root / "asks.log"
        lines = asks.read_text().split() if asks.exists() else []
        return {site: lines.count(site) for site in sorted(set(lines))}

    def _network(self) -> None:
        name, link = self.name, self.link
        if self.sites:  # read by `ip netns exec` (and so by the box's proxies) as /etc/hosts
            hosts = Path("/etc/netns") / name
            hosts.mkdir(parents=True, exist_ok=True)
            names = "".join(f"{s.addr} {s.name} www.{s.name}\n" for s in SITES)
            names += "".join(f"{OTHERS_AT} {other_site(i)}\n" for i in range(self.other_sites))
            (hosts / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        _ip("netns", "add", name)
        _ip("link", "add", link, "type", "veth", "peer", "name", f"{name}i")
        _ip("link", "set", f"{name}i", "netns", name)
        _ip("addr", "add", f"{LINK_HOST}/30", "dev", link)
        _ip("link", "set", link, "up")
        _ip("addr", "add", f"{LINK_INNER}/30", "dev", f"{name}i", ns=name)
        _ip("link", "set", f"{name}i", "up", ns=name)
        _ip("link", "set", "lo", "up", ns=name)
        _ip("route", "replace", PUBLIC, "via", LINK_INNER)
        batch = self.root / "addresses.batch"
        batch.write_text("".join(f"addr add {a}/32 dev lo\n" for a in self._owned()))
        _ip("-batch", str(batch), ns=name)

    def _owned(self) -> list[str]:
        """Every address the box answers on (the silent ones are left out on purpose)."""
        self.judges = {
            "httpbin": "http://45.68.3.1/get",
            "azenv": "http://45.68.3.2/azenv.php",
        }
        self.refusing = [(_spread(32, i), 8080) for i in range(self.dead_each)]
        self.silent = [(_spread(64, i), 8080) for i in range(self.dead_each)]
        self.tarpits = [(_spread(48, i), 8080) for i in range(self.dead_each)]
        self.extra = [(_spread(16, i), 8080) for i in range(self.extra_working)]
        self.page_url = "http://45.68.4.1/proxies.txt"
        owned = [f"45.68.1.{i}" for i in range(1, len(PROXY_NAMES) + 1)]
        owned += [f"45.68.2.{i}" for i in range(1, len(PROXY_NAMES) + 1)]
        owned += ["45.68.3.1", "45.68.3.2", "45.68.4.1", "45.68.9.1"]
        owned += [self.portal[0], self.garbage[0]]
        owned += [a for a, _ in self.refusing + self.tarpits + self.extra]
        owned += [a for a, _ in self.churn_addresses()]
        owned += [s.addr for s in SITES] if self.sites else []
        owned += [OTHERS_AT] if self.other_sites else []
        owned += [a for o in self._own() for a in (o["addr"], o["exit"])]
        return owned

    def _config(self) -> dict[str, Any]:
        proxies = {
            name: {"addr": f"45.68.1.{i}", "port": PORTS.get(name, 8080), "rtt_ms": RTT_MS[name]}
            for i, name in enumerate(PROXY_NAMES, 1)
        }
        exits = {name: f"45.68.2.{i}" for i, name in enumerate(PROXY_NAMES, 1)}
        rng = random.Random(self.seed)
        extra = [
            {"addr": a, "port": p, "via": HONEST[i % len(HONEST)], "rtt_ms": rng.randint(100, 400)}
            for i, (a, p) in enumerate(self.extra)
        ]
        listed = [f"{p['addr']}:{p['port']}" for p in proxies.values()]
        listed += [f"{e['addr']}:{e['port']}" for e in extra]
        listed += [f"{o['addr']}:{o['port']}" for o in self._own()]
        listed += [f"{a}:{p}" for a, p in self.refusing + self.silent + self.tarpits]
        listed += [f"{self.portal[0]}:{self.portal[1]}", f"{self.garbage[0]}:{self.garbage[1]}"]
        config: dict[str, Any] = {
            "root": str(self.root),
            "exits": exits,
            "proxies": proxies,
            "tarpits": self.tarpits,
            "extra": extra,
            "own": self._own(),
            "portal": self.portal,
            "garbage": self.garbage,
            "judges": [
                {"format": "httpbin", "addr": "45.68.3.1", "port": 80},
                {"format": "azenv", "addr": "45.68.3.2", "port": 80},
            ],
            "https_target": {"addr": "45.68.9.1", "port": 443},
            "pages": {
                "addr": "45.68.4.1",
                "port": 80,
                "files": {"/proxies.txt": "\n".join(listed)},
            },
        }
        if self.other_sites:
            config["others"] = OTHERS_AT
        if self.sites:
            exit_of = exits | {o["name"]: o["exit"] for o in self._own()}
            config["sites"] = [
                {"name": s.name, "turned_away": sorted(exit_of[p] for p in s.blocks & set(exit_of))}
                for s in SITES
            ]
        if self.churn is not None:
            churned = self.churn_addresses()
            config["churn"] = {
                "speed": self.speed,
                "proxies": [
                    {
                        "addr": addr,
                        "port": port,
                        "server": self.churn.servers[i],
                        "rtt_ms": self.churn.rtt_ms[i],
                        "rate_kb_s": self.churn.rate_kb_s[i] if self.churn.rate_kb_s else 0,
                        "downs": [(d.start_ms, d.end_ms, d.how) for d in self.churn.downs[i]],
                    }
                    for i, (addr, port) in enumerate(churned)
                ],
            }
            lines = [
                f"{'socks5' if port == 1080 else 'http'}://{addr}:{port}" for addr, port in churned
            ]
            config["pages"]["files"]["/churn.txt"] = "\n".join(lines)
        return config

    def stop(self) -> None:
        if not self._up:
            return
        self._up = False
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, 15)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait(5)
        destroy(self.name)
        atexit.unregister(self.stop)

    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _exit_on_sigterm() -> None:
    """SIGTERM (a service manager, ``kill``, a CI runner's timeout) ends the process by
    its default action, which runs no ``atexit`` and no ``finally``: the box would stay
    until the next start. Where nothing else handles it, it becomes ``SystemExit``, so the
    context managers and ``atexit`` stop the box. (An asyncio program's own handler,
    such as ``ppf up``'s, is left alone.)"""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def destroy(name: str) -> None:
    """Kill whatever runs in namespace ``name``, then remove its link, route and itself."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _ip("link", "del", f"{name}h", check=False)
    _ip("route", "del", PUBLIC, check=False)
    _ip("netns", "del", name, check=False)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def boxes() -> list[str]:
    """The namespaces of this module that exist now."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def remove_stale() -> None:
    """Boxes whose creating process is gone (killed with SIGKILL): removed."""
    for name in boxes():
        pid = name.removeprefix(PREFIX)
        alive = pid.isdigit() and Path(f"/proc/{pid}").exists() and int(pid) != os.getpid()
        if not alive or int(pid) == os.getpid():
            destroy(name)
