"""What ``/delete/`` hides from the client that called it (gateway/dropin.py).

proxy_pool's users call ``delete_proxy(p)`` on any failure and ``get_proxy()`` again at
once: they expect not to get ``p`` back. The fleet still judges ``p`` for everyone (the
call is a report, reducers/reports.py); the caller, named by its consumer token when it
sends one and by its address otherwise, is not served ``p`` again by any drop-in call
for ``HIDE_S``, or, when the deletion named a site, by a call naming that site
(``works_on``). Kept in this gateway's memory only: another gateway, or this one
restarted, does not know it; a client's address never enters the log. Bounded: at most
``MAX_PER_CLIENT`` proxies a client and ``MAX_CLIENTS`` clients, the oldest deletions
let go first, counted (``dropped``) and said in the log.
"""

from __future__ import annotations

import structlog

__all__ = ["HIDE_S", "Deleted"]

log = structlog.get_logger("ppf.gateway")

HIDE_S = 24 * 3_600
MAX_PER_CLIENT = 10_000
MAX_CLIENTS = 100_000

Hidden = tuple[str, int, str]  # ip, port, the site named ("": every call)


class Deleted:
    def __init__(self, hide_s: float = HIDE_S) -> None:
        self.hide_s = hide_s
        # client -> (ip, port, site) -> until (monotonic), in the order they were deleted
        self._by: dict[str, dict[Hidden, float]] = {}
        self.dropped = 0

    def hide(self, client: str, ip: str, port: int, site: str, now: float) -> None:
        hidden = self._by.pop(client, None)
        if hidden is None:
            if len(self._by) >= MAX_CLIENTS:  # the client that deleted longest ago goes
                oldest = next(iter(self._by))
                self._drop(len(self._by.pop(oldest)), "clients")
            hidden = {}
        self._by[client] = hidden  # last in the order: the latest to delete
        hidden.pop((ip, port, site), None)
        hidden[(ip, port, site)] = now + self.hide_s
        if len(hidden) > MAX_PER_CLIENT:
            for key in [k for k, until in hidden.items() if until <= now]:
                del hidden[key]
            while len(hidden) > MAX_PER_CLIENT:
                del hidden[next(iter(hidden))]
                self._drop(1, "proxies of a client")

    def hidden(self, client: str, sites: tuple[str, ...], now: float) -> set[tuple[str, int]]:
        """The proxies ``client`` is not served by a call naming ``sites``."""
        hidden = self._by.get(client)
        if not hidden:
            return set()
        out = set()
        for (ip, port, site), until in list(hidden.items()):
            if until <= now:
                del hidden[(ip, port, site)]
            elif not site or site in sites:
                out.add((ip, port))
        if not hidden:
            del self._by[client]
        return out

    def _drop(self, count: int, what: str) -> None:
        self.dropped += count
        log.warning("dropin_deletions_let_go", count=count, past_cap=what, total=self.dropped)
