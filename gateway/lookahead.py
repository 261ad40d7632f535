"""Looking ahead of the lease grants while the fold is far behind the log: which of the
next targets' lease subjects the log holds no message on.

A claim is a compare-and-set on its target's lease subject. While the fold works off a
backlog, its projection shows targets free that the log has leased since, and a claim
on one is refused, after nats-server has loaded the block holding the subject's last
message to check it (it loads the whole message, and drops the block again when it was
not cached: docs/decisions.md, The log). A
projection that far behind can vouch only for a target the log has never leased: its
subject holds no message, which the server's index of subjects says without reading a
block, and a claim on it is checked the same way. So while the fold is more than
``LAG_BOUND`` messages behind, a grant claims only targets looked up here a moment ago
and found without a message; the others wait until the fold has caught up (its
``/readyz`` is 503 meanwhile). It never decides a grant: the compare-and-set does, as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from itertools import islice

from eventlog.protocol import EventLog
from events.subjects import lease_subject
from reducers import State

__all__ = ["FRESH_S", "Lookahead"]

Candidates = Iterator[tuple[str, float]]  # (target, score), best first

# A lookup counts this long: another gateway may claim the target meanwhile, and then
# the claim is refused, on a subject the index answers for.
# The work done ahead of the grants: how often, and for how long after a grant asked for
# a kind.
LOOK_EVERY_S = 0.25
LOOK_ASKED_S = 60.0
FRESH_S = 8.0
# What is forgotten after this long (a subject still wanted is looked up again).
FORGET_S = 120.0
# Targets of a kind kept confirmed, and candidates gone through for them each time.
READY = 8
SPAN = 64


class Lookahead:
    """What the index of subjects said of lease subjects on which the projection has
    applied no message: whether the log holds one, and when that was asked."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[bool, float]] = {}
        self.lookups = 0  # subjects looked up, for /v1/stats
        self.passed_over = 0  # candidates passed over because the log had moved on
        self._asked: dict[str, float] = {}  # kind -> when a grant last asked for it
        self._now = asyncio.Event()

    def asked(self, kind: str) -> None:
        """A grant asked for ``kind``: the rounds ahead look for it ``LOOK_ASKED_S``."""
        self._asked[kind] = time.monotonic()

    def asked_lately(self) -> list[str]:
        now_s = time.monotonic()
        return [kind for kind, at in self._asked.items() if now_s - at < LOOK_ASKED_S]

    def now(self) -> None:
        """A grant found too few: the next round at once."""
        self._now.set()

    async def next_round(self) -> list[str]:
        """Wait ``LOOK_EVERY_S`` or until ``now``; the kinds asked for lately."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LOOK_EVERY_S):
                await self._now.wait()
        self._now.clear()
        return self.asked_lately()

    def note(self, subject: str, held: bool) -> None:
        self._held[subject] = (held, time.monotonic())
        self.lookups += 1

    def moved(self, subject: str, expected: int) -> bool:
        """Whether a claim expecting ``expected`` (the projection's last sequence on
        ``subject``) is known to be refused: the log holds a message it has not seen."""
        known = self._held.get(subject)
        return expected == 0 and known is not None and known[0]

    def confirmed(self, subject: str, expected: int, now_s: float) -> bool:
        """Whether a claim expecting ``expected`` is known, a moment ago, to match."""
        known = self._held.get(subject)
        return expected == 0 and known is not None and not known[0] and now_s - known[1] < FRESH_S

    def claimable(
        self, kind: str, candidates: Candidates, state: State, confirmed_only: bool
    ) -> Candidates:
        """``candidates`` without those whose lease subject is known to hold a message
        the projection has not applied; with ``confirmed_only`` (the fold far behind),
        only those confirmed without one a moment ago."""
        now_s = time.monotonic()
        for target, score in candidates:
            row = state.leases.get(target)
            subject, expected = lease_subject(kind, target), row.subject_seq if row else 0
            if self.moved(subject, expected):
                self.passed_over += 1
            elif not confirmed_only or self.confirmed(subject, expected, now_s):
                yield target, score

    async def look_up(self, kind: str, candidates: Candidates, state: State, lg: EventLog) -> None:
        """Look up, in the log's index of subjects, the lease subjects of the next
        ``candidates`` the projection has seen no message on, until ``READY`` are
        confirmed without one."""
        next_up = list(islice(self.claimable(kind, candidates, state, False), SPAN))
        ready = 0  # the candidates were taken at once: the state changes while awaiting
        for target, _ in next_up:
            row = state.leases.get(target)
            if row is not None and row.subject_seq:
                continue  # a lease behind it: only the fold, caught up, can vouch for it
            subject = lease_subject(kind, target)
            if not self.confirmed(subject, 0, time.monotonic()):
                self.note(subject, await lg.subject_msgs(subject) > 0)
            ready += self.confirmed(subject, 0, time.monotonic())
            if ready == READY:
                break

    def forget_old(self, now_s: float) -> None:
        old = [s for s, (_, at) in self._held.items() if now_s - at > FORGET_S]
        for subject in old:
            del self._held[subject]

    def __len__(self) -> int:
        return len(self._held)
