"""The operator's check budget as this gateway hands it out to checkers."""

from __future__ import annotations

__all__ = ["CheckBudget"]


class CheckBudget:
    """The operator's check budget (``recheck_budget_per_hour``), as a bucket that holds
    five minutes' checks (at least one) and refills evenly: what this gateway hands out
    to checkers. (It held an hour's: a gateway just started could hand out twice the
    hour's budget in its first hour.) With several gateways each has the whole budget (a
    fleet-wide one would be a ledger entry: not built)."""

    BURST_S = 300

    def __init__(self) -> None:
        self._level: float | None = None  # checks that may go out now; None: full
        self._at = 0.0

    def _cap(self, per_hour: int) -> float:
        return max(1.0, per_hour * self.BURST_S / 3_600)

    def available(self, per_hour: int, now_s: float) -> float:
        if not per_hour:
            return float("inf")
        cap = self._cap(per_hour)
        level = cap if self._level is None else self._level
        level = min(cap, level + (now_s - self._at) * per_hour / 3_600)
        self._level, self._at = level, now_s
        return level

    def take(self, want: int, per_hour: int, now_s: float) -> int:
        """Up to ``want`` checks (all of them while there is no budget)."""
        if not per_hour:
            return want
        got = max(0, min(want, int(self.available(per_hour, now_s))))
        self._level = (self._level or 0.0) - got
        return got

    def give_back(self, unused: int, per_hour: int) -> None:
        if per_hour and unused > 0 and self._level is not None:
            self._level = min(self._cap(per_hour), self._level + unused)
