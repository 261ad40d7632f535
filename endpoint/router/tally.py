"""What this endpoint's traffic said of each (proxy, site), for the log: counted between
two rounds (``take``), the feed sends them as ``SitesChecked`` (endpoint/feed.py).

An answer read as the site's own page only because the answers to its URL were alike,
on a site not seen telling a page from its block (router/verdicts.py ``ALIKE``), is
**held**: most exits may be turned away, so answers alike may be the block alike until
a real page tells them apart, and a round sent before that carried the block as
``through`` to the fleet, where nothing unsaid it. Held answers go to the log once their
site has gone ``HOLD_S`` without telling a page from a block; at its first split they
are unsaid (``unsay_alike``). The picks here take them at once (router/standing.py):
only the log waits; at the first split, the proxies whose answers alike were of the
class told as the block lose that standing (router/pages.py ``told``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from endpoint.link.upstream import Upstream

__all__ = ["HOLD_S", "MAX_VERDICTS", "Tally"]

MAX_VERDICTS = 50_000  # (proxy, site) cells counted between two rounds to the log
HOLD_S = 60.0  # a site's answers read alike wait this long without a split for the log

Cell = tuple[str, int, str]  # (ip, port, site)


@dataclass
class Tally:
    """``(ip, port, site) -> [answers through, turned away]`` since the feed last took
    them, and the answers held (``hold``); past ``MAX_VERDICTS`` cells in all, counted
    as ``dropped``."""

    cells: dict[Cell, list[int]] = field(default_factory=dict)
    held: dict[Cell, int] = field(default_factory=dict)
    # A site with answers held: when the first of them came (loop time).
    held_since: dict[str, float] = field(default_factory=dict)
    dropped: int = 0
    hold_s: float = HOLD_S

    def count(self, up: Upstream, site: str, kind: int) -> None:
        """An answer through ``up`` said ``site``'s page (``kind`` 0) or its block (1)."""
        cell = self.cells.get((up.ip, up.port, site))
        if cell is None:
            if self._full():
                self.dropped += 1
                return
            cell = self.cells[(up.ip, up.port, site)] = [0, 0]
        cell[kind] += 1

    def hold(self, up: Upstream, site: str, now: float) -> None:
        """An answer through ``up`` read as ``site``'s page because answers were alike."""
        key = (up.ip, up.port, site)
        if key not in self.held and self._full():
            self.dropped += 1
            return
        self.held[key] = self.held.get(key, 0) + 1
        self.held_since.setdefault(site, now)

    def unsay_alike(self, site: str) -> int:
        """``site`` told a page from its block for the first time: what answers alike
        said there is unsaid (how many), for they may have been the block alike."""
        unsaid = 0
        for key in [k for k in self.held if k[2] == site]:
            unsaid += self.held.pop(key)
        self.held_since.pop(site, None)
        return unsaid

    def take(self, now: float) -> tuple[dict[Cell, list[int]], int]:
        """What was counted since the last take, with the answers held of the sites that
        went ``hold_s`` without a split by ``now`` (and the cells dropped); a fresh count
        from here."""
        ripe = {site for site, since in self.held_since.items() if now - since >= self.hold_s}
        for key in [k for k in self.held if k[2] in ripe]:
            cell = self.cells.setdefault(key, [0, 0])
            cell[0] += self.held.pop(key)
        for site in ripe:
            del self.held_since[site]
        taken, self.cells = self.cells, {}
        dropped, self.dropped = self.dropped, 0
        return taken, dropped

    def _full(self) -> bool:
        return len(self.cells) + len(self.held) >= MAX_VERDICTS
