"""A long sequence held as tuples of at most a step's items, for the collector's sake.

CPython's collector walks a new tuple whole at its first young collection (reading
each item's type, to see whether it may stop tracking the tuple). A pool view's
orders hold every view of the pool, and in latency order they lie scattered in memory,
so those walks were the longest holds of the gateway's loop (docs/decisions.md, The
gateway). Held as
parts of at most ``projections.core.poolview.STEP`` items, made a step at a time, each
young collection walks only the parts made since the one before; once walked, a part
of untracked views is untracked itself and never walked again.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, chain
from typing import Any, Generic, TypeVar

__all__ = ["Chunks"]

T = TypeVar("T")


class Chunks(Generic[T]):
    """The items of ``parts`` in order (empty parts are left out)."""

    __slots__ = ("ends", "parts")

    def __init__(self, parts: Iterable[tuple[T, ...]] = ()) -> None:
        self.parts = tuple(p for p in parts if p)
        self.ends = tuple(accumulate(len(p) for p in self.parts))  # past each part's last

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self.parts)

    def between(self, lo: int, hi: int) -> Iterator[T]:
        """The items at positions ``lo`` to ``hi`` (not included), in order."""
        i = bisect.bisect_right(self.ends, lo)
        while lo < hi and i < len(self.parts):
            start = self.ends[i] - len(self.parts[i])
            yield from self.parts[i][lo - start : hi - start]
            lo, i = self.ends[i], i + 1

    def bisect_right(self, x: Any, key: Callable[[T], Any]) -> int:
        """``bisect.bisect_right`` of the whole, sorted by ``key``: the position of the
        first item whose key is greater than ``x``."""
        i = bisect.bisect_right(self.parts, x, key=lambda part: key(part[-1]))
        if i == len(self.parts):
            return len(self)
        start = self.ends[i] - len(self.parts[i])
        return start + bisect.bisect_right(self.parts[i], x, key=key)
