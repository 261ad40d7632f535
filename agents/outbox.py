"""An agent's outbox: the events not sent yet, on disk, sent first next time; what the
log will never take set aside beside it with its reason (``.rejected``)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec
import structlog

from events import DecodeError, Event, decode
from events.ids import uuid7_ms
from events.mint import fresh_id_after, now_ms

__all__ = ["OUTBOX_REPLAY_S", "Outbox"]

log = structlog.get_logger("ppf.agent")

# How long after its id's date an event may still be sent from the outbox: past it the
# fleet's re-send window (a setting at least this plus the skew allowed) may have
# forgotten it, so it is set aside in ``outbox.rejected`` as expired, not sent twice.
OUTBOX_REPLAY_S = 3_600


class _Dated(msgspec.Struct):
    """What the outbox's expiry reads of an event."""

    id: str = ""


class Outbox:
    """The file at ``path``; ``buffered``: the events it held when last written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.buffered = 0
        self._last_id = ""

    def unexpired(self, outbox: list[bytes]) -> list[bytes]:
        """The outbox less what is past ``OUTBOX_REPLAY_S``, which is set aside."""
        oldest = now_ms() - OUTBOX_REPLAY_S * 1000
        kept = []
        for line in outbox:
            try:
                dated = uuid7_ms(msgspec.json.decode(line, type=_Dated).id)
            except msgspec.DecodeError:
                dated = oldest  # left to the send, which sets a damaged line aside
            if 0 <= dated < oldest:
                self.set_aside(line, f"expired: older than the outbox's {OUTBOX_REPLAY_S} s")
            else:
                kept.append(line)
        return kept

    def stamp(self, events: list[Event], outbox: list[bytes]) -> list[Event]:
        """Each event gets a fresh id after the last one sent, as it is sent: the fold
        takes an agent's observations in id order and ignores one at or below the
        highest it has folded (a re-send), so ids must follow the order of sending, not
        of making (tasks make events concurrently). Sends are one at a time (the client's lock),
        and the outbox, sent first, holds only older ids."""
        if not self._last_id and outbox:
            with contextlib.suppress(DecodeError):
                self._last_id = decode(outbox[-1]).id
        stamped = []
        for event in events:
            self._last_id = fresh_id_after(self._last_id)
            stamped.append(msgspec.structs.replace(event, id=self._last_id))
        return stamped

    def set_aside(self, line: bytes, reason: str) -> None:
        bad = self.path.with_suffix(".rejected")
        bad.parent.mkdir(parents=True, exist_ok=True)
        with bad.open("ab") as f:
            f.write(reason.encode()[:300].replace(b"\n", b" ") + b"\t" + line + b"\n")
        log.error("event_set_aside", reason=reason, kept_in=str(bad))

    def read(self) -> list[bytes]:
        if not self.path.exists():
            return []
        return [line for line in self.path.read_bytes().splitlines() if line.strip()]

    def write(self, encoded: list[bytes]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(b"\n".join(encoded) + b"\n")
        tmp.replace(self.path)  # atomic: a crash leaves the old or the new outbox
        self.buffered = len(encoded)
