"""JSON codec for the event union, built once and shared.

Decoding is where bad input is caught: the reason it failed names the DLQ subject
(``ppf.dlq.<reason>``), so a bad message is kept, never folded and never lost.
"""

from __future__ import annotations

import msgspec

from events.catalogue import AnyEvent, Event

__all__ = ["DecodeError", "decode", "decode_many", "encode", "schema"]

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


class DecodeError(ValueError):
    """A payload that is not a valid event; ``reason`` is one DLQ subject token."""

    def __init__(self, reason: str, detail: str, index: int = -1) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        # Which result of a ProxiesChecked (-1: the whole message).
        self.index = index


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes | memoryview) -> Event:
    try:
        event: Event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        reason = "unknown_type" if "Invalid value" in text and "`$.type`" in text else "invalid"
        raise DecodeError(reason, text) from None
    except msgspec.DecodeError as exc:
        raise DecodeError("undecodable", str(exc)) from None
    return event


def decode_many(data: bytes) -> list[Event]:
    """Decode a JSON array of events (one HTTP batch), all or nothing."""
    try:
        events: list[Event] = msgspec.json.decode(data, type=list[AnyEvent])
    except msgspec.ValidationError as exc:
        raise DecodeError("invalid", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError("undecodable", str(exc)) from None
    return events


def schema() -> dict[str, object]:
    """JSON Schema of the whole union (committed under schemas/)."""
    return msgspec.json.schema(AnyEvent)
