"""What the endpoint did, counted by outcome: for ``/metrics`` and ``ppf bench serve``."""

from __future__ import annotations

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

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
