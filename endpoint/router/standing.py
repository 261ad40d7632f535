"""What this endpoint learned of sites: which upstreams get through to each, as its own
traffic and the fleet's verdicts said (endpoint/router/choose.py's picks prefer them);
an upstream that served a block loses its standing at once.

Never worse than blind: the picks send the first attempt of ``EXPLORE`` of a site's
plain-HTTP requests to upstreams with no standing there (when the pick's sample of the
pool holds one: it never walks the pool for one), so what the fleet learns does
not come only from the few routing already prefers (``works_on``'s recall); a miss
costs the consumer an attempt, never the page, since a block (told by its head, or by
its page, held back until read) is tried again through a known proxy."""

from __future__ import annotations

from dataclasses import dataclass, field

from endpoint.link.upstream import Upstream

__all__ = ["EXPLORE", "MAX_SITES", "MIN_EXITS", "SITE_BLOCK_S", "Standing"]

SITE_BLOCK_S = 1_800.0  # a site's block of a proxy, as seen here, holds for that site
# Sites whose upstreams known to get through are remembered here; past it, the least
# recently asked for or learned goes, so a pool that has run a while still learns.
MAX_SITES = 1_024
EXPLORE = 0.25  # of a site's plain-HTTP requests, first tried with no standing there
MIN_EXITS = 2  # distinct exits among a site's known upstreams before the picks prefer them


@dataclass
class Standing:
    # site -> the upstreams known to get through to it, as this endpoint saw them.
    through: dict[str, dict[tuple[str, int], Upstream]] = field(default_factory=dict)
    # site -> its upstreams in ``through`` as a list, made again only once they change:
    # a pick samples a list, and copying thousands at every request was most of it.
    _listed: dict[str, list[Upstream]] = field(default_factory=dict)

    def known(self, site: str) -> list[Upstream]:
        """``site``'s upstreams known to get through, once they come out of at least
        ``MIN_EXITS`` distinct exits (an unknown exit counts as its proxy's own), else
        none: the picks prefer them only then, so one exit's luck (many proxies behind
        one NAT, an exit the site has not listed yet) does not pile a site's requests on
        it. The site is now the most recent, either way."""
        known = self.through.pop(site, None)  # and put back last: the most recent
        if not known:
            self._listed.pop(site, None)
            return []
        self.through[site] = known
        listed = self._listed.get(site)
        if listed is None:
            listed = self._listed[site] = list(known.values())
        exits: set[str] = set()
        for up in listed:  # most often done at the second
            exits.add(up.exit_ip or up.ip)
            if len(exits) >= MIN_EXITS:
                return listed
        return []

    def got_through(self, up: Upstream, site: str) -> None:
        up.turned_away.pop(site, None)
        known = self.through.pop(site, None)  # and put back last: the most recent
        if known is None and len(self.through) >= MAX_SITES:
            oldest = next(iter(self.through))
            del self.through[oldest]
            self._listed.pop(oldest, None)
        known = self.through[site] = known or {}
        if known.get(up.key) is not up:
            known[up.key] = up
            self._listed.pop(site, None)

    def lost(self, up: Upstream, site: str) -> None:
        """``up`` served ``site``'s block: no standing there any more."""
        self.lose(site, {up.key})

    def lose(self, site: str, keys: set[tuple[str, int]]) -> None:
        """The upstreams ``keys`` served ``site``'s block: no standing there any more."""
        known = self.through.get(site)
        if known is not None:
            for key in keys:
                if known.pop(key, None) is not None:
                    self._listed.pop(site, None)

    def closed_on(self, up: Upstream, site: str, now: float) -> bool:
        """A fresh connection through ``up`` to ``site`` ended before any answer: the
        site's refusal (True: the caller marks it turned away) when no other site did so
        lately; else the proxy's failure (False: a failure on two sites is the proxy's,
        for the caller to count)."""
        other, until = up.closed_by
        if other and other != site and until > now:
            return False
        up.closed_by = (site, now + SITE_BLOCK_S)
        return True

    def let_go(self, gone: set[tuple[str, int]]) -> None:
        """The upstreams ``gone`` left the pool (a new pool from the feed): no standing
        anywhere. Those still in it keep their ``Upstream`` (router/choose.py
        ``replacing``) and only the pool's own get a standing (``Pool.got_through``), so
        the rest stand as they are: making every site's map anew held the loop 220 ms at
        a million standings (docs/decisions.md, The endpoint)."""
        if not gone:
            return
        for site, known in self.through.items():
            if len(gone) < len(known):
                left = [key for key in gone if known.pop(key, None) is not None]
            else:
                left = [key for key in known if key in gone]
                for key in left:
                    del known[key]
            if left:
                self._listed.pop(site, None)
