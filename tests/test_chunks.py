"""A sequence held in parts answers as the one tuple of its items would."""

from __future__ import annotations

import bisect
import gc

from hypothesis import given
from hypothesis import strategies as st

from ops.collector import collect_young
from projections.core import poolview
from projections.core.chunks import Chunks
from projections.core.poolview import build, building, dropping, held
from projections.foreground import Foreground, drive
from tests.test_poolview import _big_pool

parts_of_sorted = st.lists(st.lists(st.integers(0, 50), max_size=6), max_size=8).map(
    lambda parts: [tuple(p) for p in parts]
)


def _sorted_parts(parts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    items = iter(sorted(x for p in parts for x in p))
    return [tuple(next(items) for _ in p) for p in parts]


@given(parts=parts_of_sorted, lo=st.integers(-2, 60), hi=st.integers(-2, 60))
def test_parts_answer_as_the_whole(parts: list[tuple[int, ...]], lo: int, hi: int) -> None:
    """Length, order, a range of positions: the same as of the items in one tuple."""
    whole = tuple(x for p in parts for x in p)
    chunks = Chunks(parts)
    assert len(chunks) == len(whole) and tuple(chunks) == whole
    lo, hi = max(0, lo), max(0, hi)
    assert tuple(chunks.between(lo, hi)) == whole[lo:hi]


@given(parts=parts_of_sorted, x=st.integers(-1, 52), newest_first=st.booleans())
def test_bisect_of_parts_is_bisect_of_the_whole(
    parts: list[tuple[int, ...]], x: int, newest_first: bool
) -> None:
    """Sorted across its parts by a key (ties across a border included), the insertion
    point after ``x`` is the whole's."""
    parts = _sorted_parts(parts)
    if newest_first:  # descending, as by_last_seen is, bisected by the negated value
        parts = [p[::-1] for p in reversed(parts)]
    whole = tuple(v for p in parts for v in p)

    def key(v: int) -> int:
        return -v if newest_first else v

    assert Chunks(parts).bisect_right(x, key=key) == bisect.bisect_right(whole, x, key=key)


def test_a_snapshot_holds_no_container_longer_than_a_step() -> None:
    """Every order and index of a snapshot of several steps' rows is held in parts of at
    most ``STEP`` views (the collector walks each once, a step's at a time), and a
    retired snapshot's parts are let go a step's references at a time."""
    state = _big_pool(3 * poolview.STEP + 17)
    view = build(state)
    holding = held(view)
    parts = [p for sequence in holding for p in sequence]
    assert len(view.by_latency) == len(view.by_last_seen) == len(state.proxies)
    assert len(view.by_latency.parts) == -(-len(state.proxies) // poolview.STEP) > 1
    assert max(len(p) for p in parts) <= poolview.STEP
    refs = sum(len(p) for p in parts) + len(parts)  # the views', and the parts' own
    steps = sum(1 for _ in dropping(holding))
    # Each step lets go of whole parts, at least STEP references but the last step's.
    assert not holding and refs // (2 * poolview.STEP) <= steps <= -(-refs // poolview.STEP)


async def test_a_build_beside_requests_leaves_at_most_a_steps_parts_young() -> None:
    """Driven beside a foreground whose ``between`` is the serving processes' young
    collection, a build's steps are collected as they go: no young collection meets
    more than the parts of a step or two (left to the collector's own count, it met
    them all at once)."""
    state = _big_pool(6 * poolview.STEP)
    young: list[int] = []

    def between() -> None:
        young.append(sum(len(o) for o in gc.get_objects(0) if type(o) is tuple))
        collect_young()

    view, _ = await drive(building(state), 0.0, foreground=Foreground(between))
    assert len(young) > 6 * 2 and max(young) <= 3 * poolview.STEP
    assert len(view.by_latency) == len(state.proxies)
