"""Keys of the deposit store (the ``ppf-deposits`` object bucket), minted from what the
ledger already knows, so nothing ever has to list the bucket to find a deposit.

- ``<plan>/<range>/<cursor>``: the batch a seed node worked from ``cursor`` in a range;
- ``page/<sha256>``: a raw page, by its content (fetched twice, stored once);
- ``input/<sha256>``: the input of a seed plan, by its content.

Content keys name their own digest, so junk stored under one can never pass for what
the key promises: every read is checked against the digest the log recorded.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "DERIVED_PREFIX",
    "DepositKey",
    "derived_id",
    "input_key",
    "is_derived",
    "items_of",
    "page_key",
    "parse_key",
    "plan_id",
    "range_target",
    "seed_key",
]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DIGITS = re.compile(r"^(0|[1-9][0-9]{0,11})$")

# Ids of the events the fold derives from a deposit: ``dep:<key digest>:<n>``, the same
# whoever derives them, so the stream's duplicate window keeps one of each (several
# gateways). They are not an agent's numbering: the fold's re-send mark skips them.
DERIVED_PREFIX = "dep:"


class DepositKey(NamedTuple):
    form: str  # seed, page, input
    plan: str = ""
    range: str = ""
    cursor: int = 0
    sha256: str = ""


def seed_key(plan: str, rng: str, cursor: int) -> str:
    return f"{plan}/{rng}/{cursor}"


def page_key(sha256: str) -> str:
    return f"page/{sha256}"


def input_key(sha256: str) -> str:
    return f"input/{sha256}"


def plan_id(input_sha256: str) -> str:
    """The plan of an input: the same input always plans into the same ranges' names."""
    return "p" + input_sha256[:12]


def range_target(plan: str, rng: str) -> str:
    """The lease target of a range (``ppf.lease.seed.<plan>-<range>``)."""
    return f"{plan}-{rng}"


def parse_key(key: str) -> DepositKey | None:
    """The parts of a deposit key, or None when it is not one of the three forms."""
    parts = key.split("/")
    if len(parts) == 2 and parts[0] in ("page", "input") and _HEX64.match(parts[1]):
        return DepositKey(parts[0], sha256=parts[1])
    if (
        len(parts) == 3
        and _NAME.match(parts[0])
        and _NAME.match(parts[1])
        and _DIGITS.match(parts[2])
    ):
        return DepositKey("seed", parts[0], parts[1], int(parts[2]))
    return None


def derived_id(key_id: str, n: int) -> str:
    return f"{DERIVED_PREFIX}{key_id}:{n}"


def is_derived(event_id: str) -> bool:
    return event_id.startswith(DERIVED_PREFIX)


def items_of(data: bytes) -> list[str]:
    """The items of a seed input: its lines, stripped, without blanks and ``#`` comments.
    The planner and the gateway cut ranges over this same list."""
    lines = (line.strip() for line in data.decode("utf-8", "replace").splitlines())
    return [line for line in lines if line and not line.startswith("#")]
