"""``ppf bench fold-sites``: the fold with site verdicts in a tenth of its rounds, against
another tree's fold (the commit before per-site standing, say) without them.

The pinned workload (ops/bench/workload.py) as rounds, encoded once a run as the log's
messages, folded in one process by ``projections.folder.Folder`` (the fold's pure part:
no NATS, no DuckDB). Each run folds both sides, each in a new interpreter on its own
tree, interleaved A B A B: ``tree`` without verdicts, this tree with a ``SitesChecked``
round after every tenth round (one result per proxy of that round, on one of ten
sites, from a trusted checker, as probes riding on rechecks would say).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.bench.compare import median_ci, pct_by_run, pct_of_medians
from ops.bench.options import FoldSites

__all__ = ["bench_fold_sites"]

# Run in a new interpreter on either tree: both have the workload, the folder and
# subject_for; only this tree is asked for verdicts (``sites``).
_FOLD = """
import sys, time
from events import encode, subject_for
from ops.bench.workload import steps
from projections.folder import Folder
from reducers import State
observations, proxies, sites = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "sites"
events = []
for n, step in enumerate(steps(observations, proxies=proxies, seed=1)):
    events.extend(step.rounds)
    if sites and n % 10 == 9:
        from ops.bench.sitefold import verdicts_of
        events.extend(verdicts_of(step.rounds, n))
messages = [
    (i, 1_800_000_000_000 + i, subject_for(e).encode(), encode(e))
    for i, e in enumerate(events, 1)
]
folder = Folder(State(), on_reject=lambda *a: None)
t0 = time.perf_counter()
for start in range(0, len(messages), 500):
    folder.apply(messages[start:start + 500])
print(time.perf_counter() - t0, len(messages))
"""


def verdicts_of(rounds: list[Any], n: int) -> list[Any]:
    """A trusted checker's verdicts on the proxies of ``rounds``, on one of ten sites."""
    from events import ProxiesChecked, SiteResult, SitesChecked
    from events.ids import uuid7, uuid7_ms

    results = [
        SiteResult(ip=r.ip, port=r.port, site=f"site{n % 10}.example.com", through=1, status=2)
        for batch in rounds
        if isinstance(batch, ProxiesChecked)
        for r in batch.results
    ][:500]
    if not results:
        return []
    last = rounds[-1]  # its time, and a random part of the workload's never
    at = uuid7_ms(last.id)
    made = uuid7(at, (1 << 79 | n).to_bytes(10, "big"))
    return [SitesChecked(id=made, agent="c000", at=last.at, key="s000", results=results)]


def _fold_s(tree: Path, observations: int, proxies: int, sites: bool) -> tuple[float, int]:
    argv = [sys.executable, "-c", _FOLD, str(observations), str(proxies)]
    argv.append("sites" if sites else "plain")
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=3600, check=True)
    seconds, messages = out.stdout.split()
    return float(seconds), int(messages)


def bench_fold_sites(fold: FoldSites) -> dict[str, Any]:
    tree, observations, proxies, runs = fold.tree, fold.observations, fold.proxies, fold.runs
    here = Path(__file__).resolve().parents[2]
    before: list[float] = []
    after: list[float] = []
    sizes: tuple[int, int] = (0, 0)
    for _ in range(runs):  # A B A B
        a, a_messages = _fold_s(tree, observations, proxies, sites=False)
        b, b_messages = _fold_s(here, observations, proxies, sites=True)
        before.append(round(a, 3))
        after.append(round(b, 3))
        sizes = (a_messages, b_messages)
    return {
        "tree": str(tree),
        "observations": observations,
        "messages": {"without": sizes[0], "with_verdicts": sizes[1]},
        "seconds": {"without": before, "with_verdicts": after},
        "slower_pct": pct_of_medians(before, after),
        "slower_pct_by_run": pct_by_run(before, after),
        "median_ci_with_verdicts": median_ci(after),
    }
