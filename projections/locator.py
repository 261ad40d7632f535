"""Offline country and network lookups, published once per address as ``Located``.

The data is geoip2fast's own file (GeoLite2 country + AS organisation, IPv4), shipped
inside its wheel: no download, ~0.15 s to load, ~150k lookups/s. Its version goes into
every event, so replay needs no data file and a data update is visible in the log.

The ``Locator`` runs beside a fold (in ``ppf up``, ``ppf fold`` and every gateway): it
takes the addresses the projection has not located yet (``State.unlocated``), looks
them up off the event loop, and publishes ``Located`` with an id derived from the
address and the data version, so any number of replicas store it once.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import structlog

from eventlog.protocol import LogError
from events import Located, uuid7
from events import Place as EventPlace
from events.mint import now_ms
from projections.live import SLICE_S, FoldService, far_behind
from projections.tasks import stop_tasks

__all__ = ["Locator", "Place", "located_id", "lookup"]

log = structlog.get_logger("ppf.geo")


@dataclass(frozen=True, slots=True)
class Place:
    country: str
    as_org: str
    geo: str  # data version


@cache
def _data() -> tuple[Any, str]:
    from importlib.metadata import version

    from geoip2fast import GeoIP2Fast  # type: ignore[import-untyped]

    data = GeoIP2Fast(geoip2fast_data_file="geoip2fast-asn.dat.gz")
    source = str(data.get_database_info().get("source_info", "")).split(":")[-1]
    return data, f"geoip2fast-{version('geoip2fast')}:{source}"


def lookup(ip: str) -> Place:
    """Country (ISO alpha-2, "" for private or unknown) and AS organisation of ``ip``."""
    data, geo = _data()
    found = data.lookup(ip)
    country = str(getattr(found, "country_code", "") or "")
    if len(country) != 2 or not country.isalpha() or getattr(found, "is_private", False):
        country = ""
    org = str(getattr(found, "asn_name", "") or "")
    return Place(country, "" if org == "IANA.ORG" else org, geo)


def located_id(ip: str, geo: str) -> str:
    """The same address and data version give the same id on every replica."""
    return uuid7(0, hashlib.sha256(f"{ip}|{geo}".encode()).digest()[:10])


def _located(ips: list[str], places: list[Place], at: int, *, batches: bool) -> list[Located]:
    """One ``Located`` an address, or with ``batches`` one for them all per data version
    (the first in its fields, the rest in ``more``), each under an id its addresses and
    data version fix, so replicas that look up the same addresses publish one message
    (for one address, the id it always had)."""
    groups: list[list[tuple[str, Place]]]
    if batches:
        by_version: dict[str, list[tuple[str, Place]]] = {}
        for ip, p in zip(ips, places, strict=True):
            by_version.setdefault(p.geo, []).append((ip, p))
        groups = [sorted(found) for found in by_version.values()]
    else:
        groups = [[found] for found in zip(ips, places, strict=True)]
    out = []
    for (ip, first), *rest in groups:
        out.append(
            Located(
                id=located_id("|".join([ip, *(i for i, _ in rest)]), first.geo),
                agent="fold",
                at=at,
                ip=ip,
                country=first.country,
                as_org=first.as_org,
                geo=first.geo,
                more=[EventPlace(ip=i, country=p.country, as_org=p.as_org) for i, p in rest],
            )
        )
    return out


class Locator:
    """Publishes ``Located`` for what the projection has not located yet."""

    def __init__(self, fold: FoldService, *, every_s: float = 0.1, batch: int = 500) -> None:
        self.fold = fold
        self.every_s = every_s
        self.batch = batch
        self.published = 0
        self._asked: dict[str, float] = {}  # ip -> when; asked again after a minute
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(_data)  # load once, off the loop
        self._task = asyncio.create_task(self._run(), name="ppf-geo")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task], 5)

    async def _run(self) -> None:
        """Small batches, often: a burst of 100,000 new addresses is located at about
        5,000 a second without holding the event loop (queries share it) for more than
        a few milliseconds at a time; an idle pool is looked at once a second."""
        while True:
            done = 0
            try:
                done = await self.once()
            except LogError as exc:  # NATS away: the same addresses are asked again later
                log.warning("locate_failed", error=str(exc))
            await asyncio.sleep(self.every_s if done else 1.0)

    async def _look_up(self, ips: list[str]) -> list[Place]:
        """The places of ``ips``, looked up on the loop in slices of about ``SLICE_S``,
        giving way to the requests in flight between them, as the fold does. Not in a
        thread: a lookup is Python that holds the GIL, and while a thread held it every
        step of a request that gave the GIL up (each socket read and write) could wait
        up to the interpreter's switch interval (5 ms) to take it back."""
        places: list[Place] = []
        clock = time.perf_counter
        while len(places) < len(ips):
            until = clock() + SLICE_S
            for ip in ips[len(places) :]:
                places.append(lookup(ip))
                if clock() >= until:
                    break
            await self.fold.foreground.yield_to(SLICE_S)
        return places

    async def once(self) -> int:
        """Locate up to ``batch`` addresses not asked in the last minute; how many. None
        while the fold is more than ``LAG_BOUND`` messages behind the log: in a catch-up
        the addresses it has not seen located yet mostly are, further on (a gateway
        folding a 10M-observation log from sequence 1 put 151 batches of addresses
        located already into it, each a message every later start folds again)."""
        if await far_behind(self.fold):
            return 0
        now = time.monotonic()
        unlocated = self.fold.state.unlocated
        todo = []
        # A bounded look (the asked ones wait for their Located to come back): walking
        # the whole set, or rebuilding the asked map over the whole pool, every tick
        # holds the event loop in proportion to the pool (docs/decisions.md).
        for seen, ip in enumerate(unlocated):
            if now - self._asked.get(ip, -1e9) >= 60:
                todo.append(ip)
                if len(todo) >= self.batch:
                    break
            if seen >= 5 * self.batch:
                break
        if not todo:
            # Forget what has been located: the map never outgrows the unlocated set.
            if len(self._asked) > len(unlocated):
                self._asked = {ip: self._asked[ip] for ip in unlocated if ip in self._asked}
            return 0
        places = await self._look_up(todo)
        at = now_ms()
        events = _located(todo, places, at, batches=self.fold.state.settings.batches)
        for ip in todo:
            self._asked[ip] = now
        await self.fold.log.publish_many(events)
        self.published += len(events)
        return len(events)
