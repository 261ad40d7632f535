"""reducers/_fastfold.c folds a known proxy confirmed again and a location exactly as
fold() does, and leaves everything else to fold(): generated logs, folded with and
without it, build the same projections, derived state and dirty sets included."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    AgentEnrolled,
    Configured,
    Event,
    Heartbeat,
    Leased,
    Located,
    ProxyFailed,
    ProxyWorked,
    Released,
    Settings,
    SourceAdded,
    url_id,
)
from events.codec import decode_plain, encode
from ops.bench.synthetic import route
from projections import digest
from projections.folder import Folder
from reducers import State, fold
from reducers.admission import admit

_fold_module = sys.modules["reducers.fold"]
native = pytest.mark.skipif(
    not _fold_module.native_fastfold(), reason="reducers/_fastfold.c was not built (needs gcc)"
)

T0 = 1_800_000_000_000
AGENTS = ["w0", "w1", "w2", "c0", "c1"]  # c0 is the operator's checker: a judge under trust
URLS = [f"https://lists.example/{i}.txt" for i in range(3)]


def _log(seed: int, n: int) -> Iterator[tuple[Event, int]]:
    """``n`` events over a small world (6 proxies, 5 agents, 3 sources), each with the
    log time it is folded at: every branch of a confirmation is met many times."""
    rng = random.Random(seed)
    ids = 0

    def eid(back: bool = False) -> str:
        nonlocal ids
        if back and ids > 5 and rng.random() < 0.5:
            return f"00000000-0000-7000-8000-{rng.randrange(1, ids):012d}"  # a re-send
        ids += 1
        prefix = "dep:" if rng.random() < 0.03 else ""  # derived from a deposit
        return f"{prefix}00000000-0000-7000-8000-{ids:012d}"

    ts = T0
    for name in AGENTS:
        role = "checker" if name[0] == "c" else "worker"
        yield (
            AgentEnrolled(
                id=eid(), agent="admin", at=0, name=name, role=role, token_sha256="0" * 64
            ),
            ts,
        )
    for url in URLS:
        yield SourceAdded(id=eid(), agent="admin", at=0, url=url, url_id=url_id(url)), ts
    leases: list[Leased] = []
    for _ in range(n):
        ts += rng.choice([0, 1, 500, 20_000, 40_000, 400_000, 2 * 3_600_000])
        roll = rng.random()
        agent = rng.choice([*AGENTS, "stranger"])  # a stranger was never enrolled
        if roll < 0.04:
            yield (
                Configured(
                    id=eid(),
                    agent="admin",
                    at=0,
                    settings=Settings(
                        lab=rng.random() < 0.2,  # private addresses admitted
                        agent_subjects=rng.random() < 0.7,
                        trust=rng.random() < 0.7,
                        trusted_agents=("c0", "w0") if rng.random() < 0.8 else ("c0",),
                        provenance_cap=rng.choice([1, 2, 16]),
                        latency_samples=rng.choice([0, 1, 16]),
                        spot_window_s=rng.choice([0, 60, 1_800]),
                        ema_alpha=rng.choice([0.3, 0.5]),
                        # a quota within reach: admission's "ask the quota" (answer 2)
                        quota_events_per_min=rng.choice([3_000, 3_000, 1]),
                        quota_proxies_per_hour=rng.choice([20_000, 20_000, 1]),
                    ),
                ),
                ts,
            )
        elif roll < 0.12:
            target = url_id(rng.choice(URLS))
            lease_id = eid()
            lease = Leased(
                id=lease_id,
                agent=agent,
                at=0,
                lease=lease_id,
                kind="source",
                target=target,
                ttl_s=rng.choice([1, 60, 600]),
            )
            leases.append(lease)
            yield lease, ts
        elif roll < 0.16 and leases:
            lease = rng.choice(leases)
            yield (
                Released(
                    id=eid(),
                    agent=lease.agent,
                    at=0,
                    lease=lease.lease,
                    target=lease.target,
                    outcome=rng.choice(["done", "failed"]),
                ),
                ts,
            )
        elif roll < 0.19 and leases:
            yield Heartbeat(id=eid(), agent=agent, at=0, leases=[rng.choice(leases).lease]), ts
        elif roll < 0.25:
            p = rng.randrange(7)  # the seventh address never has a row
            yield (
                Located(
                    id=eid(),
                    agent="fold",
                    at=0,
                    ip=f"8.8.{p // 3}.{p % 3 + 1}",
                    country=rng.choice(["DE", "FR"]),
                    asn=rng.choice([0, 3320]),
                    # Names as the data has them: UTF-8, quotes (msgspec's to decode)
                    as_org=rng.choice(["", "DTAG", "DTAG", "Telefónica", 'A "B" \\ C']),
                    geo=rng.choice(["v1", "v2"]),
                ),
                ts,
            )
        elif roll < 0.36:
            p = rng.randrange(6)
            yield (
                ProxyFailed(
                    id=eid(True),
                    agent=rng.choice(["c0", "c0", "c1", "w0", "w1", "w2"]),  # five vantages
                    at=0,
                    ip=f"8.8.{p // 3}.{p % 3 + 1}",
                    port=8080,
                    proto="http",
                    error="timeout",
                ),
                ts,
            )
        else:
            p = rng.randrange(6)
            ip = f"8.8.{p // 3}.{p % 3 + 1}"
            if rng.random() < 0.1:  # not public (a lab admits some), or IPv6 (only fold() reads it)
                ip = rng.choice(
                    [
                        "10.1.2.3",
                        "127.0.0.1",
                        "192.0.2.7",
                        "100.64.1.1",
                        "2606:4700::1111",
                        "2001:db8::1",
                    ]
                )
            yield (
                ProxyWorked(
                    id=eid(True),
                    agent=agent,
                    at=0,
                    ip=ip,
                    port=rng.choice([8080, 8080, 3128]),  # two rows on one address
                    proto=rng.choice(["http", "http", "http", "socks5"]),
                    latency_ms=rng.choice([-5, 0, 120, 70_000]),
                    exit_ip=rng.choice(["", ip, "9.9.9.9"]),
                    anonymity=rng.choice(["", "elite", "anonymous"]),  # type: ignore[arg-type]
                    mitm=rng.random() < 0.1,
                    https=rng.choice(["", "yes", "no"]),  # type: ignore[arg-type]
                    source=rng.choice(["", url_id(rng.choice(URLS)), "0123456789abcdef"]),
                    lease=rng.choice([leases[-1].lease, "nobody-holds-this"])
                    if leases and rng.random() < 0.7
                    else "",
                ),
                ts,
            )


def _everything(state: State) -> tuple[Any, ...]:
    """All a fold leaves behind: the digest (rows and meta) and the derived state."""
    return (
        digest(state),
        state.last_seq,
        state.sweep_bucket,
        {b: dict(c) for b, c in state.composition.buckets.items()},
        {b: dict(c) for b, c in state.failing.buckets.items()},
        dict(state.by_ip),
        sorted(state.unlocated),
        sorted(state.dirty_proxies),
        sorted(state.dirty_sources),
        sorted(state.dirty_leases),
        dict(state.high_water),
        {
            name: (dict(a.counts), a.late, a.rejected, a.last_seen)
            for name, a in state.agents.items()
        },
        list(state.trust_base),
    )


def _folded(events: list[tuple[Event, int]], with_c: bool) -> tuple[tuple[Any, ...], list[bool]]:
    state = State()
    answers: list[Any] = []
    saved = _fold_module.FAST
    _fold_module.FAST = saved if with_c else {}
    try:
        for seq, (event, ts) in enumerate(events, 1):
            answers.append(fold(state, event, seq, ts))
            if seq % 7 == 0:  # as a checkpoint does: what each one would write
                answers.append(_everything(state))
                state.clear_dirty()
    finally:
        _fold_module.FAST = saved
    return _everything(state), answers


@native
@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400))
def test_the_c_fold_equals_folds(seed: int, n: int) -> None:
    """Any log folded with reducers/_fastfold.c builds what fold() alone builds, answer
    for answer (the seed reproduces a failure)."""
    events = list(_log(seed, n))
    assert _folded(events, with_c=True) == _folded(events, with_c=False)


@native
def test_the_c_fold_takes_most_of_its_events_and_leaves_the_rest() -> None:
    """The generated logs reach both sides: confirmations and locations the C folds and
    ones it leaves to fold() (so the equality above compares the C's work, not fold()'s
    twice)."""
    fast = _fold_module.FAST
    assert fast
    taken = {ProxyWorked: 0, Located: 0}
    left = {ProxyWorked: 0, Located: 0}
    for seed in range(20):
        state = State()
        for seq, (event, ts) in enumerate(_log(seed, 300), 1):
            kind = type(event)
            if kind in taken and fast[kind](state, event, seq, ts):
                taken[kind] += 1
            else:
                fold(state, event, seq, ts)
                if kind in left:
                    left[kind] += 1
    assert taken[ProxyWorked] > 1000 and left[ProxyWorked] > 100, (taken, left)
    assert taken[Located] > 200 and left[Located] > 0, (taken, left)  # left: a sweep due


@native
def test_the_c_fold_changes_nothing_when_it_declines() -> None:
    """Where the C answers False (here: a private address, a sequence already applied, a
    location already applied), the state is untouched, so fold() applies the event once."""
    state = State()
    events = list(_log(7, 50))
    for seq, (event, ts) in enumerate(events, 1):
        fold(state, event, seq, ts)
    before = _everything(state)
    private = ProxyWorked(
        id="ffffffff-0000-7000-8000-000000000000",
        agent="w1",
        at=0,
        ip="10.9.9.9",
        port=1080,
        proto="http",
        latency_ms=10,
    )
    fast = _fold_module.FAST
    assert fast
    assert fast[ProxyWorked](state, private, state.last_seq + 1, events[-1][1]) is False
    known = next(e for e, _ in reversed(events) if isinstance(e, ProxyWorked))
    assert fast[ProxyWorked](state, known, state.last_seq, events[-1][1]) is False
    where = Located(id="ffffffff-0000-7000-8000-000000000001", agent="fold", at=0,
                    ip=known.ip, country="SE", geo="v3")  # fmt: skip
    assert fast[Located](state, where, state.last_seq, events[-1][1]) is False
    assert _everything(state) == before


@native
def test_the_baseline_halves_alike() -> None:
    """A failed check by the operator's checker of a proxy an operator's worker had just
    confirmed counts in the baseline, halved at 10,000 checks, the same in C."""
    out = []
    for with_c in (True, False):
        saved = _fold_module.FAST
        _fold_module.FAST = saved if with_c else {}
        try:
            state = State()
            log: list[Event] = [
                AgentEnrolled(id=f"00000000-0000-7000-8000-00000000000{i}", agent="admin",
                              at=0, name=n, role=r, token_sha256="0" * 64)
                for i, (n, r) in enumerate((("w0", "worker"), ("c0", "checker")))
            ]  # fmt: skip
            log.append(
                Configured(id="00000000-0000-7000-8000-000000000010", agent="admin", at=0,
                           settings=Settings(trust=True, trusted_agents=("c0", "w0")))
            )  # fmt: skip
            log.append(ProxyWorked(id="00000000-0000-7000-8000-000000000011", agent="w0", at=0,
                                   ip="8.8.8.8", port=80, proto="http", latency_ms=50))  # fmt: skip
            for seq, event in enumerate(log, 1):
                fold(state, event, seq, T0 + seq)
            state.trust_base = [9_999, 7]
            failed = ProxyFailed(id="00000000-0000-7000-8000-000000000012", agent="c0", at=0,
                                 ip="8.8.8.8", port=80, proto="http")  # fmt: skip
            assert fold(state, failed, len(log) + 1, T0 + 60_000)
            out.append((list(state.trust_base), _everything(state)))
        finally:
            _fold_module.FAST = saved
    assert out[0] == out[1]
    assert out[0][0] == [5_000, 4]


@native
def test_failed_by_keeps_four_vantages_alike() -> None:
    """Failures from five agents in a row leave the first four in failed_by, in C too."""
    names = ["c0", "c1", "w0", "w1", "w2"]
    log: list[tuple[Event, int]] = [
        (AgentEnrolled(id=f"00000000-0000-7000-8000-00000000010{i}", agent="admin", at=0,
                       name=n, role="checker", token_sha256="0" * 64), T0)
        for i, n in enumerate(names)
    ]  # fmt: skip
    log.append((ProxyWorked(id="00000000-0000-7000-8000-000000000200", agent="w0", at=0,
                            ip="8.8.8.8", port=80, proto="http", latency_ms=50), T0))  # fmt: skip
    log += [
        (ProxyFailed(id=f"00000000-0000-7000-8000-00000000030{i}", agent=n, at=0,
                     ip="8.8.8.8", port=80, proto="http"), T0 + i)
        for i, n in enumerate(names)
    ]  # fmt: skip
    with_c, without = _folded(log, with_c=True), _folded(log, with_c=False)
    assert with_c == without
    state = State()
    for seq, (event, ts) in enumerate(log, 1):
        fold(state, event, seq, ts)
    assert state.proxies[("8.8.8.8", 80)].failed_by == ("c0", "c1", "w0", "w1")


def _messages(seed: int, n: int) -> list[tuple[int, int, bytes, bytes]]:
    """The log of ``_log`` as the stream holds it, (seq, ts, subject, payload), on the
    subjects the fleet publishes to, with what a hostile or broken fleet adds: DLQ
    entries, payloads that are not JSON or not an event, events on another agent's
    subject and locations on another address's (forgeries admission refuses), locations
    in a form other than the encoder's (msgspec's to read), and redeliveries of earlier
    sequences."""
    rng = random.Random(seed ^ 0x5EED)
    out: list[tuple[int, int, bytes, bytes]] = []
    for seq, (event, ts) in enumerate(_log(seed, n), 1):
        subject, _ = route(event)
        payload = encode(event)
        roll = rng.random()
        if roll < 0.02:
            subject = "ppf.dlq.invalid"
        elif roll < 0.04:
            payload = b'{"type": "ProxyWorked", "ip": '  # cut short
        elif roll < 0.06:
            payload = b'{"type": "NoSuchEvent", "id": "x"}'
        elif roll < 0.09 and isinstance(event, ProxyWorked | ProxyFailed):
            subject = subject.replace(f".{event.agent}.", ".w9.", 1)  # not the sender's
        elif roll < 0.12 and isinstance(event, Located):
            subject = "ppf.geo.8-8-9-9"  # another address's: a forgery admission refuses
        elif roll < 0.15 and isinstance(event, Located):
            payload = json.dumps(msgspec.to_builtins(event)).encode()  # spaced: msgspec reads it
        out.append((seq, ts, subject.encode(), payload))
        if out and rng.random() < 0.03:
            out.append(out[rng.randrange(len(out))])  # redelivered: applied already
    return out


def _applied(messages: list[tuple[int, int, bytes, bytes]], with_c: bool, cuts: list[int]) -> Any:
    """Fold ``messages`` through Folder.apply in batches ending at ``cuts``: what the
    state holds, Folder's counts, each batch's answer and every rejection."""
    refused: list[tuple[int, bytes, bytes, str]] = []
    folder = Folder(
        State(),
        on_reject=lambda seq, subject, payload, exc: refused.append(
            (seq, subject, payload, str(exc))
        ),
    )
    saved = _fold_module.FAST
    _fold_module.FAST = saved if with_c else {}
    answers: list[Any] = []
    try:
        start = 0
        for cut in [*cuts, len(messages)]:
            answers.append(folder.apply(messages[start:cut]))
            answers.append(_everything(folder.state))
            folder.state.clear_dirty()
            start = cut
    finally:
        _fold_module.FAST = saved
    counts = (folder.applied, folder.rejected, folder.resent, folder.last_ts)
    return _everything(folder.state), counts, answers, refused


@native
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 300),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
def test_folder_in_c_equals_folder_in_python(seed: int, n: int, cuts: list[int]) -> None:
    """Folder.apply's loop in C (reducers/_fastfold_parts/batch.c) folds any stream,
    hostile messages and redeliveries included, in batches cut anywhere, as its loop in
    Python does: the same state, counts, answers and rejections, each in its place."""
    messages = _messages(seed, n)
    cuts = sorted(c for c in cuts if c <= len(messages))
    assert _applied(messages, True, cuts) == _applied(messages, False, cuts)


@native
def test_folder_in_c_hands_back_what_python_must_take() -> None:
    """The generated streams reach every way out of the C loop (a DLQ subject, a payload
    that is no event, a forged subject, a redelivery), so the equality above compares
    the C's loop with Python's where they part, not only where the C runs alone."""
    for seed in range(10):
        messages = _messages(seed, 300)
        _, (applied, rejected, resent, _), _, refused = _applied(messages, True, [])
        reasons = {why.split(":")[0] for _, _, _, why in refused}
        assert {"undecodable", "unknown_type"} <= reasons, reasons
        assert any(s.startswith(b"ppf.dlq.") for _, _, s, _ in messages)
        assert len({m[0] for m in messages}) < len(messages)  # redeliveries in the stream
        assert applied > 100 and rejected > 10 and resent > 0, (applied, rejected, resent)
    forged = {
        why.split(":")[0]
        for seed in range(10)
        for *_, why in _applied(_messages(seed, 300), True, [])[3]
    }
    assert {"forbidden", "quota"} <= forged, forged  # a forged subject; over a quota


@native
def test_fold_batch_refuses_what_folder_never_passes() -> None:
    """The C loop's arguments are Folder's; anything else is an error, not a guess."""
    run = _fold_module.fast_batch()
    assert run is not None
    args = (_fold_module.fast_folds(), _fold_module.fold_rules, b"ppf.dlq.")
    state = State()
    with pytest.raises(ValueError, match="start"):
        run(state, [], -1, decode_plain, admit, *args)
    with pytest.raises(TypeError, match="messages: list"):
        run(state, (), 0, decode_plain, admit, *args)
    assert run(state, [], 0, decode_plain, admit, *args) == (0, 0, 0)
