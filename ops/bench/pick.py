"""``ppf bench pick``: the CPU of one pick of the endpoint's pool (endpoint/router/choose.py)
by pool size, at five sites where a pick that walked its candidates cost the most:
``known``, a site every proxy in the pool is known to get through to (a busy site after
a while); ``strict``, a site that turned 95 % of them away and none is known to get
through to yet (a strict site while the endpoint learns it); ``spent``, a site whose
rate limit lets each proxy one request a minute, asked a hundred times a second, so the
pool has spent every budget there within seconds of each minute (ten at 1,000 proxies;
a pick then takes any the site has not turned away); and ``closed``, a site that turned
every proxy away (one that blocks open proxies, as the fleet tells each endpoint): each
pick answers none; and ``own``, where the picking consumer itself met a refusal through
every proxy (its share for everyone, the rest for its own picks alone: a consumer doing
so on purpose), each pick leaving out what its refusals left out (router/charges.py
``Charges.left_out``).

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
import asyncio, json, random, sys, time
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import Want
from endpoint.router.router import Router
size, picks, site = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pool = Pool(rng=random.Random(1))
pool.replace(
    Upstream(f"45.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", 8080, "http", latency_ms=100)
    for n in range(size)
)
draw = random.Random(2)
router = Router(pool, lambda name, token: asyncio.sleep(0, True))
for up in list(pool.upstreams.values()):
    if site == "own":  # the bench's own refusals there, past its share
        router.charges.turned_away("bench", up, site, 0.5)
    elif site == "known":
        pool.got_through(up, site)
    elif site == "spent":
        up.tolerated[site] = 1  # what a site's rate limit taught: one request a minute
    elif site == "closed":
        pool.turned_away(up, site, now=0.0)
    elif draw.random() < 0.95:
        pool.turned_away(up, site, now=0.0)
want = Want("bench")
step = 0.01 if site == "spent" else 0.3
start = time.process_time()
for i in range(picks):
    now = 1.0 + i * step
    left_out = router.charges.left_out("bench", site, now) if site == "own" else frozenset()
    pool.pick(want, tunnel=False, now=now, exclude=left_out, site=site)
print(json.dumps((time.process_time() - start) / picks * 1e6))
"""


SITES = ("known", "strict", "spent", "closed", "own")
_PICKS = 6_000


def _pick_us(tree: Path, size: int, picks: int, site: str) -> float:
    path = os.pathsep.join([str(tree), *sys.path[1:]])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size), str(picks), site],
        cwd=tree, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=600, check=True,
    )  # fmt: skip
    return float(json.loads(done.stdout))


def _r(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


def bench_pick(options: Pick) -> dict[str, Any]:
    try:
        sizes = [int(s) for s in options.sizes.split(",") if s]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise SystemExit(
            f"--sizes: pool sizes of at least 1, comma-separated, not {options.sizes!r}"
        )
    # A pick every 0.3 s of the pool's time (0.01 s at ``spent``): 200 a minute, within
    # the proxies' budgets (SITE_BUDGET a minute each), and all of them within the
    # 1,800 s a block holds.
    if not 0 < options.picks <= _PICKS:
        raise SystemExit(f"--picks: 1 to {_PICKS:,}")
    here = Path(__file__).resolve().parents[2]
    other = checkout(options.versus) if options.versus else None
    trees = [here] if other is None else [here, other]
    sides = range(len(trees))  # DIR may be this tree itself
    cases = [(site, size) for site in SITES for size in sizes]
    us: dict[tuple[str, int, int], list[float]] = {(*c, t): [] for c in cases for t in sides}
    for run in range(options.runs):
        for site, size in cases:
            for side in sides if run % 2 == 0 else sides[::-1]:
                us[site, size, side].append(_pick_us(trees[side], size, options.picks, site))
    out: dict[str, Any] = {"picks": options.picks, "runs": options.runs}
    for site, size in cases:
        mine = us[site, size, 0]
        row: dict[str, Any] = {"us": round(statistics.median(mine), 1), "by_run": _r(mine)}
        if other is not None:
            theirs = us[site, size, 1]
            row["versus_us"] = round(statistics.median(theirs), 1)
            row["versus_by_run"] = _r(theirs)
            row["x"] = round(statistics.median(mine) / statistics.median(theirs), 3)
        out[f"{site}_{size}"] = row
    return out
