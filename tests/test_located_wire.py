"""reducers/_fastfold_parts/located_wire.c reads a Located from its payload in place,
and only where msgspec decodes the same event from the same bytes: the service's own
form is read, anything else (hostile or merely spaced) is left to msgspec."""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from events import Located
from events.codec import decode_plain, encode
from ops.bench.synthetic import route
from reducers import State, fold
from reducers.admission import admit
from tests.test_fastfold import _everything, _log, native

_fold_module = sys.modules["reducers.fold"]


_texts = st.text(max_size=12) | st.sampled_from(["", "DE", "8.8.8.8", "DTAG", "v1"])
_ints = st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5)


@native
@settings(max_examples=400, deadline=None)
@given(
    id=_texts, agent=_texts, at=_ints, ip=_texts, country=_texts, asn=_ints, org=_texts, geo=_texts
)
def test_a_located_read_in_place_is_what_msgspec_decodes(
    id: str, agent: str, at: int, ip: str, country: str, asn: int, org: str, geo: str
) -> None:
    """The C reads a Located's payload in place (reducers/_fastfold_parts/located_wire.c)
    only where msgspec decodes the same event from it, and it does read every one whose
    text needs no escape and whose numbers fit 18 digits: the form the service writes."""
    event = Located(id=id, agent=agent, at=at, ip=ip, country=country, asn=asn, as_org=org, geo=geo)
    payload = encode(event)
    read = _fold_module._fastfold.located_fields(payload)
    fields = (id, agent, at, event.v, ip, country, asn, org, geo)
    plain = all(
        all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in s)
        for s in (id, agent, ip, country, org, geo)
    ) and all(abs(n) < 10**18 for n in (at, asn))
    assert read == (fields if plain else None), (payload, read)


_GOOD = encode(Located(id="a", agent="fold", at=1, ip="1.2.3.4", asn=7, geo="v1"))


@native
@settings(max_examples=400, deadline=None)
@given(
    at=st.integers(0, len(_GOOD) - 1),
    edit=st.sampled_from(["drop", "insert", "replace"]),
    byte=st.sampled_from([*b' "\\,:{}0-.e9aZ\x00\x7f', 0xC3]),
)
def test_a_located_altered_is_read_as_msgspec_reads_it_or_left_to_it(
    at: int, edit: str, byte: int
) -> None:
    """Any payload one byte away from the encoder's form (as a broken or hostile
    publisher might send) is either left to msgspec or read as msgspec decodes it: never
    a field msgspec would read otherwise, never a payload msgspec refuses."""
    good = bytearray(_GOOD)
    if edit == "drop":
        del good[at]
    elif edit == "insert":
        good.insert(at, byte)
    else:
        good[at] = byte
    payload = bytes(good)
    read = _fold_module._fastfold.located_fields(payload)
    if read is None:
        return
    event = decode_plain(payload)  # raises where msgspec refuses what the C read: a failure
    assert isinstance(event, Located)
    fields = (event.id, event.agent, event.at, event.v, event.ip, event.country, event.asn,
              event.as_org, event.geo)  # fmt: skip
    assert read == fields, payload


@native
def test_fold_batch_reads_the_service_s_locations_without_decoding_them() -> None:
    """The C loop folds a Located in the encoder's form from its bytes (decode is never
    called for it) and hands any other form to decode, with the same state as fold()."""
    events = [(e, ts) for e, ts in _log(3, 200) if not isinstance(e, Located)]
    state, plain = State(), State()
    for seq, (event, ts) in enumerate(events, 1):
        fold(state, event, seq, ts)
        fold(plain, event, seq, ts)
    ts = events[-1][1]
    ips = sorted({ip for ip, _ in state.proxies})
    assert len(ips) >= 3, ips
    where = [
        Located(id=f"ffffffff-0000-7000-8000-{i:012d}", agent="fold", at=0, ip=ip, country="SE",
                asn=3301, as_org="Telia", geo="v9")
        for i, ip in enumerate(ips)
    ]  # fmt: skip
    messages = [
        (len(events) + i + 1, ts, route(e)[0].encode(), encode(e)) for i, e in enumerate(where)
    ]
    spaced = json.dumps(msgspec.to_builtins(where[0])).encode()
    messages[0] = (*messages[0][:3], spaced)
    decoded: list[bytes] = []

    def counting(payload: bytes) -> Any:
        decoded.append(payload)
        return decode_plain(payload)

    run = _fold_module.fast_batch()
    assert run is not None
    stop, applied, _ = run(
        state,
        messages,
        0,
        counting,
        admit,
        _fold_module.fast_folds(),
        _fold_module.fold_rules,
        b"ppf.dlq.",
    )
    assert (stop, applied) == (len(messages), len(messages))
    assert decoded == [spaced]  # the others were read in place
    for seq, (event, _) in enumerate(zip(where, messages, strict=True), len(events) + 1):
        fold(plain, event, seq, ts)
    assert _everything(state) == _everything(plain)
    assert {state.proxies[k].country for k in state.proxies} == {"SE"}
