"""reducers/_admit.c against the Python it stands for.

The fold asks admission of every event. Its everyday answer comes from C; where the C
says anything but 1 ("admissible, no quota near") the Python decides. So the contract
is: the C never admits what the Python would not, never skips a quota the Python would
ask, and the fold's answer (``refusal``) is the same with or without the C. Generated
events, each a well-formed one with one thing (or nothing) made wrong, over a state with
enrolled, revoked and unknown agents and quotas at their edges.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from events import (
    OBSERVATIONS,
    Extracted,
    Fetched,
    Heartbeat,
    Leased,
    Located,
    ProxyFailed,
    ProxyWorked,
    Released,
)
from events.catalogue import Settings
from reducers import State, admission, trust
from reducers.state import AgentRow

NO_NATIVE = (
    "reducers/_admit.c was not built: install a C compiler (apt-get install gcc) and reinstall"
)
TS = 1_790_000_000_000
MINUTE, HOUR = TS // 60_000, TS // 3_600_000


def _state() -> State:
    state = State()
    state.settings = Settings(
        agent_subjects=True,
        trust=True,
        trusted_agents=["op"],
        quota_events_per_min=5,
        quota_proxies_per_hour=3,
    )
    rows = [
        AgentRow(name="w1", role="worker", token_sha256="a" * 64),
        # at the per-minute quota, and at the new-proxy quota
        AgentRow(
            name="w2",
            role="worker",
            token_sha256="b" * 64,
            quota_minute=MINUTE,
            quota_events=5,
        ),
        AgentRow(
            name="w3",
            role="worker",
            token_sha256="c" * 64,
            quota_hour=HOUR,
            quota_proxies=3,
        ),
        AgentRow(name="c1", role="checker", token_sha256="d" * 64),
        AgentRow(name="op", role="checker", token_sha256="e" * 64, quota_events=99),
        AgentRow(name="gone", role="worker", token_sha256="", enrolled_at=1),  # revoked
    ]
    for row in rows:
        state.agents[row.name] = row
    trust.reindex(state)
    return state


AGENTS = ["w1", "w2", "w3", "c1", "op", "gone", "nobody", "wé"]
IPS = [
    "1.2.3.4",
    "203.0.113.9",
    "8.8.8.8",
    "01.2.3.4",
    "1.2.3",
    "::1",
    "2001:db8::1",
    "\uff11.2.3.4",
]
TEXT = [
    "",
    "ok",
    "01a0c450-9370-7000-8000-000000002770",
    "x" * 64,
    "x" * 65,
    "x" * 257,
    "x" * 501,
    "tab\there",
    "\u202eevil",
    "é",
    "judge-a",
]
HEX = ["", "0123456789abcdef", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdeg"]
PROTOS = ["http", "https", "socks4", "socks5", "ftp", "", "HTTP"]
INTS = [0, 1, 80, 999, 1000, 65535, 65536, -1, 600_000, 600_001, 1 << 30, (1 << 30) + 1]


FIELDS = [
    "id", "agent", "ip", "port", "proto", "latency_ms", "exit_ip", "source", "judge",
    "lease", "error", "target", "url_id", "http_status", "bytes", "fetch_ms",
    "content_hash", "count", "extractor", "candidates", "as_org",
]  # fmt: skip


def _event(rng: random.Random) -> Any:
    """A sound event with, two times in three, one field drawn from every value (bad
    ones among them)."""
    wrong = rng.choice(FIELDS) if rng.random() < 0.66 else ""

    def v(field: str, good: list[Any], every: list[Any]) -> Any:
        return rng.choice(every if field == wrong else good)

    ids = ["01a0c450-9370-7000-8000-000000002770", "x" * 64]
    base = {"id": v("id", ids, TEXT), "agent": v("agent", AGENTS[:5], AGENTS), "at": 1}
    ip = v("ip", IPS[:3], IPS)
    hexes, names = HEX[:2], TEXT[:4]
    kinds = ["worked", "failed", "leased", "released", "fetched", "extracted", "beat", "located"]
    kind = rng.choice(kinds)
    if kind == "worked":
        return ProxyWorked(
            **base,
            ip=ip,
            port=v("port", [80, 8080, 65535], INTS),
            proto=v("proto", PROTOS[:4], PROTOS),
            latency_ms=v("latency_ms", [0, 1, 600_000], INTS),
            exit_ip=v("exit_ip", ["", "5.6.7.8", ip], ["", "5.6.7.8", *IPS]),
            source=v("source", hexes, HEX),
            judge=v("judge", names, TEXT),
            lease=v("lease", names, TEXT),
        )
    if kind == "failed":
        return ProxyFailed(
            **base,
            ip=ip,
            port=v("port", [80, 8080], INTS),
            proto=v("proto", PROTOS[:4], PROTOS),
            error=v("error", names, TEXT),
            lease=v("lease", names, TEXT),
        )
    if kind in ("leased", "released"):
        cls = Leased if kind == "leased" else Released
        extra = {"ttl_s": 300} if cls is Leased else {"outcome": "ok"}
        return cls(
            **base,
            lease=v("lease", names[1:], TEXT),
            kind=rng.choice(["source", "proxy"]),
            target=v("target", hexes[1:], HEX[1:]),
            **extra,
        )
    if kind == "fetched":
        return Fetched(
            **base,
            url_id=v("url_id", hexes[1:], HEX),
            ok=True,
            http_status=v("http_status", [0, 200, 999], INTS),
            bytes=v("bytes", [0, 1000, 1 << 30], INTS),
            fetch_ms=v("fetch_ms", [0, 600_000], INTS),
            error=v("error", names, TEXT),
            content_hash=v("content_hash", names, TEXT),
            lease=v("lease", names, TEXT),
        )
    if kind == "extracted":
        good = [[], [("1.2.3.4", 80, "http", 0.5), ("8.8.8.8", 3128, "", 1.0)]]
        every = [
            [(rng.choice(IPS), rng.choice(INTS), rng.choice(PROTOS), c)]
            for c in (0.0, 0.5, 1.0, 1.5, -0.1)
        ]
        return Extracted(
            **base,
            url_id=v("url_id", hexes[1:], HEX),
            count=v("count", [0, 10], INTS),
            candidates=v("candidates", good, every + good),
            extractor=v("extractor", names, TEXT),
            content_hash=v("content_hash", names, TEXT),
            lease=v("lease", names, TEXT),
        )
    if kind == "located":
        return Located(**base, ip=ip, country="NL", as_org=v("as_org", names, TEXT), geo="1")
    return Heartbeat(**base)


def _subject(rng: random.Random, event: Any) -> bytes:
    """Usually the subject its fields give (on its agent's or the service's), else one
    thing off."""
    tail = admission.SUBJECT_TAILS[type(event)](event)
    publisher = rng.choice([event.agent, event.agent, event.agent, "w1", "c1"])
    subject = rng.choice(
        [f"ppf.in.{publisher}.{tail}", f"ppf.{tail}", f"ppf.in.{publisher}.{tail}"]
    )
    roll = rng.random()
    if roll < 0.05:
        subject = subject[:-1]
    elif roll < 0.1:
        subject += "0"
    elif roll < 0.12:
        subject = "ppf.in." + event.agent
    return subject.encode()


def _ascii_ipv4(event: Any) -> bool:
    """What the C decides: text all ASCII, addresses dotted quads or empty."""
    values = [v for v in (getattr(event, f, "") for f in event.__struct_fields__)]
    texts = [v for v in values if isinstance(v, str)]
    texts += [c[0] for c in getattr(event, "candidates", [])]
    return (
        all(t.isascii() for t in texts)
        and ":" not in getattr(event, "exit_ip", "")
        and not any(":" in c[0] for c in getattr(event, "candidates", []))
    )


@pytest.mark.skipif(not admission.native_admission(), reason=NO_NATIVE)
def test_the_c_answers_as_the_python_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 generated events: the C admits (1 or 2) exactly what the Python admits
    where it decides, never where the Python would not, answers 1 only where no quota
    can refuse, and ``refusal`` gives the same answer with and without it."""
    rng = random.Random(7)
    state = _state()
    answers = {0: 0, 1: 0, 2: 0}
    refused = 0
    for _ in range(20_000):
        event = _event(rng)
        subject = _subject(rng, event)
        kind = type(event)
        python = admission._plainly_admitted(
            state, subject, event, kind, admission.SUBJECT_TAILS[kind]
        )
        c = admission.admit(subject, event, state, TS)
        answers[c] += 1
        if not python:
            assert c == 0, (subject, event)
        elif _ascii_ipv4(event):
            assert c in (1, 2), (subject, event)
        if c == 1 and kind in OBSERVATIONS and event.agent not in state.operators:
            assert trust.over_quota(state, event, TS) == "", (subject, event)
        with_c = admission.refusal(state, subject, event, TS)
        with monkeypatch.context() as m:
            m.setattr(admission, "admit", admission._undecided)
            assert admission.refusal(state, subject, event, TS) == with_c, (subject, event)
        refused += bool(with_c[0])
    # The generator reaches every answer, and refusals, not only one path.
    assert min(answers.values()) > 500, answers
    assert 2_000 < refused < 18_000, refused


@pytest.mark.skipif(not admission.native_admission(), reason=NO_NATIVE)
def test_the_c_takes_events_as_they_come_before_agent_subjects() -> None:
    """Before the Configured that switches agent subjects on, everything is admissible
    (older logs replay as they did): the C answers 1 whatever the subject."""
    state = State()
    event = ProxyWorked(id="x", agent="nobody", at=1, ip="::1", port=-1, proto="?", latency_ms=-5)
    assert admission.admit(b"nonsense", event, state, TS) == 1
    assert admission.refusal(state, b"nonsense", event, TS) == ("", "")
