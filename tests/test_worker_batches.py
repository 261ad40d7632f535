"""Worker batches: a long one keeps its leases; one bad source costs itself, nothing else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.worker import Worker, WorkerConfig
from ops.lab.testbed import ProxyLab
from ops.nats.server import NatsServer, free_port
from tests.fleet import Fleet, fleet


async def _one_cycle(f: Fleet, tmp_path: Path, cycles: int = 1, **config: object) -> None:
    cfg = WorkerConfig(**{"lab": True, "idle_s": 0.2, "check_timeout_s": 5, **config})  # type: ignore[arg-type]
    worker = Worker(f.gateway, f.token, "w1", f.gateway + "/judge", tmp_path / "w1", cfg)
    await asyncio.wait_for(worker.run(asyncio.Event(), cycles=cycles), 60)
    assert await f.fold.wait_for(await f.log.head_seq(), 10)


@pytest.mark.timeout(120)
async def test_a_list_that_will_not_load_spends_no_attempt(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The fetch failure is told by Fetched (the source backs off); the lease is
    released uncounted, so a source that is down for a while never ends `failed`."""
    gone = f"http://127.0.0.1:{free_port()}/gone.txt"  # nothing listens there
    async with fleet(nats_server, {}, unserved=[gone]) as f:
        await _one_cycle(f, tmp_path)  # through NATS: the gateway offers w1 its login
        lease = next(r for r in f.fold.state.leases.values() if r.target == f.url_ids[gone])
        assert (lease.status, lease.attempts) == ("free", 0)
        assert "Connect" in lease.last_error or "refused" in lease.last_error.lower()
        assert f.fold.state.agents["w1"].counts["Fetched.failed"] == 1


@pytest.mark.timeout(120)
async def test_a_page_that_breaks_the_extractor_spoils_only_itself(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the extractor raises on one page of the batch. The other page's
    proxies are still checked and published; the broken one is released `abandoned`,
    which counts an attempt (a page that always does this is parked by the budget)."""
    import agents.worker as worker_module

    real_extract = worker_module.extract

    def extract(body: bytes, *args: object, **kw: object) -> object:
        if b"POISON" in body:
            raise ValueError("the extractor met a bug")
        return real_extract(body, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_module, "extract", extract)
    squid = next(p for p in lab.proxies if p.name == "squid")
    pages = {"/good.txt": f"127.0.0.1:{squid.port}\n", "/poison.txt": "POISON 8.8.8.8:80\n"}
    async with fleet(nats_server, pages) as f:
        await _one_cycle(f, tmp_path)
        assert ("127.0.0.1", squid.port) in f.fold.state.proxies
        rows = {r.target: r for r in f.fold.state.leases.values()}
        poisoned, good = rows[f.url_ids["/poison.txt"]], rows[f.url_ids["/good.txt"]]
        assert (poisoned.attempts, good.attempts) == (1, 0)
        assert "extractor met a bug" in poisoned.last_error


@pytest.mark.timeout(120)
async def test_heartbeats_keep_a_batch_longer_than_its_lease(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A 10 s lease (the shortest the ledger grants) over a batch that checks a tarpit
    for 14 s: the heartbeats keep it, so it is released `done` by its holder, never
    lost or expired (either would count an attempt)."""
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    async with fleet(nats_server, {"/slow.txt": f"127.0.0.1:{tarpit.port}\n"}) as f:
        await _one_cycle(f, tmp_path, lease_ttl_s=10, check_timeout_s=14)
        row = next(r for r in f.fold.state.leases.values() if r.target == f.url_ids["/slow.txt"])
        assert (row.status, row.attempts, row.lost) == ("free", 0, 0)
        assert f.fold.state.agents["w1"].counts.get("Heartbeat", 0) >= 2


@pytest.mark.timeout(120)
async def test_a_batch_dedups_checks_once_and_follows_links_of_productive_pages(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Three pages leased together: squid listed on two is checked and confirmed once;
    links are taken from the page that yielded proxies, not from the one that did not."""
    by = {p.name: p for p in lab.proxies}
    squid, micro, dante, closed = (by[n] for n in ("squid", "microsocks", "dante", "closed"))
    pages = {
        "/a.html": f"<p>127.0.0.1:{squid.port} socks5://127.0.0.1:{micro.port} socks5://127.0.0.1:{dante.port}</p>"
        '<a href="http://lists.example/next.txt">more</a> <a href="more/page2.html">2</a>',
        "/b.txt": f"127.0.0.1:{squid.port}\n",
        "/c.html": f'<p>127.0.0.1:{closed.port}</p><a href="http://lists.example/other.txt">x</a>',
    }
    async with fleet(nats_server, pages) as f:
        await _one_cycle(f, tmp_path, batch=5)
        state = f.fold.state
        assert state.agents["w1"].counts["ProxyWorked"] == 3
        real = [("127.0.0.1", p.port) for p in (squid, micro, dante)]
        assert [state.proxies[k].confirmations for k in real] == [1, 1, 1]
        linked = {row.url: row for row in state.sources.values()}
        assert linked["http://lists.example/next.txt"].origin == "discovered"
        assert linked["http://lists.example/next.txt"].parent == f.url_ids["/a.html"]
        assert "http://lists.example/other.txt" not in linked
        relative = f.urls["/a.html"].rsplit("/", 1)[0] + "/more/page2.html"
        assert linked[relative].parent == f.url_ids["/a.html"]  # resolved against its page


@pytest.mark.timeout(120)
async def test_a_cycle_checks_at_most_its_cap(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A worker cycle checks at most its cap of addresses."""
    by = {p.name: p for p in lab.proxies}
    page = "".join(f"127.0.0.1:{by[n].port}\n" for n in ("squid", "tinyproxy-via", "dante"))
    async with fleet(nats_server, {"/l.txt": page}) as f:
        await _one_cycle(f, tmp_path, max_proxies=2)
        assert f.fold.state.agents["w1"].counts["ProxyWorked"] == 2


@pytest.mark.timeout(120)
async def test_an_unchanged_page_is_not_extracted_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Fetched twice (a page of 100 candidates or more is due again at once: its yield
    lifts its score by the whole 1.0), extracted once: the second fetch has the hash
    the lease carried."""
    dead: set[int] = set()
    while len(dead) < 120:  # loopback ports nobody holds
        dead.add(free_port())
    page = "".join(f"127.0.0.1:{port}\n" for port in sorted(dead))
    async with fleet(nats_server, {"/same.txt": page}) as f:
        await _one_cycle(f, tmp_path, cycles=2, check_timeout_s=2)
        counts = f.fold.state.agents["w1"].counts
        assert (counts["Fetched"], counts["Extracted"]) == (2, 1)


@pytest.mark.timeout(120)
async def test_an_upstream_that_is_down_blames_no_source(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Tor (here: a SOCKS port nobody holds) down: nothing is learned about the sources,
    so no Fetched is published and the leases go back uncounted."""
    upstream = f"socks5://127.0.0.1:{free_port()}"
    async with fleet(nats_server, {"/a.txt": "8.8.8.8:80\n", "/b.txt": "1.1.1.1:80\n"}) as f:
        cfg = WorkerConfig(lab=True, idle_s=30, upstream=upstream, batch=5)
        worker = Worker(f.gateway, f.token, "w1", f.gateway + "/judge", tmp_path / "w1", cfg)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        leases = f.fold.state.leases
        for _ in range(100):  # until both leases were granted and given back
            if len(leases) == 2 and all(r.status == "free" for r in leases.values()):
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, 30)
        assert await f.fold.wait_for(await f.log.head_seq(), 10)
        assert [(r.status, r.attempts) for r in leases.values()] == [("free", 0)] * 2
        assert all("upstream" in r.last_error for r in leases.values())
        assert "Fetched" not in f.fold.state.agents["w1"].counts


@pytest.mark.timeout(120)
async def test_one_check_per_address_and_a_wrong_hint_is_only_a_first_guess(
    lab: ProxyLab, nats_server: NatsServer, tmp_path: Path
) -> None:
    """microsocks listed bare on one page and as socks5:// on another is checked once;
    dante on a page hinted `http` is still found, as SOCKS5 (the hint is tried first)."""
    by = {p.name: p for p in lab.proxies}
    micro, dante = by["microsocks"], by["dante"]
    pages = {
        "/bare.txt": f"127.0.0.1:{micro.port}\n",
        "/schemed.txt": f"socks5://127.0.0.1:{micro.port}\n",
        "/hinted.txt": f"127.0.0.1:{dante.port}\n",
    }
    async with fleet(nats_server, pages, hints={"/hinted.txt": "http"}) as f:
        await _one_cycle(f, tmp_path, batch=5)
        state = f.fold.state
        assert state.agents["w1"].counts["ProxyWorked"] == 2
        assert state.proxies[("127.0.0.1", micro.port)].confirmations == 1
        assert state.proxies[("127.0.0.1", dante.port)].proto == "socks5"
