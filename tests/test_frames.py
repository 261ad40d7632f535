"""eventlog/_frames.c against its Python twin, ``_scan_py``.

The stream reader parses runs of JetStream data frames in C and hands everything else
to its general path. The contract is the twin's, answer for answer: the same messages,
the same position, the same consumer sequence expected next and the same reason to
stop, over buffers cut at every byte (a read ends anywhere), with other frames mixed
in, a skipped consumer sequence, and a stream sequence past ``until``.
"""

from __future__ import annotations

import random

import pytest

from eventlog import stream
from eventlog.stream import _GAP, _MORE, _UNTIL, _scan_py, native_frames

NO_NATIVE = (
    "eventlog/_frames.c was not built: install a C compiler (apt-get install gcc) and reinstall"
)


def _frame(subject: bytes, sseq: int, cseq: int, payload: bytes, header: bytes = b"") -> bytes:
    hdr = b"NATS/1.0\r\n" + header + b"\r\n"
    ts_ns = 1_790_000_000_123_456_789 + sseq * 1_000_000
    reply = b"$JS.ACK.PPF.c1.1.%d.%d.%d.0" % (sseq, cseq, ts_ns)
    total = len(hdr) + len(payload)
    return b"HMSG %s 1 %s %d %d\r\n%s%s\r\n" % (subject, reply, len(hdr), total, hdr, payload)


def _log(rng: random.Random, n: int) -> bytes:
    """n data frames with statuses, PINGs and an API reply mixed in."""
    out = []
    for i in range(1, n + 1):
        subject = b"ppf.in.w%d.proxy.%d-0-0-1_80" % (rng.randrange(9), i)
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
        out.append(_frame(subject, 1000 + i, i, payload))
        other = rng.random()
        if other < 0.1:
            status = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: %d\r\n\r\n" % i
            out.append(b"HMSG _PPF.fh.x 1 %d %d\r\n%s\r\n" % (len(status), len(status), status))
        elif other < 0.15:
            out.append(b"PING\r\n")
        elif other < 0.18:
            out.append(b'MSG _PPF.fh.x.api 2 8\r\n{"a": 1}\r\n')
    return b"".join(out)


def _both(data: bytes, pos: int, expect: int, until: int) -> tuple[object, object]:
    native: list[object] = []
    twin: list[object] = []
    a = stream._frames_scan(data, pos, expect, until, native)
    b = _scan_py(data, pos, expect, until, twin)  # type: ignore[arg-type]
    return (a, native), (b, twin)


needs_native = pytest.mark.skipif(not native_frames(), reason=NO_NATIVE)


@needs_native
def test_the_native_scan_equals_the_twin_on_buffers_cut_anywhere() -> None:
    """Every prefix of a mixed stream, scanned from every frame boundary the twin reaches."""
    data = _log(random.Random(7), 40)
    assert len(data) > 2000
    for cut in range(len(data) + 1):
        buf = data[:cut]
        pos, expect = 0, 1
        while True:
            native, twin = _both(buf, pos, expect, 0)
            assert native == twin, cut
            (pos_after, expect, status), _ = twin  # type: ignore[misc]
            assert status == _MORE
            if pos_after >= len(buf):
                break
            # Step over the frame the run stopped at, as the general path would.
            nxt = buf.find(b"\r\n", pos_after)
            if nxt < 0:
                break
            head = buf[pos_after:nxt].split(b" ")
            pos = nxt + 2 + (int(head[-1]) + 2 if head[0] in (b"HMSG", b"MSG") else 0)
            if pos > len(buf):
                break


@needs_native
def test_the_native_scan_stops_where_the_twin_stops() -> None:
    """A skipped consumer sequence and a stream sequence past ``until`` stop both at it."""
    frames = [_frame(b"ppf.a", 100 + i, i, b"x" * i) for i in range(1, 6)]
    gap = frames[0] + frames[1] + _frame(b"ppf.a", 103, 4, b"late")
    native, twin = _both(gap, 0, 1, 0)
    assert native == twin
    (pos, expect, status), got = twin  # type: ignore[misc]
    assert (status, expect, len(got)) == (_GAP, 3, 2)
    assert pos == len(frames[0] + frames[1])
    data = b"".join(frames)
    native, twin = _both(data, 0, 1, 103)
    assert native == twin
    (pos, expect, status), got = twin  # type: ignore[misc]
    assert (status, [m[0] for m in got]) == (_UNTIL, [101, 102, 103])  # type: ignore[index]
    assert got[0] == (101, 1_790_000_000_224, b"ppf.a", b"x")  # type: ignore[index]


@needs_native
def test_the_native_scan_leaves_malformed_frames_to_the_general_path() -> None:
    """Frames that are not the common form, or lie about their sizes, are not taken."""
    good = _frame(b"ppf.a", 5, 1, b"ok")
    assert b" 12 14\r\n" in good
    for bad in (
        good.replace(b" 1 $JS", b" 2 $JS"),  # another subscription
        good.replace(b"$JS.ACK.PPF.c1.", b"$JS.ACK.PPF."),  # a token short
        good.replace(b".0 ", b". "),  # no pending count
        b"HMSG  1 " + good[7:],  # no subject
        good.replace(b"HMSG", b"MSG "),
        good.replace(b" 12 14\r\n", b" 12 99999999999999999999\r\n"),  # 20 digits
        b"PING\r\n" + good,
    ):
        native, twin = _both(bad, 0, 1, 0)
        assert native == twin, bad
        assert twin[0] == (0, 1, _MORE), bad  # type: ignore[index]
