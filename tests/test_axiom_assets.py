"""The Axiom dashboard as code: every query has a chart, and every figure a query."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ops.telemetry.dashboard import build, queries

AXIOM = Path(__file__).resolve().parent.parent / "ops" / "telemetry" / "axiom"


def test_dashboard_json_is_built_from_the_queries() -> None:
    """The committed Axiom dashboard is exactly what the committed queries build."""
    committed = json.loads((AXIOM / "dashboard.json").read_text())
    assert committed == build()
    assert [c["query"]["apl"] for c in committed["charts"]] == list(queries().values())


def test_every_operator_figure_has_a_query() -> None:
    """Every figure an operator watches has a query in queries.apl."""
    names = " ".join(re.findall(r"// -- (.+?) --", (AXIOM / "queries.apl").read_text()))
    for figure in (
        "lease rate",
        "fetch rate",
        "fold rate",
        "fold lag",
        "error rate",
        "per-agent",
        "queue depth",
        "pool size by protocol",
        "anonymity",
        "NATS operations",
    ):
        assert figure in names, figure
