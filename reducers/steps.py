"""Work done in steps: a generator that yields between steps and returns its result.

A caller that shares its thread (the live fold, the gateway's query snapshots, a state
snapshot's encoding) gives way between steps; ``at_once`` is every other caller.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

__all__ = ["at_once"]

T = TypeVar("T")


def at_once(steps: Generator[None, None, T]) -> T:
    """Every step of ``steps`` without a pause; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
