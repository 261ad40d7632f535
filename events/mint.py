"""The clock, fresh event ids and agent tokens: the one place the edges read time and
draw entropy.

It sits beside the catalogue because every part that mints an event needs it, and it is
the only module of ``events/`` that is not pure: the core (``reducers/``, the read
models) never imports it, and a test holds that (``tests/test_purity.py``). Reducers
take their time from the message, never from here.
"""

from __future__ import annotations

import os
import random
import secrets
import time

from events.catalogue import AgentEnrolled, Role
from events.ids import token_sha256, uuid7, uuid7_after

__all__ = ["enrollment", "fresh_id", "fresh_id_after", "now_ms"]


def now_ms() -> int:
    """This machine's wall clock in unix milliseconds (the API's unit of time)."""
    return time.time_ns() // 1_000_000


# Ids need uniqueness, not secrecy: a PRNG seeded from the OS (and reseeded in every
# forked child, which would otherwise repeat its parent's ids) instead of a getrandom
# syscall per event, which showed up at 7% of the gateway's time under lease load.
_entropy = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _entropy.seed(os.urandom(32)))


def fresh_id() -> str:
    """A new UUIDv7 event id, from this machine's clock and entropy."""
    return uuid7(now_ms(), _entropy.getrandbits(80).to_bytes(10, "big"))


def fresh_id_after(previous: str) -> str:
    """A new id that sorts after ``previous``: how an agent numbers what it sends."""
    return uuid7_after(fresh_id(), previous)


def enrollment(name: str, role: Role, *, by: str = "admin") -> tuple[str, AgentEnrolled]:
    """A fresh token for agent ``name`` and the ``AgentEnrolled`` that makes it valid.

    Only the token's SHA-256 goes into the log; the token itself is shown once, to the
    operator who asked for it, and kept nowhere.
    """
    token = secrets.token_urlsafe(32)
    while token.startswith("-"):  # `--token -x...` reads as an option to argparse
        token = secrets.token_urlsafe(32)
    event = AgentEnrolled(
        id=fresh_id(), agent=by, at=now_ms(), name=name, role=role, token_sha256=token_sha256(token)
    )
    return token, event
