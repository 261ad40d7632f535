"""Per-site standing in the fold (reducers/sites.py): a checker's site verdicts, kept per
proxy and site, steering only when a trusted agent's; cells that live as long as their
proxy, within caps every replica applies alike; a table left out of the digest and of a
snapshot while empty; checkpointed and restored like every table."""

from __future__ import annotations

import zlib
from pathlib import Path

import duckdb
import msgspec
import pytest

import events as ev
from events.sites import SiteRule
from projections import Store, digest, digests
from projections.folder import Folder
from projections.snapshot import SnapshotError, StateSnapshot, load, opened, take, unpacked
from reducers import State, sites
from reducers.rows import encode_column
from reducers.sites import BLOCK_KEEP_MS
from tests.folded import FoldedLog, ip
from tests.helpers import eid

HOUR = 3_600


def _verdicts(agent: str, *results: tuple[int, str, int, int]) -> ev.SitesChecked:
    """A round: (proxy number, site, through, blocked) each."""
    return ev.SitesChecked(
        id=eid(),
        agent=agent,
        at=0,
        key="s001",
        results=[
            ev.SiteResult(ip=ip(n), port=8080, site=site, through=t, blocked=b)
            for n, site, t, b in results
        ],
    )


def _log(proxies: int = 3) -> FoldedLog:
    log = FoldedLog()
    log.enrol("c-other", "checker")  # an untested checker
    for n in range(proxies):
        log.report("w-own", ip(n))
    return log


def _standing(log: FoldedLog, n: int, site: str, at_s: float) -> str:
    return sites.standing(log.state, (ip(n), 8080), site, log.ts(at_s))


def _cell(log: FoldedLog, n: int, site: str) -> sites.Cell:
    found = sites.cell(log.state, (ip(n), 8080), site)
    assert found is not None
    return found


def test_a_trusted_checkers_verdicts_steer_and_a_block_is_lifted_in_hours() -> None:
    """The operator's checker's verdicts set each cell's standing; a later answer
    through lifts a block; a block older than BLOCK_KEEP_MS no longer counts; no
    verdict leaves the proxy's own row alone."""
    log = _log()
    before = dict(log.state.proxies)
    log.says(_verdicts("c-own", (0, "google.com", 3, 0), (1, "google.com", 0, 2)), at_s=60)
    assert _standing(log, 0, "google.com", 60) == "through"
    assert _standing(log, 1, "google.com", 60) == "blocked"
    assert _standing(log, 2, "google.com", 60) == "none"
    log.says(_verdicts("c-own", (1, "google.com", 1, 0)), at_s=120)
    assert _standing(log, 1, "google.com", 120) == "through"
    log.says(_verdicts("c-own", (0, "reddit.com", 0, 1)), at_s=180)
    assert _standing(log, 0, "reddit.com", 180) == "blocked"
    assert _standing(log, 0, "reddit.com", 180 + BLOCK_KEEP_MS / 1000) == "none"
    assert log.state.proxies == before  # a block is never the proxy's failure


def test_an_untested_agents_verdicts_are_counted_and_steer_no_one() -> None:
    """An untested checker's block is kept as a count with its vantage, not as a
    standing; once a trusted checker agrees, it steers."""
    log = _log()
    log.says(_verdicts("c-other", (0, "google.com", 0, 5)), at_s=60)
    cell = _cell(log, 0, "google.com")
    assert (cell.blocked, cell.blocked_at, cell.vantages) == (5, 0, ("c-other",))
    assert _standing(log, 0, "google.com", 60) == "none"
    log.says(_verdicts("c-own", (0, "google.com", 0, 1)), at_s=90)
    assert _standing(log, 0, "google.com", 90) == "blocked"
    assert _cell(log, 0, "google.com").vantages == ("c-other", "c-own")


def test_cells_live_as_long_as_their_proxy_and_unknown_proxies_keep_none() -> None:
    """A verdict on a proxy the pool does not know is counted, not kept; the cells of a
    proxy evicted as dead go with it."""
    log = _log(proxies=1)
    log.says(_verdicts("c-own", (0, "google.com", 1, 0), (7, "google.com", 1, 0)), at_s=60)
    assert set(sites.keys(log.state)) == {(ip(0), 8080, "google.com")}
    assert log.state.sites_unkept == 1
    ttl = log.state.settings.proxy_ttl_s
    log.report("w-own", ip(3), at_s=4 * ttl)  # the sweep passes: ip(0) is dead for good
    log.report("w-own", ip(4), at_s=4 * ttl + 700)
    assert (ip(0), 8080) not in log.state.proxies
    assert log.state.sites == {} and log.state.site_cells == {}
    assert log.state.site_proxies == {} and log.state.site_proxy == {}


def test_the_caps_keep_the_first_cells_on_every_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the sites' cap a new site's verdicts are counted, not kept; past a site's
    cells' cap a new proxy's; the same log keeps the same cells wherever it folds."""
    monkeypatch.setattr(sites, "MAX_SITES", 2)
    monkeypatch.setattr(sites, "MAX_CELLS", 2)
    log = _log(proxies=3)
    log.says(
        _verdicts(
            "c-own",
            (0, "a.example", 1, 0),
            (1, "a.example", 1, 0),
            (2, "a.example", 1, 0),  # a third cell of a.example
            (0, "b.example", 1, 0),
            (0, "c.example", 1, 0),  # a third site
        ),
        at_s=60,
    )
    assert sorted(sites.keys(log.state)) == [
        (ip(0), 8080, "a.example"),
        (ip(0), 8080, "b.example"),
        (ip(1), 8080, "a.example"),
    ]
    assert log.state.sites_unkept == 2
    again = State()
    Folder(again).apply(log.messages)
    assert digest(again) == digest(log.state)


def test_a_bad_round_is_refused_and_only_checkers_send_one() -> None:
    """A site key that is not one refuses the round (invalid, to the DLQ); a worker may
    not publish site verdicts at all."""
    log = _log()
    log.says(_verdicts("c-own", (0, "Google.COM", 1, 0)), at_s=60)
    log.says(_verdicts("w-own", (0, "google.com", 1, 0)), at_s=60)
    assert [reason for reason, _ in log.refused] == ["invalid", "forbidden"]
    assert log.state.sites == {}


def test_the_table_is_left_out_of_the_digest_and_the_snapshot_while_empty() -> None:
    """A log without site verdicts has the digest and the snapshot it had before the
    table existed (no ``sites`` part, no ``sites`` table); one with them has both, and
    both round trips give the state's digest back."""
    from projections.core.digest import combine, meta_digest

    log = _log()
    parts = digests(log.state)
    five = {n: int(parts[n], 16) for n in ("proxies", "sources", "leases", "agents", "deposits")}
    assert "sites" not in parts and "site_proxies" not in parts
    empty = {**five, "sites": 0, "site_proxies": 0, "quality": 0}
    assert digest(log.state) == combine(empty, meta_digest(log.state))
    assert b"sites" not in take(log.state)
    log.says(_verdicts("c-own", (0, "google.com", 1, 0)), at_s=60)
    assert digest(log.state) != combine(empty, meta_digest(log.state))
    snap = take(log.state)
    assert b"sites" in snap
    assert digest(load(snap)) == digest(log.state)


def test_cells_are_checkpointed_and_restored(tmp_path: Path) -> None:
    """The table goes to DuckDB with the rest: a restored state has the same cells, the
    same digest and the same derived counts; a cell gone with its proxy is deleted."""
    from projections.store import collect

    log = _log()
    log.says(_verdicts("c-own", (0, "google.com", 2, 0), (1, "reddit.com", 0, 1)), at_s=60)
    store = Store(tmp_path / "s.duckdb")
    store.write(collect(log.state))
    restored = store.restore()
    assert restored.sites == log.state.sites
    assert digest(restored) == digest(log.state)
    assert restored.site_cells == {"google.com": 1, "reddit.com": 1}
    sites.forget(log.state, (ip(0), 8080))
    store.write(collect(log.state))
    assert set(sites.keys(store.restore())) == {(ip(1), 8080, "reddit.com")}
    store.close()


def test_the_pool_view_and_the_read_model_agree_on_works_on() -> None:
    """``works_on`` serves the proxies that get through to each site named, the same
    from the pool view the gateway reads as from the plain read model."""
    from projections.core.poolview import build
    from projections.core.readmodels import ProxyFilter, query_proxies

    log = _log(proxies=4)
    said = [(0, "google.com", 1, 0), (1, "google.com", 1, 0), (1, "reddit.com", 0, 1)]
    said += [(2, "reddit.com", 1, 0), (3, "google.com", 0, 1)]
    log.says(_verdicts("c-own", *said), at_s=60)
    log.says(_verdicts("c-other", (3, "reddit.com", 9, 0)), at_s=60)  # steers no one
    now = log.ts(61)
    view = build(log.state)
    for works_on, expected in [
        (("google.com",), {0, 1}),
        (("reddit.com",), {2}),
        (("google.com", "reddit.com"), set()),
        (("tiktok.com",), set()),
    ]:
        f = ProxyFilter(works_on=works_on)
        plain = {r.ip for r in query_proxies(log.state, now, f, limit=0)}
        seen = {v.ip for v in view.select(f, now, limit=0)}
        assert plain == seen == {ip(n) for n in expected}, works_on


def test_the_latest_word_per_site_is_counted_and_rebuilt_on_restore() -> None:
    """/metrics' counts per site (the latest steering verdict of each cell) follow every
    verdict and eviction, and a restore counts them again to the same."""

    log = _log()
    log.says(_verdicts("c-own", (0, "google.com", 1, 0), (1, "google.com", 0, 1)), at_s=60)
    log.says(_verdicts("c-other", (2, "google.com", 0, 3)), at_s=60)  # steers no one
    assert sites.latest_counts(log.state) == {"google.com": {"through": 1, "blocked": 1}}
    log.says(_verdicts("c-own", (1, "google.com", 2, 0)), at_s=90)
    assert sites.latest_counts(log.state) == {"google.com": {"through": 2, "blocked": 0}}
    sites.forget(log.state, (ip(0), 8080))
    sites.forget(log.state, (ip(1), 8080))
    assert sites.latest_counts(log.state) == {}
    log.says(_verdicts("c-own", (2, "reddit.com", 0, 1)), at_s=120)
    counted = sites.latest_counts(log.state)
    assert counted == {"reddit.com": {"through": 0, "blocked": 1}}
    restored = load(take(log.state))
    assert sites.latest_counts(restored) == counted


def _blocked(consumer: str, n: int, site: str) -> ev.ProxyReported:
    return ev.ProxyReported(
        id=eid(), agent=consumer, at=0, ip=ip(n), port=8080, outcome="blocked", site=site
    )


def test_a_consumers_blocked_report_steers_only_within_its_share_per_site() -> None:
    """An untrusted consumer's word that a site turned a proxy away acts for everyone at
    most ``report_share`` of the site's cells an hour (at least one); past it, and on
    another site's cells, it is counted; the next hour it acts again. It never fails the
    proxy."""
    log = _log(proxies=4)
    log.enrol("shop", "consumer")
    log.says(_verdicts("c-own", *[(n, "google.com", 1, 0) for n in range(4)]), at_s=60)
    before = dict(log.state.proxies)
    log.service(_blocked("shop", 0, "google.com"), at_s=70)
    log.service(_blocked("shop", 1, "google.com"), at_s=80)
    assert _standing(log, 0, "google.com", 80) == "blocked"
    assert _standing(log, 1, "google.com", 80) == "through"  # past its share: counted only
    assert _cell(log, 1, "google.com").blocked == 1
    log.service(_blocked("shop", 2, "google.com"), at_s=3_700)  # the next hour
    assert _standing(log, 2, "google.com", 3_700) == "blocked"
    assert log.state.proxies == before
    again = State()
    Folder(again).apply(log.messages)
    assert digest(again) == digest(log.state)  # the takes are in the meta and its digest


def test_a_blocked_report_names_its_site_and_only_it_does() -> None:
    """``blocked`` without a site key, or a site with another outcome, is refused."""
    log = _log()
    log.enrol("shop", "consumer")
    log.service(_blocked("shop", 0, ""), at_s=60)
    log.service(_blocked("shop", 0, "Not A Site"), at_s=60)
    failed = ev.ProxyReported(
        id=eid(), agent="shop", at=0, ip=ip(0), port=8080, outcome="failed", site="google.com"
    )
    log.service(failed, at_s=60)
    assert [reason for reason, _ in log.refused] == ["invalid"] * 3
    assert log.state.sites == {}


def test_a_file_of_the_build_with_a_row_per_cell_is_made_anew_or_refused(
    tmp_path: Path,
) -> None:
    """A DuckDB file whose sites table has a row per proxy and site (an earlier build):
    empty, it is made anew in columns; with rows, it is refused, saying to replay."""
    from projections import StoreError

    for name, rows in (("empty", 0), ("full", 1)):
        path = tmp_path / f"{name}.duckdb"
        con = duckdb.connect(str(path))
        con.execute(
            "CREATE TABLE sites (ip VARCHAR NOT NULL, port INTEGER NOT NULL,"
            " site VARCHAR NOT NULL, row BLOB NOT NULL, PRIMARY KEY (ip, port, site))"
        )
        if rows:
            con.execute("INSERT INTO sites VALUES ('45.0.0.1', 8080, 'google.com', '')")
        con.close()
        if rows:
            with pytest.raises(StoreError, match="replay the log"):
                Store(path)
            continue
        store = Store(path)
        log = _log()
        log.says(_verdicts("c-own", (0, "google.com", 1, 0)), at_s=60)
        from projections.store import collect

        store.write(collect(log.state))
        assert digest(store.restore()) == digest(log.state)
        store.close()


def test_a_snapshot_keeps_the_cells_packed_and_loads_them_whole() -> None:
    """The sites table is a snapshot's zlib-packed bin, smaller than its array, with
    its unpacked size stated; a load (its rows unpacked and summed on the loader's own
    thread) gives the digest, and so does a snapshot that states no size (an older one)."""
    log = _log(proxies=60)
    log.says(_verdicts("c-own", *[(n, f"s{n % 4}.example", 1, 0) for n in range(60)]), at_s=60)
    snap = take(log.state)
    doc = msgspec.msgpack.decode(snap, type=StateSnapshot)
    raw = doc.tables["sites"]
    whole = unpacked(raw)
    assert bytes(raw)[0] in (0xC4, 0xC5, 0xC6) and len(raw) < len(whole)
    assert doc.sizes == {"sites": len(whole)}
    assert len(msgspec.msgpack.decode(whole)) == 4  # a row of cells a site
    assert digest(load(snap)) == digest(log.state)
    doc.sizes = {}
    assert digest(load(msgspec.msgpack.encode(doc))) == digest(log.state)


def test_a_snapshot_whose_packed_cells_are_damaged_is_refused() -> None:
    """Packed bytes that do not unpack, and cells that unpack to other rows than the
    digest summed, are each refused with a SnapshotError, not loaded."""
    log = _log(proxies=20)
    log.says(_verdicts("c-own", *[(n, "s0.example", 1, 0) for n in range(20)]), at_s=60)
    doc = msgspec.msgpack.decode(take(log.state), type=StateSnapshot)
    whole = bytes(unpacked(doc.tables["sites"]))
    doc.tables["sites"] = msgspec.Raw(msgspec.msgpack.encode(b"not zlib at all"))
    with pytest.raises(SnapshotError, match="packed table"):
        load(msgspec.msgpack.encode(doc))
    other = log.state.sites[("s0.example", 0)]
    other.through[3] += 1  # a cell's count that no verdict gave
    rows = msgspec.msgpack.encode([other], enc_hook=encode_column)
    assert rows != whole
    doc.tables["sites"] = msgspec.Raw(msgspec.msgpack.encode(zlib.compress(rows)))
    with pytest.raises(SnapshotError, match="digest"):
        load(msgspec.msgpack.encode(doc))


async def test_a_snapshots_rows_as_stored_are_a_fresh_files_first_checkpoint(
    tmp_path: Path,
) -> None:
    """What a fold that starts from a snapshot writes first: the snapshot's own arrays
    (its packed cells unpacked), sent to the checkpoint writer as they are. The file
    restores to the snapshot's state, and the writer's digest is the one a checkpoint
    cut from the rows gives."""
    from projections.store import collect
    from projections.writer import ProcessWriter

    log = _log(proxies=20)
    log.says(_verdicts("c-own", *[(n, f"s{n % 3}.example", 1, n % 2) for n in range(20)]), at_s=60)
    loaded = opened(take(log.state))
    assert not loaded.state.dirty["sites"] and not loaded.state.dirty["proxies"]
    path = tmp_path / "fresh.duckdb"
    writer = ProcessWriter(path)
    await writer.start()
    try:
        assert await writer.write(loaded.cut) == log.state.last_seq
        from_snapshot = writer.digest
    finally:
        await writer.close()
    store = Store(path)
    try:
        assert digest(store.restore()) == digest(log.state)
    finally:
        store.close()
    cut = ProcessWriter(tmp_path / "cut.duckdb")
    await cut.start()
    try:
        await cut.write(collect(log.state))
        assert cut.digest == from_snapshot
    finally:
        await cut.close()


def _row_of_64_bit_columns() -> bytes:
    """A row of one site cell as the build before 16-bit places and 32-bit counts wrote
    it: every column but the vantages 8 bytes a cell."""
    return msgspec.msgpack.encode(
        {
            "site": "google.com",
            "chunk": 0,
            "nos": bytes(8),
            "through_at": (60_000).to_bytes(8, "little"),
            "blocked_at": bytes(8),
            "through": (1).to_bytes(8, "little"),
            "blocked": bytes(8),
            "vantages": (1).to_bytes(2, "little") + bytes(6),
            "agents": ["c-own"],
        }
    )


def test_cells_of_an_earlier_builds_columns_are_refused_not_misread(tmp_path: Path) -> None:
    """A checkpoint file, and a snapshot, holding a row of cells in the earlier build's
    64-bit columns: its columns would read as four places and two counts a time, so
    each is refused (the file saying to replay, the snapshot for an older one), never
    restored as cells no verdict gave."""
    from projections import StoreError
    from projections.store import collect

    log = _log()
    log.says(_verdicts("c-own", (0, "google.com", 1, 0)), at_s=60)
    path = tmp_path / "old.duckdb"
    store = Store(path)
    store.write(collect(log.state))
    store.close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE sites SET row = ?", [_row_of_64_bit_columns()])
    con.close()
    store = Store(path)
    with pytest.raises(StoreError, match="replay"):
        store.restore()
    store.close()
    doc = msgspec.msgpack.decode(take(log.state), type=StateSnapshot)
    rows = msgspec.msgpack.encode([msgspec.Raw(_row_of_64_bit_columns())])
    doc.tables["sites"] = msgspec.Raw(msgspec.msgpack.encode(zlib.compress(rows)))
    doc.sizes = {"sites": len(rows)}
    with pytest.raises(SnapshotError, match="earlier build"):
        load(msgspec.msgpack.encode(doc))


def test_pool_views_that_keep_what_they_found_of_the_sites_say_what_a_fresh_one_says() -> None:
    """One ``ThroughKept`` across views, as the gateway's keeper holds it, gives every
    view the proxies through to each site that a view built afresh gives: after new
    verdicts, after a block is lifted by time alone, after a proxy's cells are dropped;
    and a site none of whose rows moved keeps the very set of the view before."""
    from projections.core.poolview import ThroughKept, building
    from reducers.steps import at_once

    log = _log(proxies=40)
    log.says(_verdicts("c-own", *[(n, f"s{n % 2}.example", 1, 0) for n in range(40)]), at_s=60)
    blocks = [(n, f"s{n % 2}.example", 0, 1) for n in range(0, 40, 3)]
    log.says(_verdicts("c-own", *blocks), at_s=100)  # a third turned away since
    kept = ThroughKept()

    def both(
        at_s: float,
    ) -> tuple[dict[str, set[tuple[str, int]]], dict[str, set[tuple[str, int]]]]:
        now = log.ts(at_s)
        with_kept = at_once(building(log.state, now, kept)).through
        return with_kept, at_once(building(log.state, now)).through

    first, fresh = both(120)
    assert first == fresh and set(first) == {"s0.example", "s1.example"}
    assert (ip(0), 8080) not in first["s0.example"]
    log.says(_verdicts("c-own", (3, "s1.example", 2, 0)), at_s=180)  # turned away before
    second, fresh = both(240)
    assert second == fresh and (ip(3), 8080) in second["s1.example"]
    assert second["s0.example"] is first["s0.example"]  # none of its rows moved
    lifted, fresh = both(100 + BLOCK_KEEP_MS / 1000 + 1)  # every block lifted, by time
    assert lifted == fresh and (ip(0), 8080) in lifted["s0.example"]
    sites.forget(log.state, (ip(4), 8080))
    dropped, fresh = both(100 + BLOCK_KEEP_MS / 1000 + 2)
    assert dropped == fresh and (ip(4), 8080) not in dropped["s0.example"]


def test_an_untested_checker_opens_no_site_but_the_operators_once_guarded() -> None:
    """With ``site_cells_guarded`` (ppf up sets it), an untested checker's rounds on invented
    sites open no cell (counted as not kept): it took every slot before, and the
    operator's target then kept nothing. On the operator's target it opens cells, and on
    a cell kept already its verdicts count as before. A log without the setting folds
    as it did."""
    target = ev.SiteRuled(id=eid(), agent="admin", at=0, rule=SiteRule(site="shop.com"))
    for guarded in (False, True):
        log = FoldedLog(site_cells_guarded=guarded)
        log.enrol("c-other", "checker")
        for n in range(3):
            log.report("w-own", ip(n))
        log.service(target)
        invented = [(n % 3, f"x{n}.example", 1, 0) for n in range(300)]
        log.says(_verdicts("c-other", *invented), at_s=60)
        assert len(log.state.site_cells) == (0 if guarded else sites.MAX_SITES)
        log.says(_verdicts("c-other", (0, "shop.com", 1, 0)), at_s=90)
        kept = sites.cell(log.state, (ip(0), 8080), "shop.com")
        assert (kept is not None) is guarded  # unguarded, the slots were all taken
        log.says(_verdicts("c-own", (1, "google.com", 1, 0)), at_s=120)
        log.says(_verdicts("c-other", (1, "google.com", 0, 1)), at_s=150)
        if guarded:
            assert _cell(log, 1, "google.com").blocked == 1  # counted on the kept cell
            assert log.state.sites_unkept == 300
