"""A check round as one message (events/batches.py): ``ProxiesChecked`` folds as the
single events it stands for, result by result, and a bad result costs only itself."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

import events as ev
from events.batches import MAX_RESULTS, MAX_RESULTS_BYTES, expand, group
from events.ids import uuid7
from events.validate import result_problems
from projections import Folder
from projections.core.digest import digests
from reducers import State
from reducers.fold import PIECE
from reducers.kept import Kept, declared
from tests.helpers import message, worked

T0 = 1_800_000_000_000


def _id(ms: int, n: int) -> str:
    return uuid7(ms, n.to_bytes(10, "big"))


def _round(seed: int, n: int) -> list[ev.Event]:
    """A checker's and a worker's rounds mixed: worked and failed results under three
    leases, with a Fetched between them."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    out: list[ev.Event] = []
    for i in range(n):
        lease = f"lease-{rng.randrange(3)}"
        ip = f"{30 + i // 65_536}.{(i // 256) % 256}.{i % 256}.9"  # one result each
        if rng.random() < 0.3:
            out.append(
                ev.ProxyFailed(
                    id=_id(T0, i), agent="c1", at=0, ip=ip, port=3128, proto="http",
                    error="timeout", lease=lease,
                )
            )  # fmt: skip
        else:
            out.append(
                worked(
                    agent="c1", ip=ip, id=_id(T0, i), lease=lease, latency_ms=rng.randrange(900),
                    anonymity=rng.choice(["", "elite", "transparent"]),
                    https=rng.choice(["", "yes"]),
                    exit_ip=rng.choice(["", ip, "1.1.1.1"]),
                )
            )  # fmt: skip
        if i == n // 2:
            out.append(
                ev.Fetched(id=_id(T0, 10_000), agent="c1", at=0, url_id="0123456789abcdef", ok=True)
            )
    return out


def _singles(events: list[ev.Event]) -> list[ev.Event]:
    """What a log of batches stands for, one event a result."""
    out: list[ev.Event] = []
    for e in events:
        out.extend(expand(e) if isinstance(e, ev.ProxiesChecked) else [e])
    return out


def test_a_round_grouped_stands_for_its_results_in_their_order() -> None:
    """group() keeps every result once, per lease and source, other events in place,
    and expand() gives back the single events (under their round's id)."""
    for seed in range(5):
        events = _round(seed, 400)
        grouped = group(events)
        assert len(grouped) < len(events) / 50
        back = _singles(grouped)
        strip = [msgspec.structs.replace(e, id="") for e in back]
        assert sorted(map(ev.encode, strip)) == sorted(
            ev.encode(msgspec.structs.replace(e, id="")) for e in events
        )
        for e in grouped:
            if isinstance(e, ev.ProxiesChecked):
                assert len({r.lease for r in expand(e)}) == 1
                assert e.key == ev.shard_of(e.results[0].ip, e.results[0].port)


def test_a_round_is_cut_by_count_and_by_bytes() -> None:
    """At most MAX_RESULTS results and MAX_RESULTS_BYTES of results a message, so it
    always fits the stream's message limit."""
    many = [worked(ip=f"40.0.{i // 256}.{i % 256}", id=_id(T0, i)) for i in range(1_234)]
    sizes = [len(e.results) for e in group(many) if isinstance(e, ev.ProxiesChecked)]
    assert sizes == [MAX_RESULTS, MAX_RESULTS, 234]
    long_judge = [
        worked(ip=f"40.1.{i // 256}.{i % 256}", id=_id(T0, i), judge="j" * 250) for i in range(500)
    ]
    for e in group(long_judge):
        assert len(ev.encode(e)) < ev.MAX_MESSAGE
        assert len(msgspec.json.encode(e.results)) <= MAX_RESULTS_BYTES + 1  # type: ignore[attr-defined]


def _log(events: list[ev.Event]) -> list[tuple[int, int, bytes, bytes]]:
    return [message(seq, T0 + seq // 7, e) for seq, e in enumerate(events, start=1)]


def test_a_log_of_rounds_folds_as_the_log_of_its_results() -> None:
    """The same observations as single events and as rounds, at one log time, build
    the same proxies and sources and count the same results by type."""
    for seed in range(4):
        singles = _round(seed, 600)
        rounds = group(singles)
        one, other = State(), State()
        Folder(one).apply(message(seq, T0, e) for seq, e in enumerate(singles, start=1))
        Folder(other).apply(message(seq, T0, e) for seq, e in enumerate(rounds, start=1))
        assert len(one.proxies) == len(other.proxies) > 300  # failures of unknown ones: no row
        assert digests(one)["proxies"] == digests(other)["proxies"]
        assert digests(one)["sources"] == digests(other)["sources"]
        assert one.agents["c1"].counts == other.agents["c1"].counts


def test_a_bad_result_costs_only_itself() -> None:
    """One result the rules refuse goes to the DLQ with its index and reason; the
    others of its round are folded."""
    results = [
        ev.CheckResult(ip="50.0.0.1", port=80, proto="http", latency_ms=10),
        ev.CheckResult(ip="50.0.0.2", port=80, proto="gopher", latency_ms=10),
        ev.CheckResult(ip="50.0.0.3", port=80, proto="socks5", latency_ms=700_000),
        ev.CheckResult(ip="50.0.0.4", port=80, proto="socks5", latency_ms=20),
    ]
    batch = ev.ProxiesChecked(
        id=_id(T0, 1), agent="c1", at=0, key="s001", results=results, lease="l"
    )
    assert [(j, f) for j, f, _ in result_problems(batch, lab=False)] == [
        (1, "results[1].proto"),
        (2, "results[2].latency_ms"),
    ]
    state = State()
    dlq: list[tuple[int, str, int, str]] = []
    folder = Folder(
        state, lambda seq, s, p, exc: dlq.append((seq, exc.reason, exc.index, exc.detail))
    )
    assert folder.apply([message(1, T0, batch)]) == 1
    assert sorted(state.proxies) == [("50.0.0.1", 80), ("50.0.0.4", 80)]
    assert [(s, r, i) for s, r, i, _ in dlq] == [(1, "invalid", 1), (1, "invalid", 2)]
    assert dlq[0][3].startswith("results[1].proto")
    # As single events refused would be: in the DLQ, not counted as folded.
    assert state.agents["c1"].counts == {"ProxyWorked": 2}


def _enrolled(name: str, role: ev.Role) -> list[tuple[int, int, bytes, bytes]]:
    """Per-agent subjects on, and one enrolled agent: messages 1 and 2 of a log."""
    settings = ev.Settings(agent_subjects=True)
    pre: list[ev.Event] = [
        ev.Configured(id=_id(T0 - 9, 0), agent="admin", at=0, settings=settings),
        ev.AgentEnrolled(
            id=_id(T0 - 8, 0), agent="admin", at=0, name=name, role=role, token_sha256="a" * 64
        ),
    ]
    return [message(i + 1, T0 - 1, e) for i, e in enumerate(pre)]


def test_a_worker_may_not_fail_proxies_inside_a_round() -> None:
    """Roles hold per result: a worker's round on its own subject may confirm proxies,
    and its failed results go to the DLQ as forbidden (workers report working ones)."""
    batch = ev.ProxiesChecked(
        id=_id(T0, 1),
        agent="w1",
        at=0,
        key="0123456789abcdef",
        source="0123456789abcdef",
        lease="l",
        results=[
            ev.CheckResult(ip="51.0.0.1", port=80, proto="http", latency_ms=10),
            ev.CheckResult(ip="51.0.0.2", port=80, proto="http", ok=False, error="timeout"),
        ],
    )
    msgs = _enrolled("w1", "worker")
    msgs.append((3, T0, ev.agent_subject(batch).encode(), ev.encode(batch)))
    state = State()
    dlq: list[tuple[str, int]] = []
    Folder(state, lambda seq, s, p, exc: dlq.append((exc.reason, exc.index))).apply(msgs)
    assert dlq == [("forbidden", 1)]
    assert list(state.proxies) == [("51.0.0.1", 80)]


def test_a_round_on_the_wrong_partition_is_refused_whole() -> None:
    """The subject is the round's partition key: a round published under another key is
    a forgery of where it belongs (DLQ forbidden), and a source's round is keyed by it."""
    batch = ev.ProxiesChecked(
        id=_id(T0, 1),
        agent="c1",
        at=0,
        key="s007",
        results=[ev.CheckResult(ip="52.0.0.1", port=80, proto="http", latency_ms=10)],
    )
    msgs = _enrolled("c1", "checker")
    msgs.append((3, T0, b"ppf.in.c1.checked.s008", ev.encode(batch)))
    state = State()
    dlq: list[str] = []
    Folder(state, lambda seq, s, p, exc: dlq.append(exc.reason)).apply(msgs)
    assert dlq == ["forbidden"] and not state.proxies
    keyed_wrong = msgspec.structs.replace(batch, source="0123456789abcdef")
    assert ev.validate.problem(keyed_wrong, lab=False)[0] == "key"


def test_the_locators_batches_are_fixed_by_their_addresses() -> None:
    """One Located an address (under the id it always had), or with batches one per
    data version, its addresses sorted and its id fixed by them: replicas that look up
    the same addresses publish one message."""
    from projections.locator import Place, _located, located_id

    ips = ["2.2.2.2", "1.1.1.1", "3.3.3.3"]
    places = [Place("DE", "o1", "v1"), Place("FR", "o2", "v1"), Place("NL", "", "v2")]
    single = _located(ips, places, 5, batches=False)
    assert [e.id for e in single] == [
        located_id(ip, p.geo) for ip, p in zip(ips, places, strict=True)
    ]
    assert all(e.more == [] for e in single)
    batched = _located(ips, places, 5, batches=True)
    assert [(e.ip, e.geo, [m.ip for m in e.more]) for e in batched] == [
        ("1.1.1.1", "v1", ["2.2.2.2"]),
        ("3.3.3.3", "v2", []),
    ]
    assert batched[0].id == located_id("1.1.1.1|2.2.2.2", "v1")
    assert batched[0].more[0].country == "DE"
    again = _located(list(reversed(ips)), list(reversed(places)), 9, batches=True)
    assert {e.geo: e.id for e in again} == {e.geo: e.id for e in batched}  # order aside


class _FoldAt:
    """What the locator reads of a fold: its state, the log's head, the publish."""

    def __init__(self, head: int, applied: int) -> None:
        from projections.foreground import Foreground

        self.head, self.state, self.foreground = head, State(), Foreground()
        self.state.last_seq = applied
        self.state.unlocated = {"45.1.1.1", "45.1.1.2"}
        self.sent: list[ev.Located] = []
        fold = self

        class _Log:
            async def publish_many(self, events: list[ev.Located]) -> list[int]:
                fold.sent.extend(events)
                return list(range(len(events)))

        self.log = _Log()

    async def head_seq(self, max_age_s: float = 5.0) -> int:
        return self.head

    def catching_up(self) -> bool:
        """The live fold's own rule, over this head as last read."""
        from projections.live import FoldService

        self._head = (0.0, self.head)
        return FoldService.catching_up(self)  # type: ignore[arg-type]


async def test_the_locator_waits_while_the_fold_is_far_behind_the_log() -> None:
    """In a catch-up the addresses not located yet mostly are, further on in the log:
    the locator publishes nothing while more than LAG_BOUND messages are left to fold,
    and locates them once it is within that."""
    from projections.live import LAG_BOUND as BEHIND
    from projections.locator import Locator

    behind = _FoldAt(head=10_000, applied=10_000 - BEHIND - 1)
    assert await Locator(behind).once() == 0 and behind.sent == []  # type: ignore[arg-type]
    near = _FoldAt(head=10_000, applied=10_000 - BEHIND)
    assert await Locator(near).once() > 0  # type: ignore[arg-type]
    assert {ip for e in near.sent for ip in (e.ip, *(m.ip for m in e.more))} == {
        "45.1.1.1",
        "45.1.1.2",
    }


def test_a_round_is_folded_in_pieces_that_add_up_to_the_whole() -> None:
    """A slice of no time at all ends after each ``PIECE`` results of a round: the pool
    grows piece by piece, the state stays at the sequence before the round until it is
    whole, and the pieces build what one fold builds (digest)."""
    size = 3 * PIECE + 4
    results = [
        ev.CheckResult(ip=f"53.0.{i // 250}.{i % 250 + 1}", port=80, proto="http", latency_ms=9)
        for i in range(size)
    ]
    batch = ev.ProxiesChecked(id=_id(T0, 1), agent="c1", at=0, key="s001", results=results)
    msgs = [message(1, T0, worked("8.8.8.8")), message(2, T0 + 1, batch)]
    whole = State()
    Folder(whole).apply(msgs)
    state = State()
    folder = Folder(state)
    assert folder.apply_for(msgs, 0, 0.0) == 1
    grown = []
    while True:
        nxt = folder.apply_for(msgs, 1, 0.0)
        grown.append(len(state.proxies) - 1)
        if nxt == 2:
            break
        assert folder.midway and state.last_seq == 1
    assert grown == [PIECE, 2 * PIECE, 3 * PIECE, size]
    assert not folder.midway and state.last_seq == 2 and folder.applied == 2
    assert digests(state) == digests(whole)


@st.composite
def _checks(draw: st.DrawFn) -> list[ev.Event]:
    """An enrolled checker's and worker's rounds, each agent's results grouped as its
    client groups them (under a few leases and sources, some proxies seen twice, some
    failing, a Fetched among them), the two agents' messages interleaved; trust,
    quotas, the re-send window and quality on."""
    settings = ev.Settings(
        agent_subjects=False, trust=True, trusted_agents=("c1", "w1"), resend_window=64,
        quality=True, quota_events_per_min=1 << 30, quota_proxies_per_hour=1 << 30,
    )  # fmt: skip
    setup: list[ev.Event] = [
        ev.Configured(id=_id(T0, 0), agent="admin", at=0, settings=settings),
        ev.SourceAdded(
            id=_id(T0, 1), agent="admin", at=0, url="https://l.example.net/", url_id=_SOURCE
        ),
    ]
    for n, (name, role) in enumerate((("c1", "checker"), ("w1", "worker")), start=2):
        setup.append(
            ev.AgentEnrolled(
                id=_id(T0, n), agent="admin", at=0, name=name, role=role, token_sha256="0" * 64
            )
        )
    outboxes: dict[str, list[ev.Event]] = {"c1": [], "w1": []}
    for i in range(draw(st.integers(1, 120))):
        agent = draw(st.sampled_from(["c1", "w1"]))
        p = draw(st.integers(0, 40))
        ip, lease = f"31.0.{p // 200}.{p % 200 + 1}", f"lease-{draw(st.integers(0, 2))}"
        eid = _id(T0, 100 + i)
        if agent == "c1" and draw(st.booleans()):
            check: ev.Event = ev.ProxyFailed(
                id=eid, agent=agent, at=0, ip=ip, port=3128, proto="http", lease=lease
            )
        else:
            check = worked(
                agent=agent, ip=ip, port=3128, id=eid, lease=lease,
                source=draw(st.sampled_from(["", _SOURCE])),
                latency_ms=draw(st.integers(0, 3000)), speed_kb_s=draw(st.integers(0, 900)),
                anonymity=draw(st.sampled_from(["", "elite", "transparent"])),
            )  # fmt: skip
        outboxes[agent].append(check)
        if draw(st.integers(0, 30)) == 0:
            outboxes["w1"].append(
                ev.Fetched(id=_id(T0, 10_000 + i), agent="w1", at=0, url_id=_SOURCE, ok=True)
            )
    sent = {agent: group(events) for agent, events in outboxes.items()}
    rounds = setup
    while sent["c1"] or sent["w1"]:
        agent = draw(st.sampled_from([a for a, left in sent.items() if left]))
        rounds.append(sent[agent].pop(0))
    return rounds


_SOURCE = "0123456789abcdef"


@settings(max_examples=80, deadline=None)
@given(rounds=_checks())
def test_a_drawn_round_folds_to_every_table_its_results_fold_to(rounds: list[ev.Event]) -> None:
    """Drawn rounds (ProxiesChecked, the fleet's form) and their results folded one by
    one, in the same order, each under an id of its own, give the same rows in every
    table, and the same meta but the fold's position and the re-send marks (a round is
    one message and one id)."""
    singles = [
        msgspec.structs.replace(e, id=_id(T0, 20_000 + i)) for i, e in enumerate(_singles(rounds))
    ]
    one, other = State(), State()
    Folder(one).apply(message(seq, T0, e) for seq, e in enumerate(singles, start=1))
    Folder(other).apply(message(seq, T0, e) for seq, e in enumerate(rounds, start=1))
    by_one, by_other = digests(one), digests(other)
    assert by_one.keys() == by_other.keys()
    for table in by_one.keys() - {"meta"}:
        assert by_one[table] == by_other[table], table
    for piece in declared(State):
        if isinstance(piece, Kept) and piece.name not in ("last_seq", "marks"):
            assert getattr(one, piece.name) == getattr(other, piece.name), piece.name
