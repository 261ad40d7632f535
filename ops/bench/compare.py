"""Comparing two sides measured run by run (old and new code, interleaved): the
medians' ratio, the ratio run by run, and a confidence interval for a median."""

from __future__ import annotations

import math
import statistics

__all__ = ["median_ci", "pct_by_run", "pct_of_medians"]


def pct_of_medians(before: list[float], after: list[float]) -> float:
    """How much ``after``'s median is above ``before``'s, in percent (one decimal)."""
    return round((statistics.median(after) / statistics.median(before) - 1) * 100, 1)


def pct_by_run(before: list[float], after: list[float]) -> list[float]:
    """The same, run by run: each run's two sides saw the same moments of the machine."""
    return [round((b / a - 1) * 100, 1) for a, b in zip(before, after, strict=True)]


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A confidence interval for the median of what ``values`` sample, from their order
    statistics alone (no assumption of a distribution): the k-th smallest and the k-th
    largest, k the largest for which the chance that fewer than k of n values fall below
    the median, ``P(Binomial(n, 1/2) < k)``, is at most half of ``1 - level``. None when
    there are too few values for that (fewer than 6 at 95 %).

    Why: a run-by-run median says where the runs lie, not how sure it is; a bar such as
    "adds < 5 %" is met as measured when the whole interval lies under it.
    """
    n = len(values)
    tail, below, k = (1 - level) / 2, 0.0, 0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(B = k): now P(B <= k) = P(B < k + 1)
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]
