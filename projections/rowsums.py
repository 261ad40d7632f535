"""The sums of a snapshot's rows, and the pool's composition, computed by a child process
on the other core while the loader decodes the same rows (``projections/snapshot.py``):
at a million proxies they are 1.7 s and 0.85 s of the load.

The child is started before the snapshot is fetched, so its interpreter is up by then;
it imports this module and what it needs alone (the package's names are lazy: DuckDB
and the folder would add 0.3 s to its start, and a gateway's start waits on it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import threading
from typing import Any

import msgspec

from eventlog.protocol import SnapshotError
from projections import row_strings
from projections.core.digest import table_sum
from projections.frames import FRAME, read_frame
from reducers.pool import Composition, counted

__all__ = ["Counted", "RowSums", "array_sum", "serve_sums"]

_CHILD = "from projections.rowsums import serve_sums; serve_sums()"
_F_SETPIPE_SZ = 1031  # Linux's fcntl: a larger pipe, fewer wake-ups of the child
_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])
_HEAD = msgspec.msgpack.Decoder(tuple[list[str], list[str]])  # (strings, tables)
_COUNTS = msgspec.msgpack.Decoder(tuple[list[Any], list[Any]])


def array_sum(array: bytes | msgspec.Raw) -> int:
    """A table's part of the digest from its array's bytes: each row's bytes hashed as
    they are stored, never decoded and encoded again."""
    return table_sum(_RAWS.decode(array))


class Counted(msgspec.Struct):
    """What ``reducers.pool.counted`` reads of a proxy row."""

    last_seen: int
    proto: str
    anonymity: str = ""
    country: str = ""
    fail_streak: int = 0


class RowSums:
    """The child: started by ``RowSums()``; ``send`` hands it the tables to sum;
    ``result`` waits for their sums and the pool's composition. A blocking write of a
    whole table holds no GIL (one ``os.write``, which releases it), so the child reads
    at memory speed while the decoding thread runs."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._sender: threading.Thread | None = None
        self._tables: list[str] = []

    def send(self, tables: dict[str, msgspec.Raw], strings: list[str]) -> None:
        """Hand the child ``tables`` (each an array of rows, not packed) and the
        snapshot's list of the rows' strings."""
        self._tables = list(tables)
        self._sender = threading.Thread(
            target=self._send, args=(tables, strings), name="ppf-snapshot-sums", daemon=True
        )
        self._sender.start()

    def _send(self, tables: dict[str, msgspec.Raw], strings: list[str]) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        fd = stdin.fileno()
        with contextlib.suppress(OSError):  # not Linux, or a lower limit: the default
            fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
        try:
            for frame in [msgspec.msgpack.encode((strings, self._tables)), *tables.values()]:
                view = memoryview(frame)
                os.write(fd, FRAME.pack(len(view)))
                while view:
                    view = view[os.write(fd, view) :]
        except OSError:
            pass  # the child is gone: result() says so
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def result(self) -> tuple[dict[str, int], tuple[Composition, Composition]]:
        """(each table's sum, the pool's (composition, failing))."""
        stdout = self._proc.stdout
        assert stdout is not None
        out = stdout.read()  # until the child ends
        if self._sender is not None:
            self._sender.join()
        code = self._proc.wait()
        head = 16 * len(self._tables)
        if code != 0 or len(out) <= head:
            raise SnapshotError(f"the snapshot's row sums were not computed (child exit {code})")
        sums = {t: int.from_bytes(out[16 * i : 16 * i + 16]) for i, t in enumerate(self._tables)}
        composition, failing = _COUNTS.decode(out[head:])
        return sums, (Composition.from_counts(composition), Composition.from_counts(failing))

    def close(self) -> None:
        """End the child, whatever happened (a decode failed before its result)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._sender is not None:
            self._sender.join()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def serve_sums() -> None:
    """The child of ``RowSums``: the snapshot's list of the rows' strings and the names
    of the tables in, then each table's bytes in and its sum out, in that order; then
    the proxies' composition and failing part as msgpack. The composition's columns
    share the list's strings as the loader's rows do, which saves 0.2 s of decoding and
    0.15 s of counting at a million rows."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    pool: tuple[Composition, Composition] = (Composition(), Composition())
    head = read_frame(inp)
    if head is None:
        sys.exit(1)  # a short frame: the loader is gone, or gave up on us
    strings, tables = _HEAD.decode(head)
    for table in tables:
        blob = read_frame(inp)
        if blob is None:
            sys.exit(1)
        out.write(array_sum(blob).to_bytes(16, "big"))
        if table == "proxies":
            pool = counted(row_strings.decode_as(Counted, blob, strings)[0])
    out.write(msgspec.msgpack.encode((pool[0].counts(), pool[1].counts())))
    out.flush()
