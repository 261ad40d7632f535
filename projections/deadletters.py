"""Refused messages into the DLQ: one entry a message, once the fold has applied it whole
(a round's refused results gathered), kept, never folded; and the bytes each agent had
refused, what cuts it off (gateway/penalty.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import structlog

from eventlog.protocol import EventLog, LogError
from events import AGENT_PREFIX, DecodeError, dlq_subject

__all__ = ["DLQ_COPY_BYTES", "DeadLetters"]

log = structlog.get_logger("ppf.fold")

DLQ_COPY_BYTES = 16_384  # of a rejected message, copied into its DLQ entry
DLQ_SMALL = 256  # of a message, copied whatever its entry's headers weigh
_AGENT_PREFIX = AGENT_PREFIX.encode()
_json = msgspec.json.Encoder().encode


class DeadLetters:
    """The fold's refusals (``refused``, the Folder's callback) written to
    ``ppf.dlq.<reason>`` by ``run``, when ``write``; counted per agent either way (a
    gateway beside the fold that writes them counts them too)."""

    def __init__(self, log_client: EventLog, applied: Callable[[], int], *, write: bool) -> None:
        self.log = log_client
        self._applied = applied  # the fold's last applied sequence
        self.write = write
        # A message's refusals (a round's results, one by one), kept until it is whole,
        # then written as one DLQ entry: by sequence, (subject, payload, refusals).
        self._refused: dict[int, tuple[bytes, bytes, list[DecodeError]]] = {}
        self._refusing = asyncio.Event()
        self.sent = 0
        # Bytes of refused messages on each agent's own subjects, this process's count.
        self.refused_bytes: dict[str, int] = {}
        self._counted_seq = 0

    @property
    def pending(self) -> int:
        return len(self._refused)

    def refused(self, seq: int, subject: bytes, payload: bytes, exc: DecodeError) -> None:
        """The Folder's word that a message (or a round's result) was refused."""
        if not self.write:
            self._count(seq, subject, payload)
            return
        log.warning(
            "event_rejected",
            seq=seq,
            subject=subject.decode(errors="replace"),
            reason=exc.reason,
            detail=exc.detail[:200],
            **({"index": exc.index} if exc.index >= 0 else {}),
        )
        refused = self._refused.get(seq)
        if refused is None:
            refused = self._refused[seq] = (subject, payload, [])
        self._count(seq, subject, payload)
        refused[2].append(exc)
        self._refusing.set()

    def _count(self, seq: int, subject: bytes, payload: bytes) -> None:
        """A refused message's bytes, once (a round's refused results come one by one),
        to the agent whose own subject it came on."""
        if seq == self._counted_seq or not subject.startswith(_AGENT_PREFIX):
            return
        self._counted_seq = seq
        agent = subject[len(_AGENT_PREFIX) :].partition(b".")[0].decode(errors="replace")
        self.refused_bytes[agent] = self.refused_bytes.get(agent, 0) + len(payload)

    async def run(self) -> None:
        """One DLQ entry a refused message, once the fold has applied it whole (a round's
        refused results are gathered): at most the size of the message it names, so
        refused input grows the log by at most its own size again."""
        while True:
            await self._refusing.wait()
            self._refusing.clear()
            applied = self._applied()
            whole = [seq for seq in self._refused if seq <= applied]
            if len(whole) < len(self._refused):
                self._refusing.set()  # a round still being folded: looked at again
                await asyncio.sleep(0.05)
            for seq in whole:
                subject, payload, refusals = self._refused[seq]
                await self._write(seq, subject, payload, refusals)
                del self._refused[seq]

    async def _write(
        self, seq: int, subject: bytes, payload: bytes, refusals: list[DecodeError]
    ) -> None:
        first = refusals[0]
        headers = {
            "Ppf-Seq": str(seq),
            "Ppf-Subject": subject.decode(errors="replace"),
            "Ppf-Reason": first.reason,
            "Ppf-Error": first.detail[:500],
            "Ppf-Size": str(len(payload)),
        }
        if first.index >= 0:  # a round's results: which were refused, and why
            headers["Ppf-Index"] = str(first.index)
            headers["Ppf-Refused"] = str(len(refusals))
            said = [[r.index, r.reason, r.detail[:120]] for r in refusals]
            headers["Ppf-Refusals"] = _json(said)[:DLQ_COPY_BYTES].decode(errors="replace")
        # The original stays in the log at Ppf-Seq; the copy is for reading, cut so the
        # entry is no larger than the message (a megabyte of junk is not stored twice,
        # nor a round's 16 KiB once for each of its 500 results), but for the first
        # DLQ_SMALL bytes, which a small message keeps whole.
        room = len(payload) - sum(len(k) + len(v) + 4 for k, v in headers.items())
        copy = payload[: min(DLQ_COPY_BYTES, max(room, DLQ_SMALL))]
        while True:
            try:
                # The id is the original sequence's: a fold that restarts and meets the
                # same bad message again stores its DLQ entry once.
                await self.log.publish_raw(
                    dlq_subject(first.reason), copy, msg_id=f"dlq-{seq}", headers=headers
                )
                self.sent += 1
                return
            except LogError as err:
                log.warning("dlq_publish_retried", seq=seq, error=str(err))
                await asyncio.sleep(1.0)
