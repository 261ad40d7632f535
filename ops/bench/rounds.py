"""``ppf bench fold --rounds``: the same observations as single events and as rounds.

The pinned workload (ops/bench/workload.py) is published twice, in lockstep, to two
servers: each step's single events to one, the same step as rounds to the other, so an
observation has the same server time in both streams. It reports what each stream costs
the log (messages, stored bytes, as the stream reports them) and, folded side by side a
batch at a time (ops/bench/versus.py), observations a second: this tree on the rounds,
this tree on the single events, and, with ``--versus DIR``, the tree in ``DIR`` (an
older ppf, which knows no rounds) on the single events.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eventlog.client import Log
from ops.bench.compare import median_ci, pct_by_run
from ops.bench.harness import Workload, checkout, nats_servers, publish_workload
from ops.bench.options import Fold
from ops.bench.versus import Side, side_by_side

__all__ = ["bench_rounds"]

HERE = Path(__file__).resolve().parents[2]


def _pool(db: Path) -> tuple[str, str] | None:
    """What a fold built, from its file: (the proxies table's digest, a digest of what
    the checks said of each proxy, its times left out). Two streams of one workload
    agree on the second; a round's results share its message's time where single events
    each have their own, so the first agrees only between folds of one stream. None
    where this tree cannot read the file (an older tree's schema)."""
    import hashlib

    import msgspec

    from projections import Store
    from projections.core.digest import digests
    from projections.store import StoreError

    try:
        store = Store(db)
    except StoreError:
        return None
    try:
        state = store.restore()
    finally:
        store.close()
    said = sorted(
        (r.ip, r.port, r.proto, r.protos, r.confirmations, r.fail_streak, r.flaps,
         r.latency_ema, r.samples, r.exit_ip, r.anonymity, r.https, r.agents, r.sources)
        for r in state.proxies.values()
    )  # fmt: skip
    return digests(state)["proxies"], hashlib.sha256(msgspec.msgpack.encode(said)).hexdigest()


async def _stream(url: str) -> tuple[int, int]:
    lg = await Log.connect(url)
    try:
        head = await lg.head_seq()
        stored, _ = await lg.stored_bytes()
    finally:
        await lg.close()
    return head, stored


async def bench_rounds(fold: Fold) -> dict[str, Any]:
    observations, proxies, seed, runs = fold.observations, fold.proxies, fold.seed, fold.runs
    versus = checkout(fold.versus) if fold.versus is not None else None
    with tempfile.TemporaryDirectory(prefix="ppf-bench-rounds-") as tmp:
        workdir = Path(tmp)
        with nats_servers(workdir, "nats-s", "nats-r") as servers:
            singles_url, rounds_url = (s.url for s in servers)
            await publish_workload(
                Workload([singles_url, rounds_url], "sr", observations, proxies, seed)
            )
            (s_msgs, s_bytes), (r_msgs, r_bytes) = [
                await _stream(u) for u in (singles_url, rounds_url)
            ]
            sides: dict[str, Side] = {
                "rounds": (HERE, rounds_url, r_msgs),
                "singles": (HERE, singles_url, s_msgs),
            }
            if versus is not None:
                sides["old_singles"] = (versus, singles_url, s_msgs)
            spent: dict[str, list[float]] = {name: [] for name in sides}
            for run in range(runs):
                t = time.perf_counter()
                figures = await asyncio.to_thread(side_by_side, sides, workdir, run)
                for name, fig in figures.items():
                    spent[name].append(fig["cpu"])
                print(f"run {run + 1}/{runs}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
            # What both forms built, from the files the first run wrote: the same pool.
            pools = {name: _pool(workdir / f"{name}-0.duckdb") for name in sides}
    rate = {name: [observations / s for s in cpu] for name, cpu in spent.items()}
    result: dict[str, Any] = {
        "observations": observations,
        "proxies": proxies,
        "seed": seed,
        "runs": runs,
        "singles_messages": s_msgs,
        "rounds_messages": r_msgs,
        "messages_ratio": round(r_msgs / s_msgs, 4),
        "singles_bytes_per_observation": round(s_bytes / observations, 1),
        "rounds_bytes_per_observation": round(r_bytes / observations, 1),
        "bytes_ratio": round(r_bytes / s_bytes, 3),
        # What each fold built: the same checks of the same proxies, or the bench
        # compares unequal work; and one stream folded by two trees, the same table.
        "same_pool": len({p[1] for p in pools.values() if p is not None}) == 1,
        "pools_compared": sorted(name for name, p in pools.items() if p is not None),
    }
    for name, rates in rate.items():
        result[f"{name}_observations_per_s"] = round(statistics.median(rates))
        result[f"{name}_observations_per_s_runs"] = [round(r) for r in rates]
        result[f"{name}_cpu_s_runs"] = [round(c, 3) for c in spent[name]]
    against = ["singles", *(["old_singles"] if versus is not None else [])]
    for other in against:
        # Run by run: the two sides of a run saw the same moments of the machine.
        ratios = [round(1 + p / 100, 3) for p in pct_by_run(rate[other], rate["rounds"])]
        result[f"rounds_vs_{other}"] = round(statistics.median(ratios), 3)
        result[f"rounds_vs_{other}_by_run"] = ratios
        result[f"rounds_vs_{other}_spread"] = [min(ratios), max(ratios)]
        result[f"rounds_vs_{other}_ci95"] = median_ci(ratios)  # None under 6 runs
    if versus is not None:
        result["old"] = str(versus)
        old, new = pools.get("old_singles"), pools["singles"]
        result["singles_table_equal_old"] = None if old is None or new is None else old[0] == new[0]
    return result
