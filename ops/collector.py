"""The garbage collector's settings for the processes that fold the log.

CPython starts a young collection every 700 net allocations of tracked objects, a
setting for small programs: folding 1,000,000 events from memory ran it 1,606 times,
at the settings below 120. The projections themselves are untracked (rows are
``gc=False`` Structs), so collecting less often costs little memory. Every process
that folds (``ppf up``, ``ppf gateway``, ``ppf fold``, ``ppf replay``) and the
benchmarks of the fold run with these settings.
"""

from __future__ import annotations

import gc

from reducers.state import State

__all__ = ["collect_young", "for_folding", "freeze_projections", "freeze_state"]

# Young collections every 10,000 net allocations, not 700: every request allocates, and
# at 700 the collector's pauses set the lease p99. Not 100,000 either: the fold's
# changed-row keys are young tuples, and collecting that many at once holds the loop
# (docs/decisions.md, The fold).
THRESHOLDS = (10_000, 50, 1000)


def for_folding() -> None:
    """Set the collector for a process that folds (process-wide, so callers at its edge
    call it: the commands that serve or replay, and the fold's benchmarks)."""
    gc.set_threshold(*THRESHOLDS)


def freeze_state() -> None:
    """Once a serving process has built its state (restored from its checkpoint, before
    the fold starts): collect once, then freeze everything that exists, so no later
    collection walks the projections' containers. A full collection visits every entry
    of every tracked dict and set, untracked rows included, so it grows with the pool
    (docs/decisions.md, The fold). Frozen objects are never
    collected; what exists at this point is the state, which lives as long as the
    process."""
    gc.collect()
    gc.freeze()


def collect_young() -> None:
    """A young collection, between two steps of the work a serving process does beside
    its requests (the fold's slices, a snapshot build's or a checkpoint's steps:
    ``projections.foreground.Foreground.between``).

    CPython counts the young generation as allocations minus deallocations of any
    tracked object, old ones included. The fold frees an old tuple for every new one it
    makes (a row's agents, sources, samples), so the count stays low while the young
    list grows, and a collection came at twenty times the threshold, in one go
    (docs/decisions.md, The fold). Collected
    after every slice (a few milliseconds of allocations), the same work is done in
    pieces of a millisecond or so."""
    gc.collect(0)


_PIN = object()


def freeze_projections(state: State) -> None:
    """Keep the collector off the projections' containers (a million entries each at a
    million proxies) for good: ``gc.freeze`` exempts what exists, but a full collection
    first untracks a dict whose entries are all untracked (rows are gc=False Structs),
    and the next new key tracks it again as a young object, walked whole by each young
    collection (docs/decisions.md, The fold). So each dict holds a tracked value for a moment,
    which tracks it, before the freeze; a tracked dict is only untracked by a full
    collection, and a frozen one is never collected."""
    gc.collect()
    for value in vars(state).values():
        if isinstance(value, dict):
            value[_PIN] = []
            del value[_PIN]
    gc.freeze()
