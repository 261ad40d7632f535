"""How much one consumer's traffic may teach the endpoint about a site for everyone.

A site turning a request away marks that proxy turned away there for every consumer
(``Pool.turned_away``) and goes to the fleet in the endpoint's rounds. One consumer may
so mark at most ``SHARE`` of the pool (at least ``MIN_MARKS`` proxies) for one site in
``SITE_BLOCK_S``; past that, what its traffic shows acts for itself alone: the proxy is
left out of its own picks for that site, never of another consumer's, and nothing of it
goes to the log. So a consumer that draws refusals on purpose (a path that answers 403,
junk for a TLS handshake) cannot turn a site's pool away for everyone, while an honest
one still routes around what it met. Bounded: ``CONSUMER_SITES`` pairs, the least
recently marked let go first, and ``PRIVATE_MARKS`` proxies a pair, the oldest let go
first (tried again): a consumer whose refusals left out nearly the whole pool made each
of its picks walk the pool three times to find none (0.2 s a request at 100,000
proxies), and its marks, never let go, grew for as long as it asked.

A proxy that took a request and then failed on the way (no answer, an answer that is
not HTTP, a close, a CONNECT refused or never replied to) may be dead, or the site may
be one that never answers it: a consumer names the site, and a port where nothing
listens, or a server of its own that never answers, fails every proxy so. Such
failures act for everyone (the proxy avoided, ``Pool.failed``) within one more share
of the consumer's, across all sites (``may_fail``); past it, the proxy is left out of
that consumer's own picks at that site for ``AVOID_S``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from endpoint.router.choose import SITE_BLOCK_S

__all__ = ["CONSUMER_SITES", "MIN_MARKS", "PRIVATE_MARKS", "SHARE", "Shares"]

SHARE = 0.05
MIN_MARKS = 2
CONSUMER_SITES = 10_000
PRIVATE_MARKS = 256

Key = tuple[str, int]
K = TypeVar("K")
V = TypeVar("V")


@dataclass
class Shares:
    # (consumer, site) -> when each of its shared marks ends, oldest first
    shared: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    # (consumer, site) -> proxy -> until when it is left out of that consumer's picks
    private: dict[tuple[str, str], dict[Key, float]] = field(default_factory=dict)
    # consumer -> when each of its failures on the way shared as the proxy's ends
    failed: dict[str, list[float]] = field(default_factory=dict)

    def may_share(self, consumer: str, site: str, pool_size: int, now: float) -> bool:
        """Whether one more mark of ``consumer``'s for ``site`` acts for everyone: taken
        from its share when it does."""
        return _take(self.shared, (consumer, site), pool_size, now)

    def may_fail(self, consumer: str, pool_size: int, now: float) -> bool:
        """Whether one more failure on the way ``consumer`` met acts for everyone (the
        proxy's failure): taken from its share of them, across sites, when it does. Kept
        apart from the sites' pairs, so a consumer churning through sites of its own
        cannot push its record of this share out and start it again."""
        return _take(self.failed, consumer, pool_size, now)

    def keep_private(
        self, consumer: str, site: str, key: Key, now: float, for_s: float = SITE_BLOCK_S
    ) -> None:
        """``key`` left out of ``consumer``'s picks at ``site`` for ``for_s``."""
        pair = (consumer, site)
        kept = self.private.pop(pair, {})
        # Marked again: the newest, for the longer of its two times.
        kept[key] = max(now + for_s, kept.pop(key, 0.0))
        if len(kept) > PRIVATE_MARKS:  # the least recently marked goes
            del kept[next(iter(kept))]
        self.private[pair] = kept
        _bound(self.private)

    def left_out(self, consumer: str, site: str, now: float) -> frozenset[Key]:
        """The proxies ``consumer``'s own refusals and failures at ``site`` leave out of
        its picks."""
        kept = self.private.get((consumer, site))
        if not kept:
            return frozenset()
        return frozenset(key for key, until in kept.items() if until > now)


def _take(table: dict[K, list[float]], key: K, pool_size: int, now: float) -> bool:
    """Whether one more mark under ``key`` fits its share of a pool of ``pool_size``
    (``SHARE``, at least ``MIN_MARKS``, each for ``SITE_BLOCK_S``): taken when it does;
    the key now the most recently marked."""
    ends = [t for t in table.pop(key, []) if t > now]
    fits = len(ends) < max(MIN_MARKS, int(SHARE * pool_size))
    if fits:
        ends.append(now + SITE_BLOCK_S)
    if ends:
        table[key] = ends
        _bound(table)
    return fits


def _bound(table: dict[K, V]) -> None:
    while len(table) > CONSUMER_SITES:
        del table[next(iter(table))]
