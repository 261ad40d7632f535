"""``ppf bench extract``: the extractor against one bare ``re.findall``, same bytes, same run."""

from __future__ import annotations

import random
import re
import time
from typing import Any

from agents.extract import extract, native_scanner
from ops.bench.options import Extract

__all__ = ["bench_extract", "dense_list"]

BARE = re.compile(rb"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}:\d{1,5}")


def dense_list(mb: int, seed: int) -> bytes:
    """``ip:port`` lines of public-looking addresses, ``mb`` megabytes, seeded."""
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < mb * 1_000_000:
        line = (
            f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}."
            f"{rng.randint(1, 254)}:{rng.randint(1, 65535)}\n"
        )
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def bench_extract(options: Extract, rounds: int = 3) -> dict[str, Any]:
    """Best of ``rounds`` for each, interleaved, so a noisy moment hurts both alike."""
    mb, seed = options.mb, options.seed
    data = dense_list(mb, seed)
    bare_s = ours_s = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        bare_matches = len(BARE.findall(data))
        bare_s = min(bare_s, time.perf_counter() - t)
        t = time.perf_counter()
        found = len(extract(data))
        ours_s = min(ours_s, time.perf_counter() - t)
    size = len(data) / 1e6
    return {
        "mb": round(size, 1),
        "seed": seed,
        "rounds": rounds,
        "native_scanner": native_scanner(),
        "bare_findall_matches": bare_matches,
        "bare_findall_mb_per_s": round(size / bare_s, 1),
        "extract_candidates": found,
        "extract_mb_per_s": round(size / ours_s, 1),
        "extract_vs_bare": round(bare_s / ours_s, 3),
    }
