"""The due sources, ranked: scoring every source costs O(sources) (docs/decisions.md, The
gateway), so a ranking is kept a moment and made again in the background, in steps that
give the loop back; each candidate is scored again as a grant takes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from events.mint import now_ms
from projections.core.readmodels import due_score, due_sources, rank_due, scored_due
from projections.live import FoldService
from reducers import LeaseRow, SourceRow
from reducers.pool import lease_live

__all__ = ["RANK_SLACK_S", "SourceRanking", "free"]

# Sources scored between two turns of the loop, and how much older than
# ``due_refresh_s`` a grant takes the ranking before ranking itself.
RANK_STEP = 256
RANK_SLACK_S = 1.0


def free(row: LeaseRow | None, now: int) -> bool:
    if row is None:
        return True
    return row.status != "failed" and not lease_live(row, now)


class SourceRanking:
    """The due sources of ``fold``'s state by score, made again every ``due_refresh_s``
    while sources are asked for."""

    def __init__(self, fold: FoldService, due_refresh_s: float = 0.5) -> None:
        self.fold = fold
        self.due_refresh_s = due_refresh_s
        self._due: list[tuple[float, str]] = []
        self._due_from = 0
        # None: never ranked. (A sentinel time such as -1.0 looked fresh on a machine
        # whose monotonic clock, its uptime, was younger than ``due_refresh_s``: a CI
        # machine booted minutes before the test granted nothing.)
        self._due_at: float | None = None

    def due(self, now: int, max_age_s: float | None = None) -> list[tuple[float, str]]:
        """Due sources by score, as last ranked.

        Scoring every source costs O(sources) (docs/decisions.md, The gateway), so the ranking
        is kept a moment and made again in the background (``keep``), in steps that
        give the loop back, every ``due_refresh_s`` while sources are asked for. Ranked
        here only when the last ranking is older than ``max_age_s`` (default: that
        period and a second, the background being idle while none was asked for). Each
        candidate is scored again as it is taken (``free_due``), so a source fetched
        since the ranking is not leased again.
        """
        limit = self.due_refresh_s + RANK_SLACK_S if max_age_s is None else max_age_s
        if self.age() > limit:
            self._ranked(due_sources(self.fold.state, now, 0))
        return self._due

    def age(self) -> float:
        return float("inf") if self._due_at is None else time.monotonic() - self._due_at

    def _ranked(self, ranking: list[tuple[float, SourceRow]]) -> None:
        self._due = [(score, row.url_id) for score, row in ranking]
        self._due_from = 0  # where _due_free starts: past the settled head
        self._due_at = time.monotonic()

    async def rank(self) -> None:
        """``due``'s ranking, ``RANK_STEP`` sources at a time between turns of
        the loop (the rows are the fold's: each is scored as it is at its turn)."""
        now = now_ms()
        rows = list(self.fold.state.sources.values())
        scored: list[tuple[float, SourceRow]] = []
        for i in range(0, len(rows), RANK_STEP):
            scored += scored_due(rows[i : i + RANK_STEP], now)
            await asyncio.sleep(0)
        self._ranked(rank_due(scored))

    def count(self, now: int, max_age_s: float = 10.0) -> int:
        """How many sources the last ranking found due, ranked again when older than
        ``max_age_s``: ``/v1/stats`` reads it without scoring every source per call."""
        return len(self.due(now, max_age_s))

    def free_due(self, now: int, claiming: set[str]) -> Iterator[tuple[str, float]]:
        """Ranked sources that are free and still due, best first, lazily.

        Each is scored again as it is taken, so a source fetched since the ranking is
        not leased again; one held or being claimed (``claiming``, by this gateway) is
        passed over before it is scored (50 agents leasing at once hold about as many,
        and scoring each of them on every grant was a tenth of the gateway's time in
        ``ppf bench lease``). A run of
        settled sources at the ranking's head is dropped from it: each stays settled
        until the next ranking, and every grant would walk them again.
        """
        ranking = self.due(now)
        state = self.fold.state
        sources, leases = state.sources, state.leases
        head = True  # everything before this entry is settled
        for i in range(self._due_from, len(ranking)):
            uid = ranking[i][1]
            if uid in claiming or not free(leases.get(uid), now):
                head = False
                continue
            row = sources.get(uid)
            score = due_score(row, now) if row is not None else None
            if score is None:
                if head:
                    self._due_from = i + 1
                continue
            head = False
            yield uid, score

    async def keep(self, asked: Callable[[], bool]) -> None:
        """Rank again in the background every ``due_refresh_s`` while ``asked()`` says
        sources were asked for lately."""
        while True:
            await asyncio.sleep(self.due_refresh_s / 2)
            if self.age() > self.due_refresh_s and asked():
                await self.rank()
