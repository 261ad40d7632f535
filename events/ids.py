"""UUIDv7 event ids and token digests. Pure: the caller at the edge supplies the clock and
the entropy (``events/mint.py``)."""

from __future__ import annotations

import hashlib

__all__ = ["token_sha256", "uuid7", "uuid7_after", "uuid7_ms"]


def token_sha256(token: str) -> str:
    """What the log keeps of an agent token (never the token itself)."""
    return hashlib.sha256(token.strip().encode()).hexdigest()


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


def uuid7_after(candidate: str, previous: str) -> str:
    """``candidate`` when it sorts after ``previous``, else the id just after
    ``previous`` (its random bits plus one): ids an agent sends stay in order even
    within one millisecond, or when its clock steps back a little."""
    if candidate > previous:
        return candidate
    value = int(previous.replace("-", ""), 16) + 1
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_HEX = frozenset("0123456789abcdef")


def uuid7_ms(event_id: str) -> int:
    """The unix ms a UUIDv7 in its canonical form is dated at; -1 for anything else."""
    head = event_id[:8] + event_id[9:13]
    if len(event_id) != 36 or event_id[14] != "7" or not _HEX.issuperset(head):
        return -1
    return int(head, 16)
