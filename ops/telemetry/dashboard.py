"""Build axiom/dashboard.json from axiom/queries.apl (beside this file): one chart a query.

Run ``python -m ops.telemetry.dashboard`` after editing the queries; a test checks the
committed JSON is what this builds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["build", "queries"]

AXIOM = Path(__file__).resolve().parent / "axiom"
_TABLE = ("by agent", "top 20", "by proto", "by anonymity")


def queries() -> dict[str, str]:
    """Title -> APL, in file order."""
    text = (AXIOM / "queries.apl").read_text()
    return dict(re.findall(r"// -- (.+?) --\n(\[.+?)\n", text))


def build() -> dict[str, Any]:
    charts = [
        {
            "id": f"c{i:02d}",
            "name": title,
            "type": "Table" if any(t in apl for t in _TABLE) else "TimeSeries",
            "query": {"apl": apl},
        }
        for i, (title, apl) in enumerate(queries().items())
    ]
    return {
        "name": "ppf fleet",
        "owner": "",
        "description": "Is the fleet healthy? Lease, fetch and fold rates, lag, errors, "
        "pool, agents, NATS, tap.",
        "charts": charts,
        "layout": [
            {"i": c["id"], "x": (i % 2) * 6, "y": (i // 2) * 4, "w": 6, "h": 4}
            for i, c in enumerate(charts)
        ],
        "refreshTime": 15,
        "schemaVersion": 2,
        "timeWindowStart": "qr-now-1h",
        "timeWindowEnd": "qr-now",
    }


if __name__ == "__main__":
    (AXIOM / "dashboard.json").write_text(json.dumps(build(), indent=2) + "\n")
