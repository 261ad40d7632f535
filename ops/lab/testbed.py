"""A lab of real proxy servers from Debian's packages on loopback, each its own exit.

squid (adds X-Forwarded-For: transparent), tinyproxy with Via (anonymous) and without
(elite), microsocks (SOCKS5), dante (SOCKS4/5); plus a closed port, a tarpit and a port
that speaks garbage, and two interceptors of our own: ``mitm-tls`` tunnels CONNECT but
answers TLS with its own certificate (detectable only against a TLS judge), and
``mitm-body`` forwards HTTP but alters the page. Loopback addresses 127.0.0.2-8 work as
distinct exit addresses.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.judge import self_signed
from ops.nats.server import free_port

__all__ = ["LOOPBACK_EXITS", "PACKAGES", "Proxy", "ProxyLab", "missing", "self_signed"]


PACKAGES = {
    "squid": "squid",
    "tinyproxy": "tinyproxy",
    "microsocks": "microsocks",
    "danted": "dante-server",
    "openssl": "openssl",  # the certificates of the TLS interceptor and judges
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
    mitm: str = ""  # "tls": a TLS judge sees it; "body": any judge does


def _relay(a: socket.socket, b: socket.socket, timeout: float = 30.0) -> None:
    """Copy both ways until either side closes (or nothing moves for ``timeout``)."""
    pair = {a: b, b: a}
    while True:
        ready, _, _ = select.select(list(pair), [], [], timeout)
        if not ready:
            return
        for s in ready:
            # An SSLSocket may hold decrypted bytes select() cannot see: drain them all.
            while True:
                try:
                    data = s.recv(65536)
                except (ssl.SSLWantReadError, BlockingIOError):
                    break
                if not data:
                    return
                _send_all(pair[s], data)
                if not (isinstance(s, ssl.SSLSocket) and s.pending()):
                    break


def _send_all(sock: socket.socket, data: bytes) -> None:
    """sendall for a socket that may be non-blocking (the TLS interceptor's)."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            select.select([], [sock], [], 5)


def _read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 16384:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


# How often a daemon is started on a fresh port after it exited before listening.
TRIES = 3


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


# Where each proxy's outgoing connections come from: its exit address. On loopback,
# 127.0.0.2-8 work without setup; the world in a box (ops/lab/world.py) passes
# public-looking ones that it has put on its namespace's loopback.
LOOPBACK_EXITS = {
    "squid": "127.0.0.2",
    "tinyproxy-via": "127.0.0.3",
    "tinyproxy-elite": "127.0.0.4",
    "microsocks": "127.0.0.5",
    "dante": "127.0.0.6",
    "mitm-tls": "127.0.0.7",
    "mitm-body": "127.0.0.8",
}


@dataclass
class FakeProxies:
    """The lab's proxies that are not proxies, served by threads of this process: one
    that refuses, a tarpit, one that answers garbage, and two that tamper (TLS, body)."""

    exits: dict[str, str]
    _servers: list[socket.socket] = field(default_factory=list)

    def _listen(self) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1000)
        self._servers.append(s)
        return s

    def closed(self) -> Proxy:
        # Bound and never listening: every connect is refused, and no other test's server
        # can be given the port (a free port number alone was, and then it answered).
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self._servers.append(s)
        return Proxy("closed", s.getsockname()[1], None)

    def tarpit(self) -> Proxy:
        s = self._listen()  # the kernel accepts; nobody ever reads or answers
        return Proxy("tarpit", s.getsockname()[1], None)

    def garbage(self) -> Proxy:
        s = self._listen()

        def serve() -> None:
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                try:
                    # Garbage as the answer to what came, not before it: said first and
                    # closed, its bytes raced the request, and a reset that beat them read
                    # as the site closing on the proxy, not the proxy's garbage.
                    conn.settimeout(5)
                    with contextlib.suppress(OSError):
                        conn.recv(65_536)
                    conn.sendall(os.urandom(512) + b"\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{}")
                except OSError:
                    pass  # the client went away first
                finally:
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        return Proxy("garbage", s.getsockname()[1], None)

    def _serve(self, handle: Callable[[socket.socket], None]) -> int:
        """A thread accepting on a fresh loopback port, a thread per connection."""
        s = self._listen()

        def accept() -> None:
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return

                def one(conn: socket.socket = conn) -> None:
                    try:
                        conn.settimeout(30)
                        handle(conn)
                    except (OSError, ValueError):
                        pass
                    finally:
                        conn.close()

                threading.Thread(target=one, daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return int(s.getsockname()[1])

    def mitm_tls(self, root: Path) -> Proxy:
        """CONNECT, then TLS answered with its own certificate and re-made to the target;
        anything else through the tunnel passes untouched (as interceptors do)."""
        cert, key = self_signed(root, "mitm")
        server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_side.load_cert_chain(cert, key)
        client_side = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_side.check_hostname = False
        client_side.verify_mode = ssl.CERT_NONE

        def handle(conn: socket.socket) -> None:
            head = _read_head(conn)
            parts = head.split(b" ", 2)
            if len(parts) < 3 or parts[0] != b"CONNECT":
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n")
                return
            host, _, port = parts[1].decode().rpartition(":")
            upstream = socket.create_connection((host, int(port)), 10, (self.exits["mitm-tls"], 0))
            with upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = conn.recv(1, socket.MSG_PEEK)
                if first[:1] != b"\x16":  # not a TLS handshake: relay as is
                    _relay(conn, upstream)
                    return
                with (
                    server_side.wrap_socket(conn, server_side=True) as inner,
                    client_side.wrap_socket(upstream, server_hostname=host) as outer,
                ):
                    # Non-blocking from here: a blocking read of a TLS side that only
                    # had session tickets to say would wait for data that never comes
                    # while the other side's request waits unread (a deadlock whenever
                    # the tickets arrive first, as they do behind a slow link).
                    inner.setblocking(False)
                    outer.setblocking(False)
                    _relay(inner, outer)

        exit_ip = self.exits["mitm-tls"]
        return Proxy("mitm-tls", self._serve(handle), "https", "elite", exit_ip, mitm="tls")

    def mitm_body(self) -> Proxy:
        """An HTTP forwarding proxy that appends a script to every page it carries."""

        def handle(conn: socket.socket) -> None:
            head = _read_head(conn)
            line, _, rest = head.partition(b"\r\n")
            method, uri, version = line.split(b" ", 2)
            target = urlsplit(uri.decode())
            if method == b"CONNECT" or not target.hostname:
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n")
                return
            path = (target.path or "/") + (f"?{target.query}" if target.query else "")
            upstream = socket.create_connection(
                (target.hostname, target.port or 80), 10, (self.exits["mitm-body"], 0)
            )
            with upstream:
                upstream.sendall(b" ".join([method, path.encode(), version]) + b"\r\n" + rest)
                answer = b""
                while chunk := upstream.recv(65536):
                    answer += chunk
            head_out, _, body = answer.partition(b"\r\n\r\n")
            body += b"<script src=//ads.invalid/x.js></script>"
            lines = [
                h for h in head_out.split(b"\r\n") if not h.lower().startswith(b"content-length")
            ]
            conn.sendall(b"\r\n".join(lines) + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

        # It forwards our headers untouched (no Via): elite, exiting from its address.
        exit_ip = self.exits["mitm-body"]
        return Proxy("mitm-body", self._serve(handle), "http", "elite", exit_ip, mitm="body")

    def stop(self) -> None:
        for s in self._servers:
            s.close()


@dataclass
class ProxyLab:
    root: Path
    proxies: list[Proxy] = field(default_factory=list)
    exits: dict[str, str] = field(default_factory=lambda: dict(LOOPBACK_EXITS))
    # squid takes its client's address from a PROXY protocol header (the world in a box
    # puts a delaying relay in front of it, and squid must still see who really asked).
    proxy_protocol: bool = False
    _ports: set[int] = field(default_factory=set)  # handed out: never twice in one lab
    fakes: FakeProxies = field(init=False)

    def __post_init__(self) -> None:
        self.fakes = FakeProxies(self.exits)

    def _port(self) -> int:
        """A free port no daemon of this lab was given: they are started side by side,
        and the kernel may call one port free twice before either binds it (a relay
        then reached the other daemon: tinyproxy answered squid's PROXY header 400)."""
        port = free_port(avoid=self._ports)
        self._ports.add(port)
        return port

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        return proc

    def start(self) -> ProxyLab:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o777)  # squid and tinyproxy drop root for their own users
        try:
            self._daemons()
            fakes = self.fakes
            self.proxies += [fakes.mitm_tls(self.root), fakes.mitm_body()]
            self.proxies += [fakes.closed(), fakes.tarpit(), fakes.garbage()]
        except BaseException:
            self.stop()  # none of what did start outlives a lab that failed to
            raise
        return self

    def _daemons(self) -> None:
        """The Debian daemons, started side by side, each listening when this returns.

        A port the kernel called free can be taken before the daemon binds it (a
        listener or an outgoing connection of a test beside us); the daemon then exits,
        and is started again on another port, at most ``TRIES`` times in all."""
        launchers: list[Callable[[], Proxy]] = [
            self._squid,
            lambda: self._tinyproxy("tinyproxy-via", self.exits["tinyproxy-via"], via=True),
            lambda: self._tinyproxy("tinyproxy-elite", self.exits["tinyproxy-elite"], via=False),
            self._microsocks,
            self._dante,
        ]
        first = len(self.proxies)
        self.proxies += [launch() for launch in launchers]  # in the list: stop() ends them
        for i, launch in enumerate(launchers, first):
            for attempt in range(1, TRIES + 1):
                p = self.proxies[i]
                try:
                    _wait_port(p.port, p.proc)
                    break
                except RuntimeError as e:
                    if attempt == TRIES:
                        log = (self.root / f"{p.name}.log").read_text(errors="replace")
                        raise RuntimeError(f"{p.name}: {e}; its log ends: {log[-600:]}") from e
                    self.proxies[i] = launch()

    def _squid(self) -> Proxy:
        port = self._port()
        conf = self.root / "squid.conf"
        conf.write_text(
            f"http_port 127.0.0.1:{port}"
            + (
                " require-proxy-header\nproxy_protocol_access allow all"
                if self.proxy_protocol
                else ""
            )
            + f"\ntcp_outgoing_address {self.exits['squid']}\nforwarded_for on\n"
            "http_access allow all\ncache deny all\naccess_log none\n"
            f"pid_filename {self.root}/squid.pid\ncache_log {self.root}/squid-cache.log\n"
            f"coredump_dir {self.root}\nshutdown_lifetime 0 seconds\n"
        )
        binary = shutil.which("squid") or "/usr/sbin/squid"
        proc = self._spawn("squid", [binary, "-N", "-f", str(conf)])
        exit_ip = self.exits["squid"]
        return Proxy("squid", port, "http", "transparent", exit_ip, proc)

    def _tinyproxy(self, name: str, bind: str, *, via: bool) -> Proxy:
        port = self._port()
        conf = self.root / f"{name}.conf"
        conf.write_text(
            f"User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nBind {bind}\n"
            "Allow 127.0.0.0/8\nTimeout 30\nMaxClients 200\nLogLevel Error\n"
            f"DisableViaHeader {'No' if via else 'Yes'}\n"
        )
        proc = self._spawn(name, ["tinyproxy", "-d", "-c", str(conf)])
        anonymity = "anonymous" if via else "elite"
        return Proxy(name, port, "http", anonymity, bind, proc)

    def _microsocks(self, name: str = "microsocks", bind: str = "") -> Proxy:
        port = self._port()
        bind = bind or self.exits["microsocks"]
        cmd = ["microsocks", "-i", "127.0.0.1", "-p", str(port), "-b", bind]
        return Proxy(name, port, "socks5", "elite", bind, self._spawn(name, cmd))

    def more(self, name: str, server: str, bind: str) -> Proxy:
        """One more proxy, ``server`` ("tinyproxy", elite, or "microsocks"), exiting from
        ``bind``, listening when this returns (started again on another port, as the
        first ones are, when its port was taken first)."""
        for attempt in range(1, TRIES + 1):
            if server == "tinyproxy":
                proxy = self._tinyproxy(name, bind, via=False)
            else:
                proxy = self._microsocks(name, bind)
            self.proxies.append(proxy)  # in the list: stop() ends it
            try:
                _wait_port(proxy.port, proxy.proc)
                return proxy
            except RuntimeError as e:
                if attempt == TRIES:
                    log = (self.root / f"{name}.log").read_text(errors="replace")
                    raise RuntimeError(f"{name}: {e}; its log ends: {log[-600:]}") from e
        raise AssertionError("unreachable")

    def _dante(self) -> Proxy:
        port = self._port()
        conf = self.root / "danted.conf"
        conf.write_text(
            f"logoutput: {self.root}/danted.log\ninternal: 127.0.0.1 port = {port}\n"
            f"external: {self.exits['dante']}\nsocksmethod: none\nclientmethod: none\n"
            "user.privileged: root\nuser.unprivileged: nobody\n"
            "client pass { from: 127.0.0.0/8 to: 0.0.0.0/0 }\n"
            "socks pass { from: 127.0.0.0/8 to: 0.0.0.0/0 protocol: tcp }\n"
        )
        binary = shutil.which("danted") or "/usr/sbin/danted"
        proc = self._spawn("danted", [binary, "-f", str(conf)])
        return Proxy("dante", port, "socks5", "elite", self.exits["dante"], proc)

    def stop(self) -> None:
        """Each daemon's process group killed at once: nothing of theirs outlives the lab's
        directory, and squid took 1.8 s a stop on SIGTERM (its shutdown_lifetime is 0)."""
        self.fakes.stop()
        for p in self.proxies:
            if p.proc is not None and p.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait(10)
