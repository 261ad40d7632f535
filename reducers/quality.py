"""Quality signals: how much of the last days a proxy was up, since when it has worked
without a break, and how fast it downloads, folded from its checks in log time.

From the ``Configured`` that sets ``quality`` (``ppf up`` does), each check of a known
proxy by an agent trusted then (or by any agent while trust is off) moves its
``ProxyQuality`` row (reducers/rows.py): an untested agent's checks move no figure, as
its failures fail no proxy. Logs written before the setting fold no row, and the table
is left out of the digest while it has none.

Uptime is time-weighted, not a share of checks: failing proxies are checked more often
than working ones (projections/core/recheck.py), so counting checks would call a proxy
that is up most of the day half dead. The span between two checks of a proxy is known
when it is at most ``gap_ms`` (twice the longest recheck interval): up while both checks
said so, down while both did, and when they differ, up until halfway and down after
(or the other way round): the change is somewhere in between, the middle is the best
guess. A longer span is not known (the proxy was not looked at). Each day of log time
(UTC) keeps its milliseconds up and known; ``WINDOW_DAYS`` days are kept, and a reader
asks for the share over the days it wants (projections/core/readmodels.py ``uptime``).

A run of successes starts at a success after a failure, or after a span not known, and
ends at the next failure: ``up_since``.
"""

from __future__ import annotations

from events import Settings
from reducers.rows import ProxyKey, ProxyQuality, UInt32s
from reducers.state import State

__all__ = ["DAY_MS", "WINDOW_DAYS", "checked", "forget", "gap_ms", "measured"]

DAY_MS = 86_400_000
WINDOW_DAYS = 7  # days kept: a reader's window is at most this long


def gap_ms(settings: Settings) -> int:
    """The longest span between two checks that counts as known."""
    return 2 * settings.recheck_dead_s * 1000


def _counted(state: State, agent: str) -> bool:
    settings = state.settings
    return settings.quality and (not settings.trust or agent in state.trusted)


def _row(state: State, key: ProxyKey) -> ProxyQuality:
    row = state.quality.get(key)
    if row is None:
        row = state.quality[key] = ProxyQuality(ip=key[0], port=key[1])
    state.dirty["quality"].add(key)
    return row


def checked(state: State, key: ProxyKey, ok: bool, ts: int, agent: str) -> None:
    """A check of the known proxy ``key`` at log time ``ts``: ``ok`` or failed."""
    if not _counted(state, agent):
        return
    row = _row(state, key)
    row.checks += 1
    if ts < row.last_at:
        return  # an older check folded late (another agent's clock): no span to count
    known = bool(row.last_at) and ts - row.last_at <= gap_ms(state.settings)
    if known:
        middle = row.last_at + (ts - row.last_at) // 2
        _count(row, row.last_at, middle, row.last_ok)
        _count(row, middle, ts, ok)
    if not ok:
        row.up_since = 0
    elif not (known and row.last_ok and row.up_since):
        row.up_since = ts
    row.last_at, row.last_ok = ts, ok


def measured(state: State, key: ProxyKey, kb_s: int, ts: int, agent: str) -> None:
    """A download through ``key`` at ``kb_s`` kilobytes (1,000 bytes) a second, from
    ``agent``'s vantage."""
    if kb_s <= 0 or not _counted(state, agent):
        return
    row = _row(state, key)
    if ts >= row.speed_at:
        row.speed_kb_s, row.speed_at, row.speed_by = kb_s, ts, agent


def forget(state: State, key: ProxyKey) -> None:
    """The proxy was evicted: its figures go with it."""
    if state.quality.pop(key, None) is not None:
        state.dirty["quality"].add(key)


def _count(row: ProxyQuality, start: int, end: int, up: bool) -> None:
    """Milliseconds [start, end) into their days: known, and up when ``up``."""
    while start < end:
        day = start // DAY_MS
        upto = min(end, (day + 1) * DAY_MS)
        i = _day(row, day)
        if i is not None:
            ms = upto - start
            row.known[i] += ms
            if up:
                row.up[i] += ms
        start = upto


def _day(row: ProxyQuality, day: int) -> int | None:
    """The index of ``day`` in the row's days, made (and the oldest dropped past the
    window) as needed; None for a day already out of the window."""
    if not row.known:
        row.day0, row.up, row.known = day, UInt32s([0]), UInt32s([0])
        return 0
    if day < row.day0:
        return None
    i = day - row.day0
    if i >= len(row.known):
        row.up.extend([0] * (i + 1 - len(row.up)))
        row.known.extend([0] * (i + 1 - len(row.known)))
    drop = len(row.known) - WINDOW_DAYS
    if drop > 0:
        del row.up[:drop], row.known[:drop]
        row.day0 += drop
        i -= drop
    return i
