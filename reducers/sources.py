"""Source (proxy-list URL) health and the facts its score is computed from.

The score itself depends on ``now`` and lives in the read models; this module keeps
what the log said: fetch outcomes, content changes, yield and working ratios.
"""

from __future__ import annotations

from events.catalogue import Discovered, Extracted, Fetched, ProxyWorked, SourceAdded
from events.subjects import url_id as make_url_id
from reducers.state import SourceRow, State

__all__ = ["MAX_DISCOVERED", "add", "credit", "discover", "extracted", "fetched", "settle"]

# Links taken from one Discovered event: a page that links to thousands is a directory,
# not a proxy list, and must not flood the ledger.
MAX_DISCOVERED = 100


def _row(state: State, url_id: str) -> SourceRow:
    row = state.sources.get(url_id)
    if row is None:  # an observation for a source we never heard of is still kept
        row = SourceRow(url_id=url_id, url="")
        state.sources[url_id] = row
    state.dirty["sources"].add(url_id)
    return row


def _ema(alpha: float, value: float, previous: float, first: bool) -> float:
    # float() always: an int here would encode differently from the float it restores as.
    return float(value) if first else alpha * value + (1.0 - alpha) * previous


def add(state: State, event: SourceAdded, ts: int) -> None:
    row = state.sources.get(event.url_id)
    if row is not None and row.url:
        return
    row = _row(state, event.url_id)
    row.url = event.url
    row.proto_hint = event.proto_hint
    row.origin = event.origin
    row.parent = event.parent
    row.added_at = ts


def discover(state: State, event: Discovered, ts: int) -> None:
    for url in event.urls[:MAX_DISCOVERED]:
        uid = make_url_id(url)
        if uid in state.sources:
            continue
        state.sources[uid] = SourceRow(
            url_id=uid, url=url, origin="discovered", parent=event.parent, added_at=ts
        )
        state.dirty["sources"].add(uid)


def settle(state: State, url_id: str, lease: str) -> None:
    """Fold the finished fetch's working ratio into its EMA."""
    row = state.sources.get(url_id)
    if row is None or not row.cur_lease or (lease and row.cur_lease != lease):
        return
    if row.cur_candidates > 0:
        ratio = min(len(row.cur_working) / row.cur_candidates, 1.0)
        first = row.working_ratio == 0.0 and row.retrievals <= 1
        row.working_ratio = _ema(state.settings.ema_alpha, ratio, row.working_ratio, first)
    row.cur_lease = ""
    row.cur_candidates = 0
    row.cur_working = []
    state.working_sets.pop(url_id, None)
    state.dirty["sources"].add(url_id)


def fetched(state: State, event: Fetched, ts: int) -> None:
    settings = state.settings
    if event.lease != state.sources.get(event.url_id, _NONE).cur_lease:
        settle(state, event.url_id, "")
    row = _row(state, event.url_id)
    first = row.retrievals == 0
    row.retrievals += 1
    row.check_time = ts
    row.last_worker = event.agent
    row.avg_fetch_time = _ema(settings.ema_alpha, event.fetch_ms, row.avg_fetch_time, first)
    row.cur_lease = event.lease
    interval = row.check_interval
    if not event.ok:
        row.consecutive_errors += 1
        row.last_error = event.error
        # One blocked exit is not the source's fault: error rises from the second.
        if row.consecutive_errors >= 2:
            row.error += 1
            interval *= 2
    else:
        row.consecutive_errors = 0
        row.error = 0
        row.last_error = ""
        if event.changed:
            row.stale_count = 0
            row.last_hash = event.content_hash
            interval //= 2
        else:
            row.stale_count += 1
            interval = interval * 3 // 2
    row.check_interval = min(max(interval, settings.min_interval_s), settings.max_interval_s)


def extracted(state: State, event: Extracted) -> None:
    """Yield counts only changed content: an unchanged page is never re-extracted."""
    row = _row(state, event.url_id)
    first = row.yield_rate == 0.0 and row.retrievals <= 1
    row.yield_rate = _ema(state.settings.ema_alpha, event.count, row.yield_rate, first)
    if event.content_hash:
        row.last_hash = event.content_hash
    row.cur_candidates = event.count


def credit(state: State, row: SourceRow, found: list[tuple[ProxyWorked, bool]]) -> None:
    """Proxies found through a source (each with whether it was new) count toward its
    additions, and those of its fetch in progress toward its working ratio. A round's
    confirmations come together."""
    row.proxies_added += sum(new for _, new in found)
    if row.cur_lease:
        working = row.cur_working
        known = _working_set(state, row)
        for event, _ in found:
            if event.lease == row.cur_lease:
                addr = f"{event.ip}:{event.port}"
                if addr not in known:
                    known.add(addr)
                    working.append(addr)
    state.dirty["sources"].add(row.url_id)


def _working_set(state: State, row: SourceRow) -> set[str]:
    """The addresses of ``row.cur_working`` as a set, kept between calls: a fetch's
    confirmations sent one by one (single events) would otherwise rebuild it from the
    tuple at each, a fetch's cost growing with the square of what it found. Kept while
    the fetch is the same and the tuple only grew by what ``credit`` added."""
    kept = state.working_sets.get(row.url_id)
    if kept is None or kept[0] != row.cur_lease or len(kept[1]) != len(row.cur_working):
        kept = state.working_sets[row.url_id] = (row.cur_lease, set(row.cur_working))
    return kept[1]


_NONE = SourceRow(url_id="", url="")
