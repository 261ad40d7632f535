"""Learning that never stops (reducers/sites.py, ``Settings.site_eviction``): a full table
of sites makes room for a new one by evicting the lowest ranked, the same on every
replica; the operator's targets and the sites of recent traffic keep theirs."""

from __future__ import annotations

import events as ev
from events.sites import SiteRule
from projections import digest
from projections.folder import Folder
from reducers import State, sites
from tests.folded import OPERATOR, FoldedLog, ip
from tests.helpers import eid


def _verdicts(agent: str, *results: tuple[int, str]) -> ev.SitesChecked:
    """A round of answers through: (proxy number, site) each."""
    return ev.SitesChecked(
        id=eid(), agent=agent, at=0, key="s001",
        results=[ev.SiteResult(ip=ip(n), port=8080, site=s, through=1) for n, s in results],
    )  # fmt: skip


def _full(evicting: bool) -> FoldedLog:
    """A table full of sites a trusted checker invented, after an endpoint's traffic to
    ``shop.example`` and the operator's target ``target.example``."""
    log = FoldedLog(site_eviction=evicting, trusted_agents=(*OPERATOR, "e-own"))
    log.enrol("e-own", "endpoint")
    for n in range(3):
        log.report("w-own", ip(n))
    log.service(ev.SiteRuled(id=eid(), agent="admin", at=0, rule=SiteRule(site="target.example")))
    log.says(_verdicts("c-own", (0, "target.example")), at_s=10)
    log.service(_verdicts("e-own", (1, "shop.example")), at_s=20)  # through its gateway
    invented = [(n % 3, f"x{n}.example") for n in range(sites.MAX_SITES)]
    log.says(_verdicts("c-own", *invented), at_s=30)
    return log


def test_a_full_table_evicts_the_lowest_ranked_site_never_a_target_or_recent_traffic() -> None:
    """Without the setting the first sites keep their slots for good (a pool that had run
    a while learned no new site); with it, each new site evicts the site with the oldest
    verdict that nobody's traffic went to, and the target and the traffic's site stay."""
    frozen = _full(evicting=False)
    assert len(frozen.state.site_cells) == sites.MAX_SITES
    frozen.says(_verdicts("c-own", (2, "new.example")), at_s=40)
    assert sites.cell(frozen.state, (ip(2), 8080), "new.example") is None

    log = _full(evicting=True)
    assert len(log.state.site_cells) == sites.MAX_SITES
    assert {"target.example", "shop.example"} <= set(log.state.site_cells)
    # The invented sites in the one round share its time: the first by name goes first.
    evicted = min(set(log.state.site_cells) - {"target.example", "shop.example"})
    log.says(_verdicts("c-own", (2, "new.example")), at_s=40)
    assert sites.cell(log.state, (ip(2), 8080), "new.example") is not None
    assert evicted not in log.state.site_cells
    assert all(key[0] != evicted for key in log.state.sites)
    # A flood of new invented sites: the target and the traffic's site keep their room.
    for part in range(2):
        flood = [(n % 3, f"y{part}-{n}.example") for n in range(sites.MAX_SITES)]
        log.says(_verdicts("c-own", *flood), at_s=50)
    assert log.refused == []
    assert not any(s.startswith("x") for s in log.state.site_cells)
    assert len(log.state.site_cells) == sites.MAX_SITES
    assert {"target.example", "shop.example"} <= set(log.state.site_cells)
    # An older verdict cannot evict a newer one: a site seen at 45 s stays out.
    log.says(_verdicts("c-own", (0, "late.example")), at_s=45)
    assert "late.example" not in log.state.site_cells


def test_eviction_folds_the_same_on_every_replica_and_from_a_restore() -> None:
    """The same log gives the same table and digest folded in one go, message by message
    and after a restore of the rows midway (the derived latest verdicts rebuilt)."""
    log = _full(evicting=True)
    log.says(_verdicts("c-own", (2, "new.example")), at_s=40)
    again = Folder(State())
    for message in log.messages:
        again.apply([message])
    assert digest(again.state) == digest(log.state)
    restored = Folder(State())
    half = len(log.messages) - 1
    restored.apply(log.messages[:half])
    seen = dict(restored.state.site_seen)
    sites.reindex(restored.state)  # what a restore does: the derived counts rebuilt
    assert restored.state.site_seen == seen
    restored.apply(log.messages[half:])
    assert digest(restored.state) == digest(log.state)
    assert set(restored.state.site_cells) == set(log.state.site_cells)


def test_verdicts_are_charged_each_and_an_untested_agent_gives_them_on_targets_only() -> None:
    """With ``verdicts_guarded`` (ppf up sets it), a round of site verdicts counts each
    verdict against its agent's events-a-minute quota (a round past it refused whole,
    ``quota``), and an untested checker's round naming a site other than the operator's
    targets is refused (``forbidden``, in the DLQ) while its verdicts on a target fold;
    without it, a round of 500 counted as one event and every site was taken."""
    for guarded in (False, True):
        log = FoldedLog(verdicts_guarded=guarded, quota_events_per_min=100)
        log.enrol("c-other", "checker")
        for n in range(3):
            log.report("w-own", ip(n))
        target = SiteRule(site="target.example")
        log.service(ev.SiteRuled(id=eid(), agent="admin", at=0, rule=target))
        log.says(_verdicts("c-other", (0, "elsewhere.example")), at_s=10)
        assert bool([why for reason, why in log.refused if reason == "forbidden"]) is guarded
        assert (sites.cell(log.state, (ip(0), 8080), "elsewhere.example") is None) is guarded
        many = [(n % 3, "target.example") for n in range(60)]
        log.says(_verdicts("c-other", *many), at_s=20)
        log.says(_verdicts("c-other", *many), at_s=21)  # 120 verdicts in a minute
        quota = [why for reason, why in log.refused if reason == "quota"]
        assert bool(quota) is guarded, log.refused
        if guarded:
            assert (
                log.refused[0][0] == "forbidden"
                and "elsewhere.example is not one" in (log.refused[0][1])
            )
            assert "60 verdicts more pass the quota (100)" in quota[0]


def test_an_untested_checkers_flood_of_invented_sites_leaves_a_target_learned_and_served() -> None:
    """Exhaustion, as ``ppf up`` folds (``site_eviction`` and ``verdicts_guarded`` on):
    an untested checker sends 1,024 rounds of verdicts on invented sites (two new sites
    and 500 verdicts a round); then the operator adds ``shop-target.com`` and its own
    (trusted) checker probes it. Every invented round is refused (``forbidden`` or
    ``quota``, in the DLQ), no invented site takes a slot, and the target's verdicts
    are kept: ``works_on``'s
    reading (``sites.standing``) says its proxy gets through. (Before: 488,090 cells
    taken in 1.2 s, and the target's verdicts ``unkept`` for good.)"""
    log = FoldedLog(site_eviction=True, verdicts_guarded=True, trusted_agents=(*OPERATOR, "c-own"))
    log.enrol("c-other", "checker")
    for n in range(3):
        log.report("w-own", ip(n))
    for r in range(1_024):
        flood = [(n % 3, f"x{r}-{n % 2}.example") for n in range(500)]
        log.says(_verdicts("c-other", *flood), at_s=10 + r * 0.01)
    assert len(log.refused) == 1_024, log.refused[:3]
    assert {reason for reason, _ in log.refused} <= {"forbidden", "quota"}
    assert not [s for s in log.state.site_rules if s.startswith("x")]
    assert all(sites.cell(log.state, (ip(0), 8080), f"x{r}-0.example") is None for r in range(9))
    target = SiteRule(site="shop-target.com")
    log.service(ev.SiteRuled(id=eid(), agent="admin", at=0, rule=target), at_s=100)
    log.says(_verdicts("c-own", (1, "shop-target.com")), at_s=200)  # ppf up's own checker
    assert len(log.refused) == 1_024, log.refused[-1]
    assert sites.standing(log.state, (ip(1), 8080), "shop-target.com", 200_000) == "through"
