"""``ppf snapshot``, and the snapshot options of ``ppf up``, ``ppf fold`` and ``ppf gateway``
(projections/snapshot_policy.py says what they mean)."""

from __future__ import annotations

import argparse
import json
import sys

from eventlog.client import Log
from ops.cli.common import DEFAULT_NATS
from projections.snapshot_policy import SnapshotPolicy, Snapshots

__all__ = ["register", "snapshot_options", "snapshots_for"]


def snapshot_options(parser: argparse.ArgumentParser, *, every: int, trim: bool) -> None:
    """``every``: messages between the snapshots this process takes (0: it takes none,
    and only starts from them); ``trim``: whether it trims the log behind them."""
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=every,
        metavar="MESSAGES",
        help=f"take a snapshot every MESSAGES folded messages (0: none; default {every:,})",
    )
    parser.add_argument(
        "--snapshot-every-s",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="and at least every SECONDS while the fold moves (default 600)",
    )
    _keep_and_trim(parser, trim)
    parser.add_argument(
        "--no-snapshots",
        action="store_true",
        help="neither start from snapshots nor take any (fold from the checkpoint or seq 1)",
    )


def _keep_and_trim(parser: argparse.ArgumentParser, trim: bool) -> None:
    parser.add_argument("--keep-snapshots", type=int, default=3, metavar="N")
    parser.add_argument(
        "--trim-log",
        action=argparse.BooleanOptionalAction,
        default=trim,
        help="purge the log below the oldest snapshot kept"
        + (" (default: on)" if trim else " (default: off)"),
    )


def snapshots_for(lg: Log, args: argparse.Namespace | None) -> Snapshots | None:
    """The snapshots of a fold, as its command line says (None: ``--no-snapshots``)."""
    if args is None or not hasattr(args, "snapshot_every"):
        return Snapshots(lg.snapshots)  # starts from them, takes none
    if args.no_snapshots:
        return None
    if args.snapshot_every <= 0:
        return Snapshots(lg.snapshots)
    policy = SnapshotPolicy(
        every_messages=args.snapshot_every,
        every_s=args.snapshot_every_s,
        keep=max(1, args.keep_snapshots),
        trim=args.trim_log,
    )
    return Snapshots(lg.snapshots, policy)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sn = sub.add_parser("snapshot", help="take a snapshot of the state at the log's head now")
    sn.add_argument("--nats", default=DEFAULT_NATS)
    _keep_and_trim(sn, False)
    sn.set_defaults(run=_snapshot)


async def _snapshot(args: argparse.Namespace) -> int:
    """From the newest snapshot (or sequence 1), fold to the head, take one there."""
    from eventlog.protocol import GapError
    from ops.collector import for_folding
    from projections import digest
    from projections.live import FoldService

    for_folding()
    lg = await Log.connect(args.nats, name="ppf-snapshot")
    policy = SnapshotPolicy(
        every_messages=1 << 62, keep=max(1, args.keep_snapshots), trim=args.trim_log
    )
    fold = FoldService(lg, dlq=False, snapshots=Snapshots(lg.snapshots, policy))
    try:
        await fold.start()
    except GapError as exc:
        print(f"ppf snapshot: {exc}", file=sys.stderr)
        await lg.close()
        return 1
    try:
        head = await lg.head_seq()
        if not await fold.wait_for(head, 3600):
            print(f"ppf snapshot: not caught up with seq {head} within an hour", file=sys.stderr)
            return 1
        seq = await fold.snapshot_now()
        kept = fold.snapshots.kept if fold.snapshots is not None else []
        print(json.dumps({"seq": seq, "digest": digest(fold.state), "kept": kept}))
        return 0
    finally:
        await fold.stop()
        await lg.close()
