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
go, the smallest first. Memory: N ids of 36 characters per agent that ever sent one (at
N = 512, about 48 KB an agent, 48 MB at 1,000; BENCHMARKS.md). Pure, deterministic.
"""

from __future__ import annotations

from bisect import bisect_left

import msgspec

__all__ = ["NEW", "RESENT", "STALE", "Mark", "see", "stale"]

NEW, RESENT, STALE = 0, 1, 2


class Mark(msgspec.Struct, kw_only=True):
    """One agent's newest ids (sorted ascending) and the largest id it let go of."""

    floor: str = ""
    ids: list[str] = []


def stale(marks: dict[str, Mark], agent: str, eid: str) -> str:
    """The floor ``eid`` is at or below ("" when it is above, or the agent has no
    mark): older than anything the agent's window remembers."""
    mark = marks.get(agent)
    return mark.floor if mark is not None and eid <= mark.floor else ""


def see(marks: dict[str, Mark], agent: str, eid: str, window: int) -> int:
    """NEW (now remembered), RESENT (in the window) or STALE (at or below the floor)."""
    if stale(marks, agent, eid):
        return STALE
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
