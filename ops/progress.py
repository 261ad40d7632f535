"""A progress bar with rate and ETA on a terminal; silence (JSON logs only) elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, label: str, total: int | None, *, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self.done = 0
        self._t0 = time.monotonic()
        self._last = 0.0

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.2 and done != self.total:
            return
        self._last = now
        elapsed = max(now - self._t0, 1e-9)
        rate = done / elapsed
        if self.total:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            eta = (self.total - done) / rate if rate > 0 else 0.0
            text = f"{self.label} [{bar:<30}] {done}/{self.total} {rate:,.0f}/s eta {eta:.0f}s"
        else:
            text = f"{self.label} {done} {rate:,.0f}/s"
        self.stream.write("\r" + text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
