"""Facts checked in one place (events/validate.py): what a field may hold, beyond its type."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import CheckResult, ProxiesChecked
from events.batches import expand
from events.validate import (
    host_can_be_public,
    legacy_ipv4,
    problem,
    result_problems,
    url_problem,
)
from tests.helpers import worked


@pytest.mark.parametrize(
    ("host", "public"),
    [
        ("8.8.8.8", True),
        ("0x08080808", True),
        ("lists.example.net", True),
        ("2001:4860:4860::8888", True),
        ("127.0.0.1", False),
        ("2130706433", False),
        ("0x7f.1", False),
        ("0177.0.0.1", False),
        ("127.1", False),
        ("10.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("[::1]", False),
        ("localhost", False),
        ("intranet", False),
        ("printer.local", False),
        ("db.internal", False),
        ("nas.lan", False),
    ],
)
def test_hosts_that_cannot_be_public_in_any_notation(host: str, public: bool) -> None:
    """Private, loopback, link-local and shared ranges in decimal, hex, octal and short
    forms, and names that are never public; names themselves are not resolved."""
    assert host_can_be_public(host) is public


def test_legacy_notations_are_read_as_inet_aton_reads_them() -> None:
    """The fetch guard and the sources' rule share this reading: what inet_aton takes
    is an address, anything else (signs, underscores, five parts) a name."""
    assert legacy_ipv4("0x7f.1") == "127.0.0.1"
    assert legacy_ipv4("2130706433") == "127.0.0.1"
    assert legacy_ipv4("0177.0.0.01") == "127.0.0.1"
    for name in ("1_0.0.0.1", "+1.2.3.4", "1.2.3.4.5", "1..2", "256.1.1.1", "example.com"):
        assert legacy_ipv4(name) is None, name


def test_urls_only_http_and_https_without_control_characters() -> None:
    """Sources are http(s) URLs with a host that can be public (unless lab mode)."""
    assert url_problem("https://lists.example.net/p.txt", lab=False) == ""
    assert "scheme" in url_problem("file:///etc/passwd", lab=False)
    assert "scheme" in url_problem("javascript:alert(1)", lab=False)
    assert "control" in url_problem("http://a.example/\u202ex", lab=False)
    assert "cannot be public" in url_problem("http://127.0.0.1:8080/", lab=False)
    assert url_problem("http://127.0.0.1:8080/", lab=True) == ""  # the lab's own pages
    assert "longer" in url_problem("http://a.example/" + "x" * 3000, lab=False)


@settings(max_examples=300, deadline=None)
@given(
    proto=st.sampled_from(["http", "socks5", "ftp", "", "../\u202e<x>"]),
    latency=st.integers(-5, 700_000),
    exit_ip=st.sampled_from(["", "8.8.8.8", "1.2.3.4", "<script>", "::1", "999.1.1.1"]),
    source=st.sampled_from(["", "0123456789abcdef", "0123456789ABCDEF", "xyz", "0" * 17]),
    judge=st.sampled_from(["", "http://j.example/judge", "a\nb", "j" * 300]),
    lease=st.sampled_from(["", "l1", "l\x00", "x" * 65]),
)
def test_a_rounds_result_is_judged_as_the_single_event_it_stands_for(
    proto: str, latency: int, exit_ip: str, source: str, judge: str, lease: str
) -> None:
    """A result of a ProxiesChecked is refused exactly where the ProxyWorked it stands
    for would be: the round's envelope by problem(), its fields by result_problems()."""
    e = worked(
        ip="8.8.8.8",
        proto=proto,
        latency_ms=latency,
        exit_ip=exit_ip,
        source=source,
        judge=judge,
        lease=lease,
    )
    key = source if len(source) == 16 and not source.strip("0123456789abcdef") else "s001"
    batch = ProxiesChecked(
        id=e.id,
        agent=e.agent,
        at=e.at,
        key=key,
        source=source,
        lease=lease,
        results=[
            CheckResult(
                ip=e.ip, port=e.port, proto=proto, latency_ms=latency, exit_ip=exit_ip, judge=judge
            )
        ],
    )
    (single,) = expand(batch)
    assert single == e
    round_ok = problem(batch, lab=False) == ("", "") and not result_problems(batch, lab=False)
    assert round_ok == (problem(e, lab=False) == ("", ""))
