"""Which proxies the fleet probes against which sites (projections/core/probes.py): the
operator's sites for every checker, the sites of traffic only for the operator's own,
never a site on the list, and a proxy and a site at most once in 15 minutes; a probe's
page read again once its round tells it from a block (agents/probe.py)."""

from __future__ import annotations

import msgspec

from events import SiteResult, SitesChecked
from events.sites import SiteRule
from ops.lab.testbed import LOOPBACK_EXITS, ProxyLab
from projections.core.probes import PROBE_GAP_MS, TRAFFIC_WINDOW_MS, targets, wanted
from reducers import State, sites
from reducers.rows import ProxyRow
from tests.helpers import eid, shop_refusing

NOW = 1_800_000_000_000


def _row(n: int, *, failing: bool = False) -> ProxyRow:
    ip = f"45.0.0.{n}"
    seen, failed = (NOW - 60_000, NOW - 1_000) if failing else (NOW - 1_000, 0)
    return ProxyRow(ip=ip, port=8080, proto="http", protos=("http",), first_seen=1,
                    last_seen=seen, last_failed=failed)  # fmt: skip


def test_the_operators_sites_for_all_the_traffics_for_its_own_never_the_listed() -> None:
    """The operator's sites go to every checker; the sites of traffic in the last 6 h
    only to the operator's own; a site on the never list to none."""
    state = State()
    state.site_rules = {"shop.com": SiteRule(site="shop.com")}
    state.site_traffic = {"news.com": NOW - 60_000, "old.com": NOW - TRAFFIC_WINDOW_MS - 1}
    assert targets(state, own=False, never=(), now=NOW) == ["shop.com"]
    assert targets(state, own=True, never=(), now=NOW) == ["news.com", "shop.com"]
    assert targets(state, own=True, never=("news.com",), now=NOW) == ["shop.com"]


def test_a_site_that_cannot_be_public_is_probed_only_in_a_lab() -> None:
    """A rule for a metadata address, a private one or an internal name (once accepted
    by ``ppf sites add``, or in an older log) hands out no probe: through a proxy it
    would reach that proxy's own host. A lab's log probes them."""
    state = State()
    inside = ("169.254.169.254", "10.0.0.7", "127.0.0.1", "intranet.local")
    state.site_rules = {s: SiteRule(site=s) for s in ("shop.com", *inside)}
    assert targets(state, own=True, never=(), now=NOW) == ["shop.com"]
    state.settings = msgspec.structs.replace(state.settings, lab=True)
    assert targets(state, own=True, never=(), now=NOW) == sorted(("shop.com", *inside))


def test_a_proxy_and_a_site_are_probed_at_most_once_in_fifteen_minutes() -> None:
    """Not through a failing proxy; not while a verdict (any source) or a probe handed
    out is younger than the gap; every other pair, lazily."""
    rows = [_row(1), _row(2), _row(3, failing=True), _row(4)]
    state = State()
    state.proxies = {(row.ip, row.port): row for row in rows}
    state.trusted = frozenset({"c-own"})
    for ip, through, at in (("45.0.0.1", 1, NOW - 60_000), ("45.0.0.4", 0, NOW - PROBE_GAP_MS - 1)):
        result = SiteResult(ip=ip, port=8080, site="shop.com", through=through, blocked=1 - through)
        said = SitesChecked(id=eid(), agent="c-own", at=at, key="s000", results=[result])
        sites.checked(state, said, at)
    handed = {("45.0.0.2", 8080, "shop.com"): NOW - 1_000}
    due = [
        (row.ip, site) for row, site in wanted(rows, ["news.com", "shop.com"], state, handed, NOW)
    ]
    assert due == [
        ("45.0.0.1", "news.com"),
        ("45.0.0.2", "news.com"),
        ("45.0.0.4", "news.com"),
        ("45.0.0.4", "shop.com"),  # its verdict is older than the gap
    ]


async def test_a_checker_past_its_byte_budget_makes_no_probe_and_says_so() -> None:
    """Past the hour's byte budget a probe is not made: counted, and said in the log once
    an hour."""
    from structlog.testing import capture_logs

    from agents.probe import Prober

    prober = Prober(bytes_per_hour=0)
    with capture_logs() as logs:
        for _ in range(3):
            assert await prober.result("45.0.0.1", 8080, "http", "shop.com") is None
    assert prober.skipped == 3
    assert [x["event"] for x in logs] == ["probe_budget_spent"]


async def test_a_probe_read_before_any_block_is_read_again_when_the_round_is_in(
    lab: ProxyLab,
) -> None:
    """Through real proxies, a site without a rule gives one exit its page and another
    a 403: the first probe has nothing to tell its page from (none), so it is read again
    with the round's answers (``told``) and is ``through``; a page that never met a
    block stays unsaid, and a probe read once is not read again."""
    from agents.probe import Prober

    server = await shop_refusing(LOOPBACK_EXITS["tinyproxy-via"], "127.0.0.17")
    site = f"127.0.0.17:{server.port}"
    ports = {p.name: p.port for p in lab.proxies}
    prober = Prober(bytes_per_hour=1 << 20)
    try:
        first = await prober.result("127.0.0.1", ports["squid"], "http", site)
        alone = await prober.result("127.0.0.1", ports["tinyproxy-elite"], "http", "127.0.0.1:1")
        refused = await prober.result("127.0.0.1", ports["tinyproxy-via"], "http", site)
    finally:
        await server.close()
    assert first is None and alone is None  # nothing to tell a page from, yet
    assert refused is not None and refused.blocked == 1
    asked = [("127.0.0.1", ports["squid"], site), ("127.0.0.1", ports["tinyproxy-via"], site)]
    (again,) = prober.told(asked)
    assert (again.port, again.site, again.through, again.blocked) == (ports["squid"], site, 1, 0)
    assert prober.told(asked) == []  # read once
