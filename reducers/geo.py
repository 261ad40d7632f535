"""Where proxies are: country and network by address, from ``Located`` events.

A location belongs to an address, and an address may carry proxies on several ports, so
the state keeps, per address of a row, its location and its ports (``State.by_ip``:
derived, rebuilt from the rows on restore). A ``Located`` reaches every row of its
address; a new row on a located address takes the location at once. An address that
no row carries any more is forgotten, as it would be after a restore, so the two agree.
``State.unlocated`` lists the addresses the service still has to look up.

Entries are tuples, replaced whole, never lists: a million lists would be tracked by the
garbage collector, whose passes over them slow the fold (docs/decisions.md, The fold);
tuples of strings and ints are untracked after their first pass.
"""

from __future__ import annotations

from events.catalogue import Located
from reducers.state import ProxyRow, State

__all__ = ["PLACES", "admitted", "evicted", "located"]

Place = tuple[str, int, str, str]  # country, asn, as_org, data version

# One tuple per distinct place, shared by every row there (a few thousand, not a million).
PLACES: dict[Place, Place] = {}


def _place(row: ProxyRow) -> Place | None:
    if not row.geo:
        return None
    place = (row.country, row.asn, row.as_org, row.geo)
    return PLACES.setdefault(place, place)


def admitted(state: State, row: ProxyRow) -> None:
    """A row joined the pool (or was restored): file it under its address."""
    entry = state.by_ip.get(row.ip)
    if entry is None:
        place = _place(row)
        state.by_ip[row.ip] = (place, (row.port,))
        if place is None:
            state.unlocated.add(row.ip)
        return
    place = entry[0]
    state.by_ip[row.ip] = (place, (*entry[1], row.port))
    if place is not None and _place(row) != place:
        row.country, row.asn, row.as_org, row.geo = place
        state.dirty["proxies"].add((row.ip, row.port))


def evicted(state: State, row: ProxyRow) -> None:
    entry = state.by_ip.get(row.ip)
    if entry is None:
        return
    ports = tuple(p for p in entry[1] if p != row.port)
    if ports:
        state.by_ip[row.ip] = (entry[0], ports)
    else:
        del state.by_ip[row.ip]
        state.unlocated.discard(row.ip)


def located(state: State, event: Located) -> None:
    """Copy a location onto the rows of its address, and of each address in ``more``
    (the same data version); an address no row has is passed over."""
    _locate(state, event.ip, (event.country, event.asn, event.as_org, event.geo))
    for p in event.more:
        _locate(state, p.ip, (p.country, p.asn, p.as_org, event.geo))


def _locate(state: State, ip: str, place: Place) -> None:
    entry = state.by_ip.get(ip)
    if entry is None:
        return
    place = PLACES.setdefault(place, place)
    was, ports = entry
    if was is place:
        return  # a re-sent lookup: the rows carry it already
    state.by_ip[ip] = (place, ports)
    if was is None:
        state.unlocated.discard(ip)
    rows, composition, dirty = state.proxies, state.composition, state.dirty["proxies"]
    country, asn, as_org, geo = place
    for port in ports:
        row = rows[(ip, port)]
        if row.geo != geo or row.country != country or row.asn != asn or row.as_org != as_org:
            if row.country != country:
                composition.moved(row, country)
                if row.fail_streak:
                    state.failing.moved(row, country)
            row.country, row.asn, row.as_org, row.geo = place
            dirty.add((ip, port))
