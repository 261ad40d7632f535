"""``ppf replay``, ``ppf tail``, ``ppf schemas``: reading the log and its vocabulary."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec

from eventlog.client import Log
from eventlog.protocol import GapError, Message
from events import DecodeError, Event, ProxiesChecked, decode
from events.batches import expand
from gatewayapi import GatewayApi
from ops.cli.common import DEFAULT_NATS, REPO
from reducers import State

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = sub.add_parser("replay", help="rebuild projections from the log")
    rp.add_argument("--db", required=True, help="the DuckDB file the projections go to")
    rp.add_argument("--to", type=int, default=None, help="stop at this stream sequence")
    rp.add_argument(
        "--verify", action="store_true", help="compare the digest with --gateway's, at its own"
    )
    rp.add_argument("--gateway", default=None, help="a gateway's URL, for --verify")
    rp.add_argument("--nats", default=DEFAULT_NATS)
    rp.add_argument(
        "--from-snapshot",
        action="store_true",
        help="start from the newest snapshot; where the log still starts at seq 1, "
        "check the digest against a full replay to the same seq",
    )
    rp.set_defaults(run=_replay)

    tl = sub.add_parser("tail", help="print live events")
    tl.add_argument("--type", default=None, help="only events of this type (e.g. ProxyWorked)")
    tl.add_argument(
        "--from", dest="from_seq", type=int, default=None, help="from this stream sequence"
    )
    tl.add_argument("--nats", default=DEFAULT_NATS)
    tl.set_defaults(run=_tail)

    sc = sub.add_parser("schemas", help="write the generated schemas")
    sc.add_argument("--check", action="store_true", help="fail when the files differ")
    sc.add_argument("--out", default=str(REPO / "schemas"), help="the folder they are written to")
    sc.set_defaults(run=_schemas)


async def _replay(args: argparse.Namespace) -> int:
    from ops.collector import for_folding
    from ops.progress import Progress
    from projections import digest, digests
    from projections.replay import replay

    for_folding()
    expected = None
    expected_parts: dict[str, str] = {}
    lg = await Log.connect(args.nats)
    try:
        head = await lg.head_seq()
        to = head if args.to is None else min(args.to, head)
        if args.verify:
            if not args.gateway:
                print("ppf replay: --verify needs --gateway URL", file=sys.stderr)
                return 2
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                stats = (await GatewayApi(http, args.gateway).stats()).object()
            if "digest_seq" not in stats:
                print(f"ppf replay: {args.gateway} gave no figures to verify", file=sys.stderr)
                return 1
            # The gateway's digest belongs to its last checkpoint (digest_seq), not to
            # what it has applied since: compare there.
            to, expected = int(stats["digest_seq"]), stats["digest"]
            expected_parts = stats.get("digests") or {}
            if to <= 0:
                print("ppf replay: the gateway has no digest yet; try again", file=sys.stderr)
                return 1
        try:
            start = await _snapshot_state(lg) if args.from_snapshot else None
        except GapError as exc:
            print(f"ppf replay: {exc}", file=sys.stderr)
            return 1
        full = None
        if start is not None and (await lg.snapshots.span()).first_seq == 1:
            progress = Progress("full replay", to)
            db = f"{args.db}.full"
            full = await replay(lg.read(1, until=to), db, on_progress=progress.update)
            progress.close()
            expected = digest(full.state) if expected is None else expected
        snapped = start.last_seq if start is not None else 0  # the replay moves it on
        first = snapped + 1
        progress = Progress("replay", to)
        read = lg.read(first, until=to) if first <= to else _nothing()
        folder = await replay(read, args.db, on_progress=progress.update, state=start)
        progress.close()
    finally:
        await lg.close()
    seq, dig = folder.state.last_seq, digest(folder.state)
    out: dict[str, object] = {"seq": seq, "digest": dig}
    if start is not None:
        out["from_snapshot"] = snapped
        out["full_replay"] = None if full is None else digest(full.state)
    print(json.dumps(out))
    if expected is not None and dig != expected:
        ours = digests(folder.state)
        differ = [name for name, part in expected_parts.items() if ours.get(name) != part]
        where = f" in {', '.join(differ)}" if differ else ""
        print(f"ppf replay: digest differs from {expected}{where}", file=sys.stderr)
        return 1
    return 0


async def _snapshot_state(lg: Log) -> State | None:
    """The newest readable snapshot's state (None when there is none)."""
    from projections.snapshot_policy import Snapshots

    loaded = await Snapshots(lg.snapshots).start_from(State())
    return None if loaded is None else loaded.state


async def _nothing() -> AsyncIterator[list[Message]]:
    return
    yield


async def _tail(args: argparse.Namespace) -> int:
    lg = await Log.connect(args.nats)
    try:
        start = args.from_seq if args.from_seq is not None else await lg.head_seq() + 1
        async for batch in lg.read(start):
            for seq, ts, subject, payload in batch:
                line = {"seq": seq, "ts": ts, "subject": subject.decode()}
                try:
                    event = decode(payload)
                except DecodeError as exc:
                    line["error"] = str(exc)
                else:
                    # A round is its results, one line each (its index beside it), so
                    # --type ProxyWorked shows every confirmation, batched or not.
                    singles: list[Event] = (
                        list(expand(event)) if isinstance(event, ProxiesChecked) else [event]
                    )
                    for index, single in enumerate(singles):
                        if args.type and type(single).__name__ != args.type:
                            continue
                        shown = dict(line, event=msgspec.to_builtins(single))
                        if single is not event:
                            shown["index"] = index
                        print(json.dumps(shown), flush=True)
                    continue
                print(json.dumps(line), flush=True)
    finally:
        await lg.close()
    return 0


def _schemas(args: argparse.Namespace) -> int:
    from ops.schemas import generate

    out = Path(args.out)
    stale = []
    for name, text in generate().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path)
    if stale:
        print("out of date (run `ppf schemas`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0
