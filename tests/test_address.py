"""The one address rule (events/address.py): what it refuses under each revision, that
revision 0 is Python 3.11.7's answers written out, and that every projection takes the
rows of both families."""

from __future__ import annotations

import ipaddress
import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events as ev
from events.address import address_public, proxy_address_ok, public
from events.validate import url_problem
from projections.core import poolview
from projections.core.digest import digest
from projections.core.readmodels import ProxyFilter, query_proxies
from projections.core.recheck import due_in_shard, network_outages, shards, spot_checks
from reducers import State
from reducers.fold import fold
from tests.helpers import worked

T0 = 1_800_000_000_000

# IPv6 forms a trusted agent got served as alive under revision 0 (issue 39's probe):
# NAT64 and 6to4 of private and link-local IPv4, compatible and translated loopback,
# multicast, local-use NAT64, documentation, SRv6, and the two it already refused.
NOT_PROXIES = (
    "64:ff9b::a00:1",
    "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::",
    "::7f00:1",
    "::ffff:0:7f00:1",
    "ff02::1",
    "ff0e::1",
    "64:ff9b:1::a00:1",
    "3fff::1",
    "2001:db8::1",
    "5f00::1",
    "fe80::1",
    "fd00::1",
    "2001:0:a00:1::1",  # Teredo through a private server
    "::ffff:7f00:1",  # mapped: refused under both
)


@pytest.mark.parametrize("ip", NOT_PROXIES)
def test_ipv6_forms_that_reach_inside_are_no_proxies(ip: str) -> None:
    """Neither a proxy nor a public address under the rule every caller uses now."""
    assert not proxy_address_ok(ip, 8080)
    assert not address_public(ip)


@pytest.mark.parametrize(
    "ip", ["2a00:1450:4001:80b::200e", "2606:4700:4700::1111", "64:ff9b::808:808", "8.8.8.8"]
)
def test_public_addresses_stay_proxies(ip: str) -> None:
    """Global unicast IPv6, NAT64 of a public IPv4, and IPv4 outside the registries."""
    assert proxy_address_ok(ip, 8080) and proxy_address_ok(ip, 8080, rule=0)


def test_an_ipv4_spelled_as_ipv6_is_the_ipv4s_proxy_not_another() -> None:
    """One proxy, one key: ``::ffff:808:808`` is 8.8.8.8; the fold keys it as that."""
    assert proxy_address_ok("::ffff:808:808", 80, rule=0)  # what revision 0 took
    assert not proxy_address_ok("::ffff:808:808", 80)
    assert address_public("::ffff:808:808")  # a destination it is, judged by its IPv4


@pytest.mark.parametrize(
    "url",
    [
        "http://192.0.0.192/opc/v1/instance/",
        "http://[::ffff:0:127.0.0.1]/",
        "http://kubernetes.default.svc/",
        "http://foo.corp/",
        "http://api.cluster.local/",
        "http://metadata.google.internal/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://169.254.169.254/",
        "http://127.0.0.1.nip.io/",
    ],
)
def test_sources_that_reach_inside_are_refused_from_rule_1(url: str) -> None:
    """Metadata addresses, embedded private IPv4 and internal names: no source."""
    assert url_problem(url, lab=False, rule=1)
    assert url_problem(url, lab=False, guarded=True, rule=1)


def test_rule_0_kept_what_it_took() -> None:
    """Revision 0 answers as the fold did before the setting: a log written then folds
    the same (the metadata address and the translated loopback were sources)."""
    assert url_problem("http://192.0.0.192/opc/v1/instance/", lab=False) == ""
    assert url_problem("http://foo.corp/", lab=False) == ""
    assert proxy_address_ok("ff02::1", 80, rule=0)


@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7), reason="compares with 3.11.7's own")
def test_rule_0_is_python_3_11_7_written_out() -> None:
    """On 3.11.7 itself: revision 0's answers are ``is_global``'s, for 60,000 addresses
    drawn over both families and the special blocks."""
    rng = random.Random(7)
    blocks = ["::ffff:0:0/96", "2001::/23", "2001:db8::/32", "fc00::/7", "fe80::/10"]
    blocks += ["ff00::/8", "::/96", "64:ff9b::/96", "2002::/16", "100::/64", "2000::/3"]
    for i in range(30_000):
        if i % 2:
            net = ipaddress.IPv6Network(rng.choice(blocks))
            v6 = ipaddress.IPv6Address(
                int(net.network_address) + rng.getrandbits(128 - net.prefixlen)
            )
        else:
            v6 = ipaddress.IPv6Address(rng.getrandbits(128))
        assert public(v6, rule=0) == v6.is_global, v6
        assert proxy_address_ok(str(v6), 80, rule=0) == v6.is_global, v6
        v4 = ipaddress.IPv4Address(rng.getrandbits(32))
        assert public(v4, rule=0) == v4.is_global, v4


def test_the_switch_drops_what_the_new_rule_refuses() -> None:
    """Rows admitted under revision 0 that revision 1 refuses leave at its Configured."""
    state = State()
    seq = 0

    def apply(event: ev.Event) -> None:
        nonlocal seq
        seq += 1
        fold(state, event, seq, T0 + seq)  # type: ignore[arg-type]

    apply(worked("ff02::1"))
    apply(worked("64:ff9b::a00:1"))
    apply(worked("8.8.8.8"))
    assert len(state.proxies) == 3
    settings = ev.Settings(address_rule=1)
    apply(ev.Configured(id="c", agent="admin", at=0, settings=settings))
    assert set(state.proxies) == {("8.8.8.8", 8080)}
    apply(worked("ff02::1", id="x"))
    assert len(state.proxies) == 1


_v4 = st.integers(0, 2**32 - 1).map(lambda v: str(ipaddress.IPv4Address(v)))
_v6 = st.integers(0, 2**128 - 1).map(lambda v: str(ipaddress.IPv6Address(v)))
_global_v6 = st.integers(0, 2**125 - 1).map(lambda v: str(ipaddress.IPv6Address((1 << 125) | v)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ips=st.lists(st.one_of(_v4, _v6, _global_v6), min_size=1, max_size=30, unique=True),
    failing=st.data(),
    rule=st.sampled_from([0, 1]),
)
def test_every_projection_takes_rows_of_both_families(
    ips: list[str], failing: st.DataObject, rule: int
) -> None:
    """Proxies of both families folded, some failing: the recheck shards, due lists,
    outages, spot-checks, the query view, queries and the digest all answer."""
    state = State()
    seq = 0
    configured = ev.Configured(
        id="c", agent="admin", at=0, settings=ev.Settings(address_rule=rule, recheck_fresh_s=0)
    )

    def apply(event: ev.Event) -> None:
        nonlocal seq
        seq += 1
        fold(state, event, seq, T0 + seq * 1000)  # type: ignore[arg-type]

    apply(configured)
    for i, ip in enumerate(ips):
        apply(worked(ip, 8080, id=f"w{i}"))
        if failing.draw(st.booleans()):
            apply(ev.ProxyFailed(id=f"f{i}", agent="c1", at=0, ip=ip, port=8080, proto="http"))
    now = T0 + (seq + 1) * 1000
    for rows in shards(state).values():
        due_in_shard(rows, now, 500, urgent=spot_checks(state))
    network_outages(state, now, min_failing=1, share=0.0)
    admitted = {ip for ip in ips if proxy_address_ok(ip, 8080, rule=rule)}
    assert {ip for ip, _ in state.proxies} == admitted
    assert poolview.build(state) is not None
    served = query_proxies(state, now, ProxyFilter(status="all"), limit=0)
    assert {row.ip for row in served} <= admitted
    assert digest(state)
