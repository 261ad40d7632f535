"""The re-send window in log time (reducers/marks.py ``Recent``): an agent's ids folded
within the window are remembered, an id dated before the window's start is stale, and
nothing is decided by how many ids came in between."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

import events as ev
from events.ids import uuid7
from projections import Folder, digest
from reducers import State
from reducers.marks import RECENT_CAP, Recent, expire, recent_cap, recent_refusal, remember
from reducers.proxies import SWEEP_MS
from tests.helpers import message, stored_and_restored, worked
from tests.test_resend import MIN, T0, _id, _on_own, _start

WINDOW_S = 3_900

Msg = tuple[int, int, bytes, bytes]


def _preamble(window_s: int = WINDOW_S, **more: object) -> list[Msg]:
    """Settings as ``ppf up`` publishes them (trust and guarded on); ``op`` is the
    operator's agent (no quota), ``w1`` a worker of someone else's."""
    settings = ev.Settings(
        agent_subjects=True, trust=True, trusted_agents=("op",), guarded=True,
        resend_window=512, resend_window_s=window_s, batches=True, **more,  # type: ignore[arg-type]
    )  # fmt: skip
    out = _start(settings, ("op", "w1"))
    return [message(seq, T0 - 1, e) for seq, e in enumerate(out, start=1)]


def _flood(n: int, seed: int = 1) -> list[tuple[int, ev.Event]]:
    """``n`` distinct confirmations from the operator's agent, 20 a millisecond from two
    processes whose clocks are 80 ms apart, ids unordered within each millisecond, as
    (log ms, event) in arrival order."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    out: list[tuple[int, ev.Event]] = []
    for i in range(n):
        at = T0 + i // 20
        clock = at - 80 if i % 2 else at  # the second process is 80 ms behind
        rand = rng.getrandbits(80).to_bytes(10, "big")
        ip = f"{20 + i // 65_536}.{(i // 256) % 256}.{i % 256}.7"
        out.append((at, worked(agent="op", ip=ip, id=uuid7(clock, rand), latency_ms=50)))
    out.sort(key=lambda p: (p[0], rng.random()))
    return out


def _fold(msgs: list[Msg]) -> tuple[State, list[tuple[int, str]]]:
    state = State()
    dlq: list[tuple[int, str]] = []
    Folder(state, lambda seq, subject, payload, exc: dlq.append((seq, exc.reason))).apply(msgs)
    return state, dlq


def _tail(msgs: list[Msg], at: int) -> list[Msg]:
    end = ev.Heartbeat(id=_id(at, 1), agent="admin", at=0)
    return [*msgs, message(len(msgs) + 1, at, end)]


def test_an_operators_flood_folds_whole_and_its_resend_30_minutes_on_does_not() -> None:
    """The bar: 30,000 distinct observations of the operator's agent, 20 a millisecond
    from two processes 80 ms apart, unordered within each millisecond: every one folded;
    the same sent again 30 minutes later in log time changes nothing (each re-send
    counted), and nothing goes to the DLQ."""
    sent = _flood(30_000)
    msgs = _preamble()
    for at, e in sent:
        msgs.append(_on_own(len(msgs) + 1, at, e))
    control, dlq = _fold(_tail(msgs, T0 + 31 * MIN))
    assert not dlq
    assert len(control.proxies) == 30_000
    assert control.agents["op"].counts["ProxyWorked"] == 30_000
    for _, e in sent:
        msgs.append(_on_own(len(msgs) + 1, T0 + 30 * MIN, e))
    again, dlq = _fold(_tail(msgs, T0 + 31 * MIN))
    assert not dlq
    assert again.resent["op"] == 30_000
    assert digest(again) == digest(control)


def test_an_id_dated_ahead_makes_no_honest_id_stale() -> None:
    """An id dated 300 s ahead of its log time (the skew ``guarded`` allows), then the
    agent's honest ids, each a little older than the one before: all folded."""
    msgs = _preamble()
    ahead = worked(agent="w1", ip="9.9.9.9", id=_id(T0 + 300_000, 1), latency_ms=50)
    msgs.append(_on_own(len(msgs) + 1, T0, ahead))
    for n in range(200):
        e = worked(agent="w1", ip=f"9.9.{n}.1", id=_id(T0 - n * 10, 2), latency_ms=50)
        msgs.append(_on_own(len(msgs) + 1, T0 + n, e))
    state, dlq = _fold(msgs)
    assert not dlq
    assert len(state.proxies) == 201


def test_an_id_older_than_the_window_is_stale_and_one_past_its_time_is_forgotten() -> None:
    """Log time decides: an id dated more than W before its message is stale (in the DLQ,
    with its reason); an id folded, then met again after W and a sweep, is stale too
    (its window forgot it, its date tells why); the window holds nothing then."""
    msgs = _preamble()
    old = worked(agent="w1", ip="9.9.9.9", id=_id(T0 - WINDOW_S * 1000 - 1, 1), latency_ms=50)
    msgs.append(_on_own(len(msgs) + 1, T0, old))
    kept = worked(agent="w1", ip="9.9.9.8", id=_id(T0, 2), latency_ms=50)
    msgs.append(_on_own(len(msgs) + 1, T0, kept))
    late = T0 + WINDOW_S * 1000 + SWEEP_MS + 1
    msgs.append(_on_own(len(msgs) + 1, late, kept))
    state, dlq = _fold(msgs)
    assert [r for _, r in dlq] == ["stale", "stale"]
    assert list(state.proxies) == [("9.9.9.8", 8080)]
    assert not state.recent


def test_the_window_is_bounded_by_the_quota_and_refuses_past_it() -> None:
    """An agent's window holds what its quota lets it send in W and a sweep; one without
    a quota at most RECENT_CAP; past the cap an id is refused (``full``), never
    forgetting one it holds."""
    assert recent_cap(0, WINDOW_S, SWEEP_MS) == RECENT_CAP
    assert recent_cap(3_000, WINDOW_S, SWEEP_MS) == 3_000 * 75
    recent: dict[str, Recent] = {}
    for n in range(4):
        assert remember(recent, "w", _id(T0, n), T0, WINDOW_S)
    assert recent_refusal(recent, "w", _id(T0, 9), T0, WINDOW_S, 4)[0] == "full"
    assert recent_refusal(recent, "w", _id(T0, 1), T0, WINDOW_S, 4) == ("", "")
    assert not remember(recent, "w", _id(T0, 1), T0, WINDOW_S)
    assert recent_refusal(recent, "w", "not-an-id", T0, WINDOW_S, 4)[0] == "invalid"
    expire(recent, T0 + WINDOW_S * 1000 + 1)
    assert not recent


def test_the_window_survives_a_checkpoint_and_old_logs_keep_their_digest(
    tmp_path: Path,
) -> None:
    """The windows are stored with the rows and restored to the same digest; a log
    without the setting has no windows, and its meta digest leaves them out."""
    msgs = _preamble()
    for at, e in _flood(2_000):
        msgs.append(_on_own(len(msgs) + 1, at, e))
    state, _ = _fold(msgs)
    restored = stored_and_restored(state, tmp_path / "p.duckdb")
    assert restored.recent == state.recent and len(state.recent["op"].until) == 2_000
    assert digest(restored) == digest(state)
    first = ev.decode(msgs[0][3])
    assert isinstance(first, ev.Configured)
    off = msgspec.structs.replace(first.settings, resend_window_s=0)
    msgs[0] = message(1, msgs[0][1], ev.Configured(id=first.id, agent="admin", at=0, settings=off))
    plain, _ = _fold(msgs)
    assert not plain.recent and plain.marks


async def test_the_outbox_sets_aside_what_the_window_may_have_forgotten(tmp_path: Path) -> None:
    """An event older than the outbox's replay (by its id's date) is never sent again:
    it goes to ``outbox.rejected`` as expired; a fresh one stays for the next send."""
    from agents.gateway_client import GatewayClient
    from agents.outbox import OUTBOX_REPLAY_S
    from events.mint import fresh_id, now_ms
    from ops.nats.server import free_port

    outbox = tmp_path / "outbox.jsonl"
    old = worked(agent="w1", ip="9.9.9.9", id=_id(now_ms() - OUTBOX_REPLAY_S * 1000 - 5_000, 1))
    fresh = worked(agent="w1", ip="9.9.9.8", id=fresh_id())
    outbox.write_bytes(ev.encode(old) + b"\n" + ev.encode(fresh) + b"\n")
    async with GatewayClient(f"http://127.0.0.1:{free_port()}", "t", "w1", outbox) as client:
        assert not await client.flush()  # nobody listens: what is left stays
    assert outbox.read_bytes().splitlines() == [ev.encode(fresh)]
    (line,) = outbox.with_suffix(".rejected").read_bytes().splitlines()
    assert line.startswith(b"expired") and line.endswith(ev.encode(old))
