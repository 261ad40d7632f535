"""What the endpoint did, counted by outcome: for ``/metrics`` and ``ppf bench serve``."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Outcomes"]


@dataclass
class Outcomes:
    """What the endpoint did, by outcome, in every room (``client_error``,
    ``turned_away``, ``hedge_won``...)."""

    counts: dict[str, int] = field(default_factory=dict)
    # Our own time from a request read to its sending upstream, the latest 1,000.
    added_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1_000))
    # From a request read to the first byte of its answer going back (a tunnel's: to its
    # being open), the latest 1,000: what the gateway's dashboard shows (endpoint/figures.py).
    first_byte_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1_000))

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def first_byte(self, read_at: float) -> None:
        self.first_byte_ms.append((time.perf_counter() - read_at) * 1000)
