"""Generated, committed schemas: events' JSON Schema, the OpenAPI document, the DDL."""

from __future__ import annotations

import json

from events import schema
from gateway.api import openapi
from projections.store import DDL

__all__ = ["generate"]


def generate() -> dict[str, str]:
    """File name -> content, exactly as committed under schemas/."""
    return {
        "events.schema.json": json.dumps(schema(), indent=2, sort_keys=True) + "\n",
        "openapi.json": json.dumps(openapi(), indent=2, sort_keys=True) + "\n",
        "duckdb.sql": "-- DuckDB DDL of the checkpointed projections: the tables State declares\n"
        "-- (reducers/state.py), as projections/store.py makes them\n" + DDL,
    }
