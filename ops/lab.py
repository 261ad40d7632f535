"""A lab of real proxy servers from Debian's packages on loopback, each its own exit.

squid (adds X-Forwarded-For: transparent), tinyproxy with Via (anonymous) and without
(elite), microsocks (SOCKS5), dante (SOCKS4/5); plus a closed port, a tarpit and a port
that speaks garbage. Loopback addresses 127.0.0.2-6 work as distinct exit addresses.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.natsd import free_port

__all__ = ["PACKAGES", "Proxy", "ProxyLab", "missing"]

PACKAGES = {
    "squid": "squid",
    "tinyproxy": "tinyproxy",
    "microsocks": "microsocks",
    "danted": "dante-server",
}


def missing() -> list[str]:
    return [
        pkg
        for binary, pkg in PACKAGES.items()
        if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists()
    ]


@dataclass
class Proxy:
    name: str
    port: int
    proto: str | None  # what a check should find
    anonymity: str = ""
    exit_ip: str = ""
    proc: subprocess.Popen[bytes] | None = None


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@dataclass
class ProxyLab:
    root: Path
    proxies: list[Proxy] = field(default_factory=list)
    _servers: list[socket.socket] = field(default_factory=list)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        return proc

    def start(self) -> ProxyLab:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o777)  # squid and tinyproxy drop root for their own users
        self._squid()
        self._tinyproxy("tinyproxy-via", "127.0.0.3", via=True)
        self._tinyproxy("tinyproxy-elite", "127.0.0.4", via=False)
        port = free_port()
        proc = self._spawn(
            "microsocks", ["microsocks", "-i", "127.0.0.1", "-p", str(port), "-b", "127.0.0.5"]
        )
        self.proxies.append(Proxy("microsocks", port, "socks5", "elite", "127.0.0.5", proc))
        self._dante()
        for p in self.proxies:
            _wait_port(p.port, p.proc)
        self.proxies += [self._closed(), self._tarpit(), self._garbage()]
        return self

    def _squid(self) -> None:
        port = free_port()
        conf = self.root / "squid.conf"
        conf.write_text(
            f"http_port 127.0.0.1:{port}\ntcp_outgoing_address 127.0.0.2\nforwarded_for on\n"
            "http_access allow all\ncache deny all\naccess_log none\n"
            f"pid_filename {self.root}/squid.pid\ncache_log {self.root}/squid-cache.log\n"
            f"coredump_dir {self.root}\nshutdown_lifetime 0 seconds\n"
        )
        binary = shutil.which("squid") or "/usr/sbin/squid"
        proc = self._spawn("squid", [binary, "-N", "-f", str(conf)])
        self.proxies.append(Proxy("squid", port, "http", "transparent", "127.0.0.2", proc))

    def _tinyproxy(self, name: str, bind: str, *, via: bool) -> None:
        port = free_port()
        conf = self.root / f"{name}.conf"
        conf.write_text(
            f"User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nBind {bind}\n"
            "Allow 127.0.0.0/8\nTimeout 30\nMaxClients 200\nLogLevel Error\n"
            f"DisableViaHeader {'No' if via else 'Yes'}\n"
        )
        proc = self._spawn(name, ["tinyproxy", "-d", "-c", str(conf)])
        anonymity = "anonymous" if via else "elite"
        self.proxies.append(Proxy(name, port, "http", anonymity, bind, proc))

    def _dante(self) -> None:
        port = free_port()
        conf = self.root / "danted.conf"
        conf.write_text(
            f"logoutput: {self.root}/danted.log\ninternal: 127.0.0.1 port = {port}\n"
            "external: 127.0.0.6\nsocksmethod: none\nclientmethod: none\n"
            "user.privileged: root\nuser.unprivileged: nobody\n"
            "client pass { from: 127.0.0.0/8 to: 0.0.0.0/0 }\n"
            "socks pass { from: 127.0.0.0/8 to: 0.0.0.0/0 protocol: tcp }\n"
        )
        binary = shutil.which("danted") or "/usr/sbin/danted"
        proc = self._spawn("danted", [binary, "-f", str(conf)])
        self.proxies.append(Proxy("dante", port, "socks5", "elite", "127.0.0.6", proc))

    def _listen(self) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1000)
        self._servers.append(s)
        return s

    def _closed(self) -> Proxy:
        return Proxy("closed", free_port(), None)

    def _tarpit(self) -> Proxy:
        s = self._listen()  # the kernel accepts; nobody ever reads or answers
        return Proxy("tarpit", s.getsockname()[1], None)

    def _garbage(self) -> Proxy:
        s = self._listen()

        def serve() -> None:
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                try:
                    conn.sendall(os.urandom(512) + b"\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{}")
                finally:
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        return Proxy("garbage", s.getsockname()[1], None)

    def stop(self) -> None:
        for s in self._servers:
            s.close()
        for p in self.proxies:
            if p.proc is not None and p.proc.poll() is None:
                try:
                    os.killpg(p.proc.pid, signal.SIGTERM)
                    p.proc.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(p.proc.pid, signal.SIGKILL)
