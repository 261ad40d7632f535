"""State containers, read models, digests, DuckDB checkpoints and the replay driver.

Its names are imported when first asked for (PEP 562): a child process that needs one
module of the package, the snapshot's row summer (``projections/rowsums.py``), starts
without DuckDB and the folder (0.3 s of its start, on the way of a gateway's).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projections.core.digest import digest, digests
    from projections.folder import Checkpointer, Folder
    from projections.store import DDL, Store, StoreError

__all__ = ["DDL", "Checkpointer", "Folder", "Store", "StoreError", "digest", "digests"]

_FROM = {
    "digest": "projections.core.digest",
    "digests": "projections.core.digest",
    "Checkpointer": "projections.folder",
    "Folder": "projections.folder",
    "DDL": "projections.store",
    "Store": "projections.store",
    "StoreError": "projections.store",
}


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'projections' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
