"""``ppf seed plan|status``, ``ppf import proxies``: bulk imports, cut into resumable
ranges for seed nodes (docs/operations.md, "Bulk imports"; docs/architecture.md §3
``SeedPlanned``)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import aiohttp

from eventlog.client import Log
from events import Deposited, SeedKind, SeedPlanned
from events.keys import input_key, items_of, plan_id
from events.mint import fresh_id, now_ms
from gatewayapi import GatewayApi
from ops.cli.common import DEFAULT_NATS

__all__ = ["plan", "register", "uncovered"]

DEFAULT_SIZE = 500


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sd = sub.add_parser("seed", help="bulk imports worked by seed nodes")
    sd_sub = sd.add_subparsers(dest="action", required=True)
    pl = sd_sub.add_parser("plan", help="store an input and cut it into ranges")
    pl.add_argument("input", help="a file (one item a line), - for stdin, or an http(s) URL")
    pl.add_argument(
        "--kind", choices=["proxies", "sources"], default="proxies", help="what the items are"
    )
    pl.add_argument("--size", type=int, default=DEFAULT_SIZE, help="items a range")
    pl.add_argument("--priority", type=int, default=0, help="larger goes first (taking turns)")
    pl.add_argument("--nats", default=DEFAULT_NATS)
    pl.add_argument(
        "--gateway", default="http://127.0.0.1:8080", help="asked whether imports are paused"
    )
    pl.set_defaults(run=_plan, command="ppf seed plan")
    st = sd_sub.add_parser("status", help="ranges, items reached, nodes, failures")
    st.add_argument("--gateway", default="http://127.0.0.1:8080")
    st.add_argument("--json", action="store_true")
    st.set_defaults(run=_status)

    im = sub.add_parser("import", help="bulk import of a local dump")
    im_sub = im.add_subparsers(dest="what", required=True)
    px = im_sub.add_parser("proxies", help="candidate proxies, one a line: checked by seed nodes")
    px.add_argument("input", help="a file, or - for stdin")
    px.add_argument("--size", type=int, default=DEFAULT_SIZE)
    px.add_argument("--priority", type=int, default=0)
    px.add_argument("--nats", default=DEFAULT_NATS)
    px.add_argument(
        "--gateway", default="http://127.0.0.1:8080", help="asked whether imports are paused"
    )
    px.set_defaults(run=_plan, kind="proxies", command="ppf import proxies")


def uncovered(total: int, ranges: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """The stretches of items 0 .. total-1 that no range covers, in order."""
    out = []
    at = 0
    for _, start, end in sorted(ranges, key=lambda r: r[1]):
        if start > at:
            out.append((at, min(start, total) - 1))
        at = max(at, end + 1)
    if at < total:
        out.append((at, total - 1))
    return [(a, b) for a, b in out if a <= b]


async def plan(
    lg: Log, data: bytes, kind: SeedKind, size: int, priority: int
) -> tuple[SeedPlanned | None, int]:
    """Store ``data`` once, announce it, and plan what no earlier range of the same
    input covers; (the SeedPlanned published or None, its new ranges)."""
    sha = hashlib.sha256(data).hexdigest()
    key = input_key(sha)
    items = items_of(data)
    await lg.deposits.put(key, data)
    name = plan_id(sha)
    await lg.publish(
        Deposited(
            id=fresh_id(), agent="admin", at=now_ms(), key=key, sha256=sha, bytes=len(data),
            items=len(items),
        )
    )  # fmt: skip
    last = await lg.last_event(f"ppf.seed.{name}")
    before = last if isinstance(last, SeedPlanned) else None
    old = list(before.ranges) if before is not None else []
    new = [
        (f"r{start}", start, min(start + size - 1, end))
        for first, end in uncovered(len(items), old)
        for start in range(first, end + 1, size)
    ]
    if not new and before is not None and before.priority == priority:
        return None, 0
    event = SeedPlanned(
        id=fresh_id(),
        agent="admin",
        at=now_ms(),
        plan=name,
        input=key,
        ranges=old + new,
        kind=kind,
        priority=priority,
    )
    await lg.publish(event)
    return event, len(new)


async def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    if source.startswith(("http://", "https://")):
        async with aiohttp.ClientSession() as http, http.get(source) as r:
            r.raise_for_status()
            return await r.read()
    return Path(source).read_bytes()


async def _paused(gateway: str, command: str) -> str:
    """Why the gateway's disk budget guard pauses imports ("" when it does not). A
    gateway that cannot be asked is said, and planning goes on: the guard also holds
    seed leases back, so nothing is worked past the budget either way."""
    async with aiohttp.ClientSession() as http:
        answer = await GatewayApi(http, gateway).stats()
    if not answer.ok:
        said = f"{answer.status} {answer.text(200)}"
        print(f"{command}: the disk guard was not asked ({gateway}: {said})", file=sys.stderr)
        return ""
    return str(answer.object().get("seed", {}).get("paused", ""))


async def _plan(args: argparse.Namespace) -> int:
    said = args.command  # the command as it was typed: ppf seed plan, or ppf import proxies
    if args.size < 1:
        print(f"{said}: --size must be at least 1", file=sys.stderr)
        return 2
    try:
        data = await _read(args.input)
    except (OSError, aiohttp.ClientError) as exc:
        print(f"{said}: cannot read {args.input}: {exc}", file=sys.stderr)
        return 1
    if not items_of(data):
        print(f"{said}: {args.input} has no items", file=sys.stderr)
        return 2
    paused = await _paused(args.gateway, said)
    if paused:
        print(f"{said}: bulk imports are paused: {paused}", file=sys.stderr)
        return 3
    lg = await Log.connect(args.nats, name="ppf-seed")
    try:
        await lg.ensure_stream()
        event, new = await plan(lg, data, args.kind, args.size, args.priority)
    finally:
        await lg.close()
    if event is None:
        print(json.dumps({"plan": plan_id(hashlib.sha256(data).hexdigest()), "new_ranges": 0}))
        return 0
    items = sum(end - start + 1 for _, start, end in event.ranges)
    print(json.dumps({"plan": event.plan, "input": event.input, "items": items, "new_ranges": new}))
    return 0


async def _status(args: argparse.Namespace) -> int:
    async with aiohttp.ClientSession() as http:
        answer = await GatewayApi(http, args.gateway).stats()
    if answer.status == 0:
        print(f"ppf seed status: {args.gateway}: {answer.text(200)}", file=sys.stderr)
        return 1
    stats = answer.object()
    seed = stats.get("seed", {})
    if args.json:
        print(json.dumps(seed))
        return 0
    for name, p in seed.get("plans", {}).items():
        r = p["ranges"]
        print(
            f"{name} {p['kind']} priority {p['priority']}: {p['reached']}/{p['items']} items; "
            f"ranges {r['done']} done, {r['working']} working, {r['waiting']} waiting, "
            f"{r['failed']} failed"
        )
    for node, n in seed.get("nodes", {}).items():
        print(f"  node {node}: {n['batches']} batches, {n['items']} items")
    for f in seed.get("failed_ranges", []):
        print(f"  failed {f['range']} after {f['attempts']} attempts: {f['error']}")
    d = seed.get("deposits", {})
    print(f"deposits: {d.get('folded', 0)} folded, {d.get('pending', 0)} pending, "
          f"{d.get('poisoned', 0)} poisoned")  # fmt: skip
    for p in seed.get("poisoned", []):
        print(f"  poisoned {p['key']} ({p['agent']}): {p['reason']}")
    for key, why in seed.get("unreadable_inputs", {}).items():
        print(f"  input {key} unreadable: {why}")
    if seed.get("paused"):
        print(f"paused: {seed['paused']}")
    return 0
