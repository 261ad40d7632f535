"""A tunnel to a TLS port whose site answers a TLS alert (endpoint/router/tunnels.py):
the client's first bytes reach at most three upstreams, and an alert is read as the site
turning an exit away only where another exit's handshake with the site got through
lately. Six loopback CONNECT proxies, each leaving from its own 127.0.0.x address; a
site on 127.0.0.1:8443 that answers exits it refuses, and anything but a ClientHello,
with an alert."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections.abc import AsyncIterator

import pytest

from endpoint.connection.client import serve
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.router import Router

TOKEN = "t"
SITE_PORT = 8443  # a TLS port (the endpoint reads first answers only there)
ALERT = b"\x15\x03\x03\x00\x02\x02\x28"  # handshake_failure
HELLO = b"\x16\x03\x01\x00\x05hello"  # what passes for a ClientHello here
SERVER_HELLO = b"\x16\x03\x03\x00\x05howdy"
REFUSED_EXITS = {"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"}


@contextlib.asynccontextmanager
async def _world() -> AsyncIterator[tuple[int, Router, list[str], dict[int, str]]]:
    """The endpoint's port, its router, the site's log of whom it heard from, and each
    proxy's exit address by its port: six exits, the site lets two in."""
    seen: list[str] = []
    opened: list[asyncio.StreamWriter] = []  # every connection made here, closed at the end

    async def site(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(writer)
        peer = writer.get_extra_info("peername")[0]
        with contextlib.suppress(OSError):
            first = await reader.read(100)
            seen.append(peer)
            hello = first[:1] == b"\x16"  # a handshake record: a ClientHello here
            writer.write(SERVER_HELLO if hello and peer not in REFUSED_EXITS else ALERT)
            await writer.drain()
            if hello and peer not in REFUSED_EXITS:
                await reader.read(100)
        writer.close()

    def proxy_for(exit_ip: str):  # type: ignore[no-untyped-def]
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                head = await reader.readuntil(b"\r\n\r\n")
                host, _, port = head.split(b" ")[1].decode().rpartition(":")
                tr, tw = await asyncio.open_connection(host, int(port), local_addr=(exit_ip, 0))
                opened.extend([writer, tw])
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

                async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                    with contextlib.suppress(OSError):
                        while data := await src.read(65_536):
                            dst.write(data)
                    dst.close()

                await asyncio.gather(pipe(reader, tw), pipe(tr, writer))
            writer.close()

        return handle

    site_server = await asyncio.start_server(site, "127.0.0.1", SITE_PORT, reuse_address=True)
    exits = [f"127.0.0.{n}" for n in (11, 12, 13, 14, 15, 16)]
    proxies = [await asyncio.start_server(proxy_for(ip), "127.0.0.1", 0) for ip in exits]
    pool = Pool(rng=random.Random(1))
    pool.replace(
        [Upstream("127.0.0.1", p.sockets[0].getsockname()[1], "http", https="yes") for p in proxies]
    )

    async def login_ok(name: str, token: str) -> bool:
        return token == TOKEN

    router = Router(pool, login_ok, lab=True, hedges=0)
    endpoint = await serve(router, "127.0.0.1", 0)
    try:
        exit_of = {p.sockets[0].getsockname()[1]: ip for p, ip in zip(proxies, exits, strict=True)}
        yield endpoint.sockets[0].getsockname()[1], router, seen, exit_of
    finally:
        endpoint.close()
        router.close()
        for server in (site_server, *proxies):
            server.close()
        for writer in opened:
            writer.close()
        await asyncio.sleep(0.1)  # their handlers see the ends and return


async def _tunnel(port: int, first: bytes) -> bytes:
    """A CONNECT to the site, ``first`` sent through it: what came back first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(f"me:{TOKEN}".encode())
    writer.write(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n"
        % (SITE_PORT, auth)
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(first)
    try:
        return await asyncio.wait_for(reader.read(100), 10)
    finally:
        writer.close()


async def test_a_client_s_junk_reaches_three_upstreams_and_turns_no_exit_away() -> None:
    """Bytes that are no ClientHello draw an alert from every exit: before, the endpoint
    tried the whole pool for one tunnel and marked every proxy turned away. Now three
    upstreams at most get them, the client gets the alert, and no proxy is marked while
    no handshake with the site got through lately; a ClientHello then reaches an exit
    the site lets in, and from then on the refusing exits are marked."""
    async with _world() as (port, router, seen, exit_of):
        assert await _tunnel(port, b"GET / HTTP/1.1\r\n\r\n") == ALERT
        assert len(seen) == 3, seen
        assert all(not up.turned_away for up in router.pool.upstreams.values())
        assert router.outcomes.counts.get("tls_refused_unread") == 3
        answers = []
        for _ in range(8):
            seen.clear()
            answers.append(await _tunnel(port, HELLO))
            assert len(seen) <= 3, seen
        assert answers[-4:] == [SERVER_HELLO] * 4, answers
        assert router.handshakes.lately("127.0.0.1", time.monotonic())
        marked = {exit_of[up.port] for up in router.pool.upstreams.values() if up.turned_away}
        assert marked and marked <= REFUSED_EXITS, marked


@pytest.fixture(autouse=True)
def _needs_loopback_aliases() -> None:
    """127.0.0.11-16 are loopback on Linux without setup; elsewhere they may not be."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.16", 0))
        except OSError:
            pytest.skip("127.0.0.x beyond 127.0.0.1 is not loopback here")


def _client_hello(name: str) -> bytes:
    """A real ClientHello naming ``name`` (SNI), as Python's ssl writes it."""
    import ssl

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_a_tunnel_to_an_address_is_routed_by_its_client_hellos_name() -> None:
    """A CONNECT to an address on a TLS port (as a SOCKS5 client that resolves names
    itself sends): the ClientHello's server name is the site it is routed and remembered
    by; a refusal there never marks an exit turned away (the name is the client's word
    alone), and at most three upstreams get the bytes."""
    hello = _client_hello("Shop.Example")
    async with _world() as (port, router, seen, _):
        answers = []
        for _ in range(6):
            seen.clear()
            answers.append(await _tunnel(port, hello))
            assert len(seen) <= 3, seen
        assert SERVER_HELLO in answers, answers
        assert "shop.example" in router.handshakes.through
        assert "127.0.0.1" not in router.handshakes.through
        assert all(not up.turned_away for up in router.pool.upstreams.values())


def test_the_client_hello_reader_takes_a_whole_record_and_nothing_else() -> None:
    """Its name, lower case, from a whole record; nothing from a part of one (the rest is
    read on first), from bytes that are no handshake, or from a hello cut inside an
    extension."""
    from endpoint.link.hello import hello_size, server_name

    hello = _client_hello("Shop.Example")
    assert hello_size(hello) == len(hello) and server_name(hello) == "shop.example"
    assert server_name(hello[:100]) == ""
    assert server_name(b"GET / HTTP/1.1\r\n\r\n") == "" and hello_size(b"GET ") is None
    cut = hello[:5] + hello[5:60]
    cut = cut[:3] + (len(cut) - 5).to_bytes(2, "big") + cut[5:]
    assert server_name(cut) == ""
