"""Which deposits retention deletes: a rule over the deposits projection. Pure.

Deposits are kept for ``max_age_ms`` and up to ``max_bytes`` in all; past either, the
oldest go first (by the seq of their latest announcement). What is deleted is always a
prefix of that order, so one number says what is gone: the seq of the last deposit
deleted (the ingest keeps it in the data dir, ``DepositIngest.retain``). A page
announced again (fetched again, stored again) moves to the end and is kept anew.

Never deleted here: a deposit still pending (its outcome is not in the log yet: the
prefix stops there) and seed inputs (``input/``: a plan's ranges are cut from them;
an operator deletes an input, by key, when the plan is done).
"""

from __future__ import annotations

from collections.abc import Iterable

from reducers.state import DepositRow

__all__ = ["expired"]


def expired(
    rows: Iterable[DepositRow], *, after_seq: int, cutoff_ms: int, max_bytes: int
) -> list[DepositRow]:
    """The deposits past retention that come after ``after_seq`` (the last deleted),
    oldest first. ``cutoff_ms``: announced before it is too old; ``max_bytes``: the
    budget of all deposits kept (after ``after_seq``)."""
    kept = sorted(
        (r for r in rows if r.seq > after_seq and not r.key.startswith("input/")),
        key=lambda r: r.seq,
    )
    total = sum(r.bytes for r in kept)
    out = []
    for row in kept:
        if row.status == "pending":
            break  # the log has no outcome for it yet: nothing after it goes either
        if row.at >= cutoff_ms and total <= max_bytes:
            break
        out.append(row)
        total -= row.bytes
    return out
