"""ops/bench/inmemory.py: the two streams callgrind compares differ by their Located
and nothing else, times included."""

from __future__ import annotations

from events import Located, decode
from ops.bench.inmemory import fold_in_memory, messages


def test_the_streams_share_one_timeline_and_differ_by_their_located() -> None:
    """Every event of the plain stream is in the located one, in the same order, on the
    same subject at the same time (their ids differ: the synthetic stream counts the
    Located among its ids); what is left is one Located per distinct proxy; both fold
    whole."""
    plain, located = messages(3_000, False), messages(3_000, True)
    extra = [m for m in located if isinstance(decode(m[3]), Located)]
    shared = [m for m in located if not isinstance(decode(m[3]), Located)]

    def seen(stream: list[tuple[int, int, bytes, bytes]]) -> list[tuple[int, bytes, str]]:
        return [(ts, s, type(decode(p)).__name__) for _, ts, s, p in stream]

    assert seen(shared) == seen(plain)
    ips = {decode(m[3]).ip for m in extra}  # type: ignore[attr-defined]
    assert len(extra) == len(ips) > 100
    assert plain[-1][1] > plain[0][1]  # the timeline moves
    for stream in (plain, located):
        assert fold_in_memory(stream, size=500).last_seq == len(stream)
