"""Pipeline rates over 1, 5 and 15 minutes, sampled from the projections' own counts.

Per-type totals come from the agents projection (which counts every event per agent),
so the fold's hot path pays nothing for them; a sample every few seconds keeps the
windows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from reducers import State

__all__ = ["PipelineStats", "Sample"]

WINDOWS_S = {"1m": 60, "5m": 300, "15m": 900}
RATED = ("Leased", "Fetched", "Fetched.failed", "Extracted", "ProxyWorked", "ProxyFailed")


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    applied: int
    totals: dict[str, int]


class PipelineStats:
    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: deque[Sample] = deque(maxlen=int(900 / every_s) + 2)

    def sample(self, state: State, applied: int) -> None:
        now = time.monotonic()
        if self.samples and now - self.samples[-1].at < self.every_s:
            return
        totals: dict[str, int] = {}
        for agent in state.agents.values():
            for kind, n in agent.counts.items():
                totals[kind] = totals.get(kind, 0) + n
        self.samples.append(Sample(now, applied, totals))

    def rates(self) -> dict[str, dict[str, float]]:
        """Per-second rates of folded events and of each rated type, per window."""
        out: dict[str, dict[str, float]] = {}
        if len(self.samples) < 2:
            return {w: {"fold": 0.0, **dict.fromkeys(RATED, 0.0)} for w in WINDOWS_S}
        last = self.samples[-1]
        for name, span in WINDOWS_S.items():
            first = next((s for s in self.samples if last.at - s.at <= span), self.samples[0])
            dt = max(last.at - first.at, 1e-9)
            rates = {"fold": (last.applied - first.applied) / dt}
            for kind in RATED:
                rates[kind] = (last.totals.get(kind, 0) - first.totals.get(kind, 0)) / dt
            out[name] = {k: round(v, 2) for k, v in rates.items()}
        return out
