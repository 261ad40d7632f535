"""UUIDv7 event ids. Pure: the caller at the edge supplies the clock and the entropy."""

from __future__ import annotations

__all__ = ["uuid7"]


def uuid7(unix_ms: int, rand: bytes) -> str:
    """A UUIDv7 (RFC 9562) from a millisecond timestamp and 10 random bytes."""
    if len(rand) < 10:
        raise ValueError("uuid7 needs 10 random bytes")
    r = int.from_bytes(rand[:10], "big")
    rand_a = (r >> 68) & 0xFFF
    rand_b = r & ((1 << 62) - 1)
    value = (
        ((unix_ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
