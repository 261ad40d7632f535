"""Which sites let an exit's TLS handshake through lately, as this endpoint's tunnels saw
it: the evidence a TLS alert needs before it is read as the site turning that exit away.
Without it, the alert may as well be the client's own bytes (a client sending anything
but a ClientHello draws one from every exit) or the site refusing everyone: it teaches
nothing then. Bounded: the least recently seen sites go first."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HANDSHAKE_S", "Handshakes"]

HANDSHAKE_S = 1_800.0  # a handshake that got through is evidence this long
SITES = 4_096


@dataclass
class Handshakes:
    # site -> when (loop time) an exit's handshake last got through, least recent first
    through: dict[str, float] = field(default_factory=dict)

    def got_through(self, site: str, now: float) -> None:
        self.through.pop(site, None)
        self.through[site] = now
        if len(self.through) > SITES:
            del self.through[next(iter(self.through))]

    def lately(self, site: str, now: float) -> bool:
        """Whether some exit's handshake with ``site`` got through in ``HANDSHAKE_S``."""
        at = self.through.get(site)
        return at is not None and now - at < HANDSHAKE_S
