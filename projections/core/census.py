"""The census of a pool view: its rows within the TTL counted by fresh status, protocol,
anonymity and country, kept as the TTL's edge moves and carried from one view to the
next built from the rows that changed."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from projections.core.proxyview import ProxyView, Views
from reducers.pool import FRESH_STATUSES, band_edges, fresh_status

__all__ = ["CENSUS_MS", "STEP", "Tally", "edge"]

CENSUS_MS = 5_000  # a census counts for a slot of this long

# Rows a step of a view's build: at most ~2.5 ms of this machine's time for any kind of step.
STEP = 1_024
_BY = (("by_proto", "proto"), ("by_anonymity", "anonymity"), ("by_country", "country"))


def _alive_from(at: int, ttl_s: int) -> int:
    """The oldest last_seen within the TTL at census slot ``at``."""
    return band_edges(at * CENSUS_MS, ttl_s)[0]


def edge(by_last_seen: Views, at: int, ttl_s: int) -> int:
    """Where the rows within the TTL at slot ``at`` end in ``by_last_seen`` (newest
    first: they are a prefix of it)."""
    return by_last_seen.bisect_right(-_alive_from(at, ttl_s), key=_newest_first)


def _newest_first(v: ProxyView) -> int:
    return -v.last_seen


def _line(v: ProxyView) -> str:
    """The census line of a row within the TTL."""
    return fresh_status(v.fail_streak > 0, v.confirmed, v.mitm)


@dataclass(slots=True)
class Tally:
    """Counts of the rows ``by_last_seen[:edge]``: moving the edge adds or takes away only
    the rows between the old edge and the new one (a few, as the TTL's edge moves in
    real time), so a census costs a full walk once a view, not once a slice."""

    edge: int = 0
    at: int = -1
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FRESH_STATUSES, 0))
    by: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {} for k, _ in _BY})
    answer: dict[str, Any] | None = None

    def moving(self, rows: Views, edge: int) -> Generator[None, None, None]:
        """Move the edge to ``edge``, ``STEP`` rows a step."""
        while self.edge != edge:
            step = max(-STEP, min(STEP, edge - self.edge))
            lo, hi = sorted((self.edge, self.edge + step))
            self._count(rows.between(lo, hi), 1 if step > 0 else -1)
            self.edge += step
            yield

    def _count(self, rows: Iterable[ProxyView], sign: int) -> None:
        counts, by = self.counts, self.by
        for v in rows:
            line = _line(v)
            counts[line] += sign
            if line != "alive":
                continue
            for name, attr in _BY:
                d = by[name]
                value = getattr(v, attr) if attr == "proto" else getattr(v, attr) or "unknown"
                left = d.get(value, 0) + sign
                if left:
                    d[value] = left
                else:
                    del d[value]

    def carried(
        self, gone: list[ProxyView], fresh: list[ProxyView], by_last_seen: Views, ttl_s: int
    ) -> Tally:
        """This tally for the next view, whose rows are this one's without ``gone`` and
        with ``fresh`` (``by_last_seen``, its order): the counts at the same census slot
        moved by those rows alone, not a walk of the pool anew. Read in one step: a
        census of the old view moves this tally while the next is built."""
        if self.at < 0:
            return Tally()
        alive_from = _alive_from(self.at, ttl_s)
        by = {k: dict(d) for k, d in self.by.items()}
        carried = Tally(edge(by_last_seen, self.at, ttl_s), self.at, dict(self.counts), by)
        carried._count((v for v in gone if v.last_seen >= alive_from), -1)
        carried._count((v for v in fresh if v.last_seen >= alive_from), 1)
        return carried

    def answer_counts(self) -> dict[str, Any]:
        return {**self.counts, **{k: dict(sorted(d.items())) for k, d in self.by.items()}}
