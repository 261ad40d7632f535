"""State containers, read models, digests, DuckDB checkpoints and the replay driver."""

from projections.core.digest import digest, digests
from projections.folder import Checkpointer, Folder
from projections.store import DDL, Store, StoreError

__all__ = ["DDL", "Checkpointer", "Folder", "Store", "StoreError", "digest", "digests"]
