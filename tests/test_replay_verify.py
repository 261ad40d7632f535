"""`ppf replay --verify` against a gateway whose state was tampered with: the replay's
digest differs, it exits non-zero, and it names the table that differs (`/v1/stats`
says each table's part of the digest)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import msgspec
import pytest

from eventlog.client import Log, fresh_id
from projections import digests
from projections.store import Store, collect
from tests.helpers import worked
from tests.test_cli import Up, _get


@pytest.mark.timeout(180)
def test_replay_verify_names_the_table_a_tampered_state_differs_in(
    ppf_bin: str, tmp_path: Path
) -> None:
    """A `ppf up` with two proxies, stopped; one proxy row in its DuckDB file changed
    (as a damaged disk or a hand would); restarted: `/v1/stats` gives each table's
    digest, the proxies' not the log's, and `ppf replay --verify` exits 1 naming
    `proxies` and no other table. Before the change it verifies."""
    up = Up(ppf_bin, tmp_path / "data", "--lab", "--no-agents")
    up.start()
    try:

        async def publish() -> None:
            lg = await Log.connect(up.nats)
            for port in (3128, 3129):
                await lg.publish(worked("127.0.0.1", port, id=fresh_id()))
            await lg.close()

        asyncio.run(publish())
        stats = up.caught_up()
        assert set(stats["digests"]) == {
            "proxies",
            "sources",
            "leases",
            "deposits",
            "agents",
            "meta",
        }
        verify = [
            ppf_bin, "replay", "--verify", "--gateway", up.base, "--nats", up.nats, "--db",
        ]  # fmt: skip
        honest = subprocess.run([*verify, str(tmp_path / "a.duckdb")], capture_output=True)
        assert honest.returncode == 0, honest.stderr.decode()[-2000:]
        assert up.stop() == 0

        store = Store(tmp_path / "data" / "ppf.duckdb")
        try:
            state = store.restore()
            row = state.proxies[("127.0.0.1", 3128)]
            state.proxies[("127.0.0.1", 3128)] = msgspec.structs.replace(
                row, confirmations=row.confirmations + 41
            )
            state.dirty["proxies"].add(("127.0.0.1", 3128))
            store.write(collect(state))
            tampered = digests(state)
        finally:
            store.close()

        up.start()
        stats = up.caught_up()
        assert stats["digests"]["proxies"] == tampered["proxies"]
        replay = subprocess.run([*verify, str(tmp_path / "b.duckdb")], capture_output=True)
        said = replay.stderr.decode()
        assert replay.returncode == 1, said[-2000:]
        assert "digest differs" in said and "in proxies" in said, said[-2000:]
        assert not any(f"{t}," in said or f" {t}\n" in said for t in ("sources", "agents")), said
        status, _ = _get(up.base + "/healthz")
        assert status == 200
        assert up.stop() == 0
    finally:
        up.kill()
