"""The frames ppf's processes talk in over a pipe: a ``>Q`` length, then that many bytes
(the checkpoint writer, the snapshot's row summer, the telemetry tap)."""

from __future__ import annotations

import struct
from typing import BinaryIO

__all__ = ["FRAME", "read_frame"]

FRAME = struct.Struct(">Q")


def read_frame(inp: BinaryIO) -> bytes | None:
    """One frame from a pipe; None at its end or a short frame."""
    head = inp.read(8)
    if len(head) < 8:
        return None
    (size,) = FRAME.unpack(head)
    data = inp.read(size)
    return data if len(data) == size else None
