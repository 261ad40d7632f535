"""The replay driver: rebuild the projections from a run of log messages into a fresh file."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterable, Callable
from pathlib import Path

from projections.folder import Checkpointer, Folder, Message
from projections.store import StoreError
from reducers import State

__all__ = ["replay"]


async def replay(
    batches: AsyncIterable[list[Message]],
    db: str | Path,
    *,
    on_progress: Callable[[int], None] | None = None,
    every_events: int | None = None,
    every_ms: int | None = None,
    on_batch: Callable[[list[Message]], None] | None = None,
    state: State | None = None,
) -> Folder:
    """Fold every message into a new DuckDB file, committed; the folder holds the state.
    ``state``: where to start (a loaded snapshot), the batches being its tail.

    The file is written once, at the end, unless ``every_events`` or ``every_ms`` ask for
    checkpoints on the way: nothing reads a replay's file before it is complete, and a
    checkpoint on the way writes rows that later events change again
    (docs/decisions.md, The fold).
    """
    path = Path(db)
    if path.exists():
        raise StoreError(f"{path} exists: replay writes a fresh file, give another path")
    if state is None:
        state = State()
    else:  # a snapshot's state (``--from-snapshot``): the file gets all its rows
        state.mark_all_dirty()
    folder = Folder(state)
    on_the_way = every_events is not None or every_ms is not None
    # The digest of a replay is computed once from its state (``digest(state)``).
    checkpointer = Checkpointer(
        path,
        every_events=every_events or sys.maxsize,
        every_ms=every_ms or sys.maxsize,
        keep_digest=False,
    )
    await checkpointer.start()
    try:
        async for batch in batches:
            folder.apply(batch)
            if on_batch is not None:
                on_batch(batch)
            if on_the_way:
                await checkpointer.maybe(state)
            if on_progress is not None:
                on_progress(state.last_seq)
        await checkpointer.flush(state)
    finally:
        await checkpointer.close()
    return folder
