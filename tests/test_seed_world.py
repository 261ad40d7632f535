"""Seed nodes in the world in a box (issue 13's bar): ``ppf up`` with no lab mode, a
20,000-line dump holding a few hundred working proxies among refusing and silent
addresses, three ``ppf agent seed`` processes, one killed with SIGKILL mid-range.
The run itself is ops/bench/seed.py, the one ``ppf bench seed`` makes at 200,000."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.bench.seed import seed_world
from ops.lab.world import World, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

LINES = 20_000
RANGE = 2_000
# Four deposits a range. A batch ends with its slowest check: a silent address's whole
# check timeout, so the run's length is about batches a node times that timeout.
BATCH = 500


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with World(tmp_path_factory.mktemp("world-seed"), extra_working=300) as w:
        yield w


@pytest.mark.timeout(600)
async def test_three_seed_nodes_work_a_dump_once_one_killed_mid_range(
    world: World, tmp_path: Path
) -> None:
    """Every item settled exactly once (items reached = items the nodes deposited =
    lines), the killed node's range finished by another from its cursor, and the pool
    holds every working proxy of the dump and nothing else."""
    got = await seed_world(world, tmp_path, LINES, nodes=3, size=RANGE, batch=BATCH, timeout_s=420)
    plan = got["plan"]
    assert got["real"] >= 300
    assert (plan["items"], plan["reached"]) == (LINES, LINES), got
    assert plan["ranges"] == {"waiting": 0, "working": 0, "done": LINES // RANGE, "failed": 0}
    assert sum(got["by_node"].values()) == LINES, got["by_node"]  # once each
    assert got["deposits"]["poisoned"] == 0 and got["deposits"]["pending"] == 0
    victim, after = got["victim"], got["victim_range_after"]
    assert victim is not None, "seed0 never deposited a batch"
    assert victim["start"] < victim["cursor"] <= victim["end"]
    # Finished by another node, which went on from where seed0's last batch left it.
    assert after["cursor"] > after["end"] and after["holder"] != "seed0"
    assert got["by_node"].get("seed0", 0) < LINES // 3
    assert got["missing_real"] == [], got["missing_real"]
    assert got["unexpected"] == [], got["unexpected"]  # nothing dead got in
