"""The replay driver: rebuild the projections from a run of log messages into a fresh file."""

from __future__ import annotations

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
    every_events: int = 500_000,
    every_ms: int = 5_000,
    on_batch: Callable[[list[Message]], None] | None = None,
) -> Folder:
    """Fold every message into a new DuckDB file, committed; the folder holds the state."""
    path = Path(db)
    if path.exists():
        raise StoreError(f"{path} exists: replay writes a fresh file, give another path")
    state = State()
    folder = Folder(state)
    # The digest of a replay is computed once from its state (``digest(state)``).
    checkpointer = Checkpointer(
        path, every_events=every_events, every_ms=every_ms, keep_digest=False
    )
    await checkpointer.start()
    try:
        async for batch in batches:
            folder.apply(batch)
            if on_batch is not None:
                on_batch(batch)
            await checkpointer.maybe(state)
            if on_progress is not None:
                on_progress(state.last_seq)
        await checkpointer.flush(state)
    finally:
        await checkpointer.close()
    return folder
