"""The statistics the benchmarks report their bars with (ops/bench/versus.py): pure
logic, checked against the binomial law it stands on and by simulation."""

from __future__ import annotations

import math
import random

from ops.bench.compare import median_ci, pct_by_run, pct_of_medians


def test_median_ci_takes_the_order_statistics_of_the_tables() -> None:
    """The ranks of the published tables for a 95 % interval of the median (n=6: 1st and
    6th; n=20: 6th and 15th; n=41: 14th and 28th), whatever order the values come in;
    none under 6 values."""
    for n, (lo, hi) in {6: (1, 6), 20: (6, 15), 41: (14, 28)}.items():
        assert median_ci([float(v) for v in range(n, 0, -1)]) == (lo, hi)
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 93.75 % at best


def test_median_ci_is_the_narrowest_interval_that_keeps_its_level() -> None:
    """For every n from 6 to 79: the chance of fewer than k values under the median is at
    most 2.5 %, and one rank further in it would not be."""
    for n in range(6, 80):
        values = [float(v) for v in range(1, n + 1)]
        interval = median_ci(values)
        assert interval is not None
        k = int(interval[0])
        assert interval[1] == n + 1 - k
        below = sum(math.comb(n, i) for i in range(k)) / 2**n  # P(B < k)
        assert below <= 0.025 < below + math.comb(n, k) / 2**n


def test_median_ci_covers_the_median_as_often_as_it_says() -> None:
    """Sets of 15 draws of a skewed law: the interval holds the true median in at least
    95 % of 4,000 sets."""
    rng = random.Random(7)
    median = math.log(2)  # of the exponential law with rate 1: skewed, as run times are
    trials, covered = 4000, 0
    for _ in range(trials):
        interval = median_ci([rng.expovariate(1.0) for _ in range(15)])
        assert interval is not None
        covered += interval[0] <= median <= interval[1]
    assert covered / trials >= 0.95  # 96.5 % for n=15 (an interval one rank in: 88 %)


def test_percent_helpers() -> None:
    """The percent of the medians, and run by run, to one decimal."""
    assert pct_of_medians([10.0, 12.0, 11.0], [11.0, 12.1, 13.0]) == 10.0
    assert pct_by_run([10.0, 20.0], [10.5, 19.0]) == [5.0, -5.0]
