"""The endpoints' figures as the gateway sums them (gateway/endpoints.py): rates over each
process's last minute of reports, a restart counted from zero, silent processes left out,
and a token naming ever new processes kept within the gateway's memory."""

from __future__ import annotations

import pytest

from events.wire import EndpointFigures
from gateway import endpoints
from gateway.endpoints import EndpointBoard


def _figures(process: str, **counts: int) -> EndpointFigures:
    return EndpointFigures(process=process, counts=counts, first_byte_ms=[5.0, 7.0, 50.0])


def test_rates_are_over_the_last_minute_summed_over_processes_and_restarts_count_anew() -> None:
    """Two workers' reports 10 s apart: their rates add up; the answered share is the
    pool's (a login refused is the client's, not counted against it); a process whose
    counts fell restarted and has no rate until its next report; one silent for 30 s is
    left out."""
    board = EndpointBoard()
    board.take("edge", _figures("w1", forwarded=100, no_proxy=0), at=0.0)
    board.take("edge", _figures("w2", forwarded=50), at=0.0)
    board.take("edge", _figures("w1", forwarded=190, no_proxy=10, login_refused=5), at=10.0)
    board.take("edge", _figures("w2", forwarded=150), at=10.0)
    said = board.summary(at=10.0)
    assert (said["endpoints"], said["processes"]) == (1, 2)
    assert said["requests_per_s"] == 20.5  # 9 + 1 + 0.5 (w1), 10 (w2)
    assert said["answered_share"] == round(19 / 20, 4)
    assert said["first_byte_ms"] == {"p50": 7.0, "p99": 50.0}
    nothing = "nothing in the pool matches"
    assert said["refused_503"][nothing] == {"per_s": 1.0, "total": 10}
    board.take("edge", _figures("w2", forwarded=3), at=12.0)  # w2 restarted
    assert board.summary(at=12.0)["requests_per_s"] == 10.5  # w1's alone
    assert board.summary(at=43.0)["processes"] == 0  # both silent past KEPT_S


def test_a_token_naming_new_processes_without_end_stays_within_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint's token posting ever new process names: the board never holds more
    than MAX_PROCESSES, its oldest let go first."""
    monkeypatch.setattr(endpoints, "MAX_PROCESSES", 8)
    board = EndpointBoard()
    for n in range(100):
        board.take("edge", _figures(f"p{n}", forwarded=n), at=float(n) / 100)
    said = board.summary(at=1.0)
    assert said["processes"] == 8
    assert said["totals"]["forwarded"] == sum(range(92, 100))
