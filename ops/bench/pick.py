"""``ppf bench pick``: the CPU of one pick of the endpoint's pool (endpoint/router/choose.py)
for a site that every proxy in the pool is known to get through to, by pool size. This is
a busy site after a while, the case where a pick that walked its candidates cost the most.

Each measurement runs in a process of its own. With ``--versus DIR``, another
checkout's pick is measured the same way, and the two trees take turns for each size in
each run: the machine's slow and fast moments fall on both.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.bench.harness import checkout
from ops.bench.options import Pick

__all__ = ["bench_pick"]

# Runs inside either tree (cwd, first on the path): prints the CPU µs a pick.
_CHILD = r"""
import json, random, sys, time
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import Want
size, picks = int(sys.argv[1]), int(sys.argv[2])
pool = Pool(rng=random.Random(1))
pool.replace(
    Upstream(f"45.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", 8080, "http", latency_ms=100)
    for n in range(size)
)
for up in list(pool.upstreams.values()):
    pool.got_through(up, "shop.example")
want = Want("bench")
start = time.process_time()
for _ in range(picks):
    pool.pick(want, tunnel=False, now=1.0, site="shop.example")
print(json.dumps((time.process_time() - start) / picks * 1e6))
"""


def _pick_us(tree: Path, size: int, picks: int) -> float:
    path = os.pathsep.join([str(tree), *sys.path[1:]])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size), str(picks)],
        cwd=tree, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=600, check=True,
    )  # fmt: skip
    return float(json.loads(done.stdout))


def _r(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


def bench_pick(options: Pick) -> dict[str, Any]:
    sizes = [int(s) for s in options.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        raise SystemExit("--sizes: pool sizes of at least 1, comma-separated")
    # Every pick here is in one minute, and a proxy takes at most SITE_BUDGET (120)
    # requests a minute to one site: past that the known ones run out.
    if options.picks > 100 * min(sizes):
        raise SystemExit(f"--picks: at most 100 a proxy of the smallest pool ({min(sizes)})")
    here = Path(__file__).resolve().parents[2]
    other = checkout(options.versus) if options.versus else None
    trees = [here] if other is None else [here, other]
    sides = range(len(trees))  # DIR may be this tree itself
    us: dict[tuple[int, int], list[float]] = {(s, t): [] for s in sizes for t in sides}
    for run in range(options.runs):
        for size in sizes:
            for side in sides if run % 2 == 0 else sides[::-1]:
                us[size, side].append(_pick_us(trees[side], size, options.picks))
    out: dict[str, Any] = {"picks": options.picks, "runs": options.runs}
    for size in sizes:
        mine = us[size, 0]
        row: dict[str, Any] = {"us": round(statistics.median(mine), 1), "by_run": _r(mine)}
        if other is not None:
            theirs = us[size, 1]
            row["versus_us"] = round(statistics.median(theirs), 1)
            row["versus_by_run"] = _r(theirs)
            row["x"] = round(statistics.median(mine) / statistics.median(theirs), 3)
        out[f"pool_{size}"] = row
    return out
