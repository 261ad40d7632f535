"""The checkpoint writer: a child process that owns the DuckDB file while the fold runs.

Why a process: DuckDB's appender converts Python values while holding the GIL, so in a
thread it slows the fold (docs/decisions.md, The fold). In a child on the other core
it costs the fold only the encode at the cut and a pipe write.

Protocol over the child's stdin/stdout: the parent sends ``>Q length`` + a msgpack
``Checkpoint`` without its tables, then each table's blob as ``>Q length`` + bytes, in
``TABLES`` order (blobs are written as they are, never copied into one frame: at a
million rows each copy is hundreds of MB). The child commits and answers
``>Q last_seq``, the 32-byte digest of the projections at it and its parts (each
table's 16-byte sum, then the meta part's 32 bytes), or ``>Q 2**64-1``,
``>Q length`` and an error text. The child answers its restored ``last_seq`` first.

The digest is kept here, on the other core, from the rows each checkpoint carries
(``projections.core.digest.DigestKeeper``): the fold pays nothing for it. The path
``:memory:`` keeps the digest only, with no database (a gateway replica's fold).
A parent that dies mid-send leaves a short frame: the child commits nothing of it and
exits at end of input.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import msgspec

from projections.core.digest import PARTS_BYTES, DigestKeeper, meta_digest, parts_of
from projections.frames import FRAME, read_frame
from projections.store import Checkpoint, Store, StoreError, keep_digest
from reducers.state import TABLES, State

__all__ = ["ProcessWriter", "end_child"]

_PIPE_SLICE = 256 * 1024  # bytes a write to the writer child, between drains
_CHILD = (
    "import sys; from projections.writer import serve; "
    "sys.exit(serve(sys.argv[1], sys.argv[2] == 'digest'))"
)
_ERROR = 2**64 - 1
MEMORY = ":memory:"
NICE = 10  # how much nicer than the fold's process the child runs (os.nice increments)
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Checkpoint).decode


class ProcessWriter:
    """Writes checkpoints through a child process; one write at a time."""

    def __init__(self, path: str | Path, *, keep_digest: bool = True) -> None:
        self.path = str(path)
        # A replay computes its digest once, at the end, from its own state: its writer
        # keeps none (the rows' hashes would be work on the way for nothing).
        self.keep_digest = keep_digest
        self.last_seq = 0
        self.digest = ""  # of the projections at last_seq, as the child computed it
        self.parts: dict[str, str] = {}  # and its parts, as projections.digests names them
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            self.path,
            "digest" if self.keep_digest else "none",
            stdin=asyncio.subprocess.PIPE,
            # Its own session: a Ctrl-C meant for ppf must not kill it before the last
            # write; it ends when its input does (the parent closing it, or dying).
            start_new_session=True,
            stdout=asyncio.subprocess.PIPE,
        )
        self.last_seq = await self._answer()

    async def _answer(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            (value,) = FRAME.unpack(await self._proc.stdout.readexactly(8))
            if value == _ERROR:
                (size,) = FRAME.unpack(await self._proc.stdout.readexactly(8))
                text = (await self._proc.stdout.readexactly(size)).decode(errors="replace")
                raise StoreError(f"checkpoint writer: {text}")
            self.digest = (await self._proc.stdout.readexactly(32)).hex()
            self.parts = parts_of(await self._proc.stdout.readexactly(PARTS_BYTES))
        except asyncio.IncompleteReadError:
            code = await self._proc.wait()
            raise StoreError(f"checkpoint writer for {self.path} exited with {code}") from None
        return int(value)

    async def write(self, cp: Checkpoint) -> int:
        """Send one checkpoint and wait until it is committed; returns its last_seq."""
        assert self._proc is not None and self._proc.stdin is not None
        stdin = self._proc.stdin
        head = _encode(msgspec.structs.replace(cp, tables={}, pending={}, parts={}))
        stdin.write(FRAME.pack(len(head)))
        stdin.write(head)
        for name in TABLES:
            pieces = [memoryview(piece) for piece in cp.table(name)]
            stdin.write(FRAME.pack(sum(len(piece) for piece in pieces)))
            # In slices: what the pipe does not take at once is copied into the
            # transport's buffer, and a big checkpoint copied in one write holds the
            # loop for as long.
            for blob in pieces:
                for start in range(0, len(blob), _PIPE_SLICE):
                    stdin.write(blob[start : start + _PIPE_SLICE])
                    await stdin.drain()
        self.last_seq = await self._answer()
        return self.last_seq

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await end_child(proc, 30)


async def end_child(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """Close a pipe-fed child's input (it finishes what it has, then exits); kill it
    when it does not exit in ``timeout_s``."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        async with asyncio.timeout(timeout_s):
            await proc.wait()
    except TimeoutError:
        import structlog  # here: the child imports this module and need not load it

        structlog.get_logger("ppf.fold").warning("child_killed", pid=proc.pid, after_s=timeout_s)
        proc.kill()
        await proc.wait()


def serve(path: str, digests: bool = True) -> int:
    """The child's loop (see the module docstring)."""
    # Checkpoints are background work: where cores are few, the fold and the requests it
    # serves go first (docs/decisions.md, The fold).
    with contextlib.suppress(OSError):
        os.nice(NICE)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    store = None
    keeper, meta, last_seq = DigestKeeper(), "", 0
    try:
        if path != MEMORY:
            store = Store(path)
            if digests:
                keeper, meta = store.digest_keeper()
            last_seq = store.last_seq
    except StoreError as exc:
        text = str(exc).encode()
        out.write(FRAME.pack(_ERROR) + FRAME.pack(len(text)) + text)
        out.flush()
        return 1
    meta = meta or meta_digest(State())
    out.write(FRAME.pack(last_seq) + bytes.fromhex(keeper.value(meta)) + keeper.parts(meta))
    out.flush()
    try:
        while (data := read_frame(inp)) is not None:
            tables = {}
            for name in TABLES:
                blob = read_frame(inp)
                if blob is None:
                    return 0  # the parent died mid-send: commit nothing of it
                tables[name] = blob
            try:
                cp = msgspec.structs.replace(_decode(data), tables=tables)
                if store is not None:
                    store.write(cp)
                if digests:
                    keep_digest(keeper, cp)
                if digests:
                    said = bytes.fromhex(keeper.value(cp.meta_digest)) + keeper.parts(
                        cp.meta_digest
                    )
                else:
                    said = bytes(32 + PARTS_BYTES)
                out.write(FRAME.pack(cp.last_seq) + said)
            except Exception as exc:  # reported to the parent, which stops its fold
                text = repr(exc).encode()
                out.write(FRAME.pack(_ERROR) + FRAME.pack(len(text)) + text)
            out.flush()
    finally:
        if store is not None:
            store.close()
    return 0
