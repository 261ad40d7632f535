"""Which of an agent's messages the fold has folded already: a re-send mark per agent.

An agent's outbox sends again what the log may already hold, minutes or hours later,
past the stream's duplicate window. Before the ``resend_window`` setting, the fold kept
the highest id per agent and ignored anything at or below it; that also dropped honest
observations whose ids come out of order: UUIDv7 ids unordered within a millisecond
(RFC 9562 makes that ordering optional), two processes sharing one token, a clock a few
milliseconds behind. From the ``Configured`` that sets ``resend_window`` to N, each agent
has a ``Mark``: its N newest ids (sorted) and a floor, the largest id it let go of.

- an id in the window is a re-send: counted per agent, not applied;
- an id at or below the floor is older than anything the window remembers: a re-send
  from long ago or a clock far behind, which cannot be told apart; not applied, and the
  fold sends it to the DLQ as ``stale`` (projections/folder.py), so nothing vanishes;
- any other id is new: applied and remembered; past N ids the smallest is let go and
  becomes the floor.

A late re-send is always met (in the window, or at or below the floor), however late. An
honest id is lost only when N newer ids of the same agent were folded before it arrived:
with batched reports (``ProxiesChecked``: one id per round) that is more than a minute of
a busy agent's messages. A future id cannot mute anyone: the floor rises only to ids let
go, the smallest first. Memory: N ids of 36 characters per agent that ever sent one
(docs/decisions.md, The re-send window).

A count is the wrong measure, though: 20 ids a millisecond from two processes 80 ms
apart let 1,600 newer ids in before an honest late one. From the ``Configured`` that
sets ``resend_window_s`` to W (seconds; it takes over from ``resend_window``), the
window is one of log time: each agent's ``Recent`` ids, each with the log time it is
forgotten at, the later of its message's log time and its own UUIDv7 date, plus W.

- an id the window holds is a re-send: counted, not applied;
- an id dated more than W before its message's log time is older than the window's
  start: stale, to the DLQ (reducers/admission.py). Only the id's own date decides, so
  an id dated ahead makes nobody else's stale;
- any other id is new: applied and remembered.

A re-send from an agent's outbox reaches the log within the outbox's longest replay
(``OUTBOX_REPLAY_S``, of the agent's clock) plus how far ahead its clock may be, so W
is at least that sum (docs/architecture.md §4, Agents). Memory: what is past
its time leaves at the fold's sweep (every ``SWEEP_MS`` of log time); an agent's window
holds at most what its quota lets it send in W and a sweep, and an agent without a
quota (the operator's own) at most ``RECENT_CAP`` ids; an id past that is refused as
``quota``. Pure, deterministic.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left

import msgspec

from events.ids import uuid7_ms

__all__ = [
    "NEW",
    "PAST",
    "RECENT_CAP",
    "RESENT",
    "Mark",
    "Recent",
    "expire",
    "floor_at_or_above",
    "recent_cap",
    "recent_refusal",
    "remember",
    "see",
]

NEW, RESENT, PAST = 0, 1, 2


class Mark(msgspec.Struct, kw_only=True):
    """One agent's newest ids (sorted ascending) and the largest id it let go of."""

    floor: str = ""
    ids: list[str] = []


def floor_at_or_above(marks: dict[str, Mark], agent: str, eid: str) -> str:
    """The floor ``eid`` is at or below ("" when it is above, or the agent has no
    mark): older than anything the agent's window remembers."""
    mark = marks.get(agent)
    return mark.floor if mark is not None and eid <= mark.floor else ""


def see(marks: dict[str, Mark], agent: str, eid: str, window: int) -> int:
    """NEW (now remembered), RESENT (in the window) or PAST (at or below the floor)."""
    if floor_at_or_above(marks, agent, eid):
        return PAST
    mark = marks.get(agent)
    if mark is None:
        mark = marks[agent] = Mark()
    ids = mark.ids
    i = bisect_left(ids, eid)
    if i < len(ids) and ids[i] == eid:
        return RESENT
    ids.insert(i, eid)
    over = len(ids) - window
    if over > 0:  # let the smallest go (at once, when it is the one just seen)
        mark.floor = ids[over - 1]
        del ids[:over]
    return NEW


# Ids an agent without a quota may have in its window: 50-60 MB at most.
RECENT_CAP = 262_144


class Recent(msgspec.Struct):
    """One agent's ids folded within the window of log time: id -> the log time (unix
    ms) it is forgotten at, in the order they were folded."""

    until: dict[str, int] = {}


def recent_cap(quota_per_min: int, window_s: int, sweep_ms: int) -> int:
    """The most ids an agent's window may hold: what ``quota_per_min`` lets it send in the
    window and one sweep (``RECENT_CAP`` without a quota)."""
    if not quota_per_min:
        return RECENT_CAP
    minutes = -(-(window_s * 1000 + sweep_ms) // 60_000)
    return quota_per_min * minutes


def recent_refusal(
    recent: dict[str, Recent], agent: str, eid: str, ts: int, window_s: int, cap: int
) -> tuple[str, str]:
    """(what, why) when an agent's id may not be folded at log time ``ts``: "invalid"
    (no date to judge it by), "stale" (older than the window's start), "full" (the
    window holds ``cap`` ids); ("", "") when it may, or the window holds it (a re-send).
    An id held past its time is judged by its date: the sweep at ``ts`` forgets it."""
    mark = recent.get(agent)
    if mark is not None and mark.until.get(eid, -1) >= ts:
        return "", ""
    dated = uuid7_ms(eid)
    if dated < 0:
        return "invalid", "not a UUIDv7 (RFC 9562): the re-send window reads its date"
    start = ts - window_s * 1000
    if dated < start:
        return "stale", (
            f"id {eid} is dated {start - dated} ms before its agent's re-send window"
            f" ({window_s} s of log time): a re-send from long ago, or a clock far behind"
        )
    if mark is not None and len(mark.until) >= cap:
        return "full", f"{agent}'s re-send window holds {cap} ids ({window_s} s of log time)"
    return "", ""


def remember(recent: dict[str, Recent], agent: str, eid: str, ts: int, window_s: int) -> bool:
    """True when ``eid`` is new (now remembered), False when the window holds it."""
    mark = recent.get(agent)
    if mark is None:
        mark = recent[agent] = Recent({})
    if eid in mark.until:
        return False
    mark.until[eid] = max(ts, uuid7_ms(eid)) + window_s * 1000
    return True


def expire(recent: dict[str, Recent], ts: int) -> None:
    """Forget every id whose time is past at log time ``ts``, and agents left with none.
    Ids are kept in the order they were folded, which is nearly the order they expire
    in; one dated ahead holds those behind it until its own time (a skew at most once
    ``guarded``; bounded by the cap whatever it is)."""
    for agent in list(recent):
        until = recent[agent].until
        gone = 0
        for t in until.values():
            if t >= ts:
                break
            gone += 1
        if gone == len(until):
            del recent[agent]
        elif gone:
            # Rebuilt, not deleted one by one: a dict's front emptied by deletes is
            # walked again by every later pass until it resizes.
            keep = dict(itertools.islice(until.items(), gone, None))
            recent[agent] = Recent(keep)
