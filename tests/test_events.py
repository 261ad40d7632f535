"""The event catalogue: codec round trips, subjects, ids, and bad input."""

from __future__ import annotations

import re

import msgspec
import pytest

import events as ev
from events.sites import SiteRule
from tests.helpers import eid, leased, worked

_SITE = ev.SiteResult(ip="45.68.1.2", port=80, site="google.com", through=2)
SAMPLES: list[ev.Event] = [
    ev.SourceAdded(
        id=eid(),
        agent="a",
        at=1,
        url="http://x.example/l.txt",
        url_id=ev.url_id("http://x.example/l.txt"),
        origin="seed",
    ),
    leased("abcdef0123456789"),
    ev.Heartbeat(id=eid(), agent="w1", at=1, leases=["l1", "l2"]),
    ev.Released(
        id=eid(), agent="w1", at=1, lease="l1", target="s001", outcome="failed", kind="recheck"
    ),
    ev.LeaseReset(id=eid(), agent="admin", at=1, target="s001", kind="recheck"),
    ev.Fetched(id=eid(), agent="w1", at=1, url_id="abcdef0123456789", ok=True, changed=True),
    ev.Extracted(
        id=eid(),
        agent="w1",
        at=1,
        url_id="abcdef0123456789",
        count=1,
        candidates=[("8.8.8.8", 80, "http", 0.9)],
    ),
    worked(),
    ev.ProxyFailed(id=eid(), agent="c1", at=1, ip="8.8.8.8", port=80, proto="http"),
    ev.ProxyReported(id=eid(), agent="shop", at=1, ip="8.8.8.8", port=80, outcome="failed"),
    ev.Deposited(id=eid(), agent="s1", at=1, key="plan-r1-0", sha256="0" * 64, bytes=3, cursor=9),
    ev.DepositFolded(id=eid(), agent="fold", at=1, key="plan-r1-0"),
    ev.DepositRejected(id=eid(), agent="fold", at=1, key="plan-r1-0", reason="digest"),
    ev.Discovered(id=eid(), agent="w1", at=1, parent="abcdef0123456789", urls=["http://y/"]),
    ev.SeedPlanned(id=eid(), agent="admin", at=1, plan="p1", input="k", ranges=[("r0", 0, 9)]),
    ev.ProxiesChecked(
        id=eid(),
        agent="c1",
        at=1,
        key="s042",
        lease="l1",
        results=[
            ev.CheckResult(ip="45.68.1.2", port=80, proto="http", latency_ms=5),
            ev.CheckResult(ip="45.68.1.3", port=81, proto="http", ok=False, error="timeout"),
        ],
    ),
    ev.SitesChecked(id=eid(), agent="c1", at=1, key="s042", psl="1.1", results=[_SITE]),
    ev.SiteRuled(id=eid(), agent="admin", at=1, rule=SiteRule(site="shop.example", min_bytes=9)),
    ev.AgentEnrolled(
        id=eid(), agent="admin", at=1, name="w1", role="worker", token_sha256="0" * 64
    ),
    ev.Configured(id=eid(), agent="admin", at=1, settings=ev.Settings(lab=True)),
    ev.Located(id=eid(), agent="fold", at=1, ip="45.68.1.1", country="BO", as_org="", geo="test-1"),
]


def test_samples_cover_every_event_type() -> None:
    """Every tag in the union has a sample below, so no type escapes the round trip."""
    assert {type(s) for s in SAMPLES} == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip_and_subject(event: ev.Event) -> None:
    """Each event decodes to itself and maps to a subject of clean tokens under ppf."""
    assert ev.decode(ev.encode(event)) == event
    subject = ev.subject_for(event)
    assert subject.startswith("ppf.")
    assert all(tok and not re.search(r"[*>\s]", tok) for tok in subject.split("."))


def test_subjects_follow_the_contract() -> None:
    """Subjects are exactly those of docs/architecture.md §2."""
    assert ev.subject_for(worked("203.0.113.7", 8080)) == "ppf.proxy.203-0-113-7_8080"
    assert ev.subject_for(leased("s042", kind="recheck")) == "ppf.lease.recheck.s042"
    assert ev.subject_for(SAMPLES[-2]) == "ppf.config"
    assert ev.subject_for(SAMPLES[-1]) == "ppf.geo.45-68-1-1"
    assert ev.subject_for(SAMPLES[0]).startswith("ppf.source.")
    rounds = [s for s in SAMPLES if isinstance(s, ev.ProxiesChecked)]
    assert ev.subject_for(rounds[0]) == "ppf.checked.s042"
    assert ev.agent_subject(rounds[0]) == "ppf.in.c1.checked.s042"


def test_url_id_is_16_hex_of_normalized_url() -> None:
    """Case of scheme and host, a default port and a fragment do not change the id."""
    a = ev.url_id("HTTP://Example.COM:80/list.txt#top")
    assert a == ev.url_id("http://example.com/list.txt")
    assert re.fullmatch(r"[0-9a-f]{16}", a)
    assert a != ev.url_id("http://example.com/other.txt")


def test_shard_is_stable_and_in_range() -> None:
    """A proxy's recheck shard is stable and one of s000-s255."""
    shards = {ev.shard_of(f"1.2.3.{i}", 80) for i in range(1000)}
    assert all(re.fullmatch(r"s\d{3}", s) and int(s[1:]) < 256 for s in shards)
    assert len(shards) > 200
    assert ev.shard_of("1.2.3.4", 80) == ev.shard_of("1.2.3.4", 80)


def test_bad_token_is_refused() -> None:
    """A subject token never holds '.', '*', '>' or white space."""
    with pytest.raises(ev.SubjectError):
        ev.subject_for(leased("a.b"))
    with pytest.raises(ev.SubjectError):
        ev.subject_for(ev.Heartbeat(id=eid(), agent="w 1", at=0))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "undecodable"),
        (b'{"type": "NoSuchEvent", "id": "x", "agent": "a", "at": 1}', "unknown_type"),
        (b'{"type": "ProxyWorked", "id": "x", "agent": "a", "at": 1}', "invalid"),
        (
            b'{"type": "ProxyWorked", "id": "x", "agent": "a", "at": 1, "ip": "1.2.3.4", '
            b'"port": "eighty", "proto": "http", "latency_ms": 1}',
            "invalid",
        ),
        (b"[]", "invalid"),
    ],
)
def test_bad_payloads_name_their_reason(payload: bytes, reason: str) -> None:
    """Undecodable or invalid payloads raise DecodeError with a stable reason."""
    with pytest.raises(ev.DecodeError) as info:
        ev.decode(payload)
    assert info.value.reason == reason
    assert ev.dlq_subject(info.value.reason) == f"ppf.dlq.{reason}"


def test_unknown_fields_are_ignored() -> None:
    """Producers newer than us may add fields at the end (schema evolution)."""
    raw = msgspec.json.decode(ev.encode(worked()))
    raw["future_field"] = {"nested": [1, 2]}
    decoded = ev.decode(msgspec.json.encode(raw))
    assert isinstance(decoded, ev.ProxyWorked)
    assert decoded.ip == "8.8.8.8"


def test_uuid7_layout_and_order() -> None:
    """Version 7, RFC variant, and ids sort by their millisecond."""
    a = ev.uuid7(1_700_000_000_000, bytes(10))
    b = ev.uuid7(1_700_000_000_001, bytes(10))
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", a)
    assert a < b
    with pytest.raises(ValueError):
        ev.uuid7(1, b"short")


def test_a_token_never_starts_with_a_dash() -> None:
    """`ppf agent --token -x...` would read the token as an option: a 64th of URL-safe
    tokens began with one."""
    from events.mint import enrollment

    assert not [t for t, _ in (enrollment("w1", "worker") for _ in range(2_000)) if t[0] == "-"]
