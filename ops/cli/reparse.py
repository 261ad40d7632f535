"""``ppf reparse [--since SEQ]``: the current extractor over the raw pages workers
deposited, fetching nothing.

The log says which pages there are (``Deposited`` of ``page/<sha256>``, folded: read
back as recorded) and which sources they came from (``Extracted`` names the source and
the page's hash). Each page is read by key, checked against the log's digest, and
extracted again; a new ``Extracted`` per source that served it, tagged with the
extractor's version, with an id fixed by (version, source, page), so running reparse
twice publishes each once while the stream's duplicate window holds. Candidates the
pool does not know are planned as a range for seed nodes (``ppf seed plan``), so they
are checked like any others, by whoever the fleet has.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from hashlib import sha256

from agents.extract import EXTRACTOR, extract
from eventlog.client import Log
from eventlog.protocol import DepositError
from events import Extracted, decode
from events.keys import plan_id
from events.mint import now_ms
from ops.cli.common import DEFAULT_NATS
from ops.cli.seed import plan
from projections.folder import Folder
from reducers import State

__all__ = ["Reparsed", "register", "reparse"]

AGENT = "reparse"  # the agent name on what it publishes (a service writer, like the fold)
MAX_CANDIDATES_IN_EVENT = 1_000  # as a worker's Extracted (agents/worker.py)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = sub.add_parser("reparse", help="extract again from deposited raw pages, fetching nothing")
    rp.add_argument("--since", type=int, default=1, help="pages deposited at or after this seq")
    rp.add_argument("--size", type=int, default=500, help="items a range of the new candidates")
    rp.add_argument("--priority", type=int, default=0, help="of the plan of new candidates")
    rp.add_argument("--lab", action="store_true", help="keep loopback and private addresses")
    rp.add_argument("--nats", default=DEFAULT_NATS)
    rp.set_defaults(run=_reparse)


@dataclass
class Reparsed:
    pages: int = 0  # deposited raw pages since the seq asked
    gone: int = 0  # deleted by retention
    unreadable: dict[str, str] = field(default_factory=dict)  # key -> why
    unsourced: int = 0  # pages no Extracted names (announced, never extracted from)
    extracted: int = 0  # Extracted events published
    candidates: int = 0  # distinct candidates found
    new: int = 0  # of them, unknown to the pool
    plan: str = ""  # the plan they went into

    def as_dict(self) -> dict[str, object]:
        return {
            "extractor": EXTRACTOR,
            "pages": self.pages,
            "gone": self.gone,
            "unreadable": self.unreadable,
            "unsourced": self.unsourced,
            "extracted": self.extracted,
            "candidates": self.candidates,
            "new": self.new,
            "plan": self.plan,
        }


def _event_id(url_id: str, page_sha256: str) -> str:
    """Fixed by (extractor version, source, page): a second run publishes duplicates."""
    return "reparse:" + sha256(f"{EXTRACTOR}|{url_id}|{page_sha256}".encode()).hexdigest()[:32]


async def reparse(
    lg: Log, since: int = 1, *, size: int = 500, priority: int = 0, lab: bool = False
) -> Reparsed:
    """Fold the log to its head, then extract again from each page deposited since
    ``since``; see the module's docstring."""
    head = await lg.head_seq()
    state = State()
    folder = Folder(state)
    served: dict[str, set[str]] = {}  # page hash -> sources it was extracted from
    async for batch in lg.read(1, until=head):
        folder.apply(batch)
        for _, _, _, payload in batch:
            if b"Extracted" not in payload:
                continue  # cheap: most events are not
            try:
                event = decode(payload)
            except Exception:  # the fold counted it; nothing to learn here
                continue
            if isinstance(event, Extracted) and event.content_hash:
                served.setdefault(event.content_hash, set()).add(event.url_id)
    out = Reparsed()
    found: dict[tuple[str, int], str] = {}
    for key in sorted(state.deposits):
        row = state.deposits[key]
        if not key.startswith("page/") or row.seq < since or row.status != "folded":
            continue
        out.pages += 1
        sources = served.get(row.sha256)
        if not sources:
            out.unsourced += 1
            continue
        try:
            data = await lg.deposits.get(key, row.sha256)
        except DepositError as exc:
            if exc.reason == "missing":
                out.gone += 1  # retention deleted it (projections/retention.py)
            else:  # not what the log recorded, or the store failed: said, and exit 1
                out.unreadable[key] = f"{exc.reason}: {exc}"
            continue
        hint = None
        for uid in sorted(sources):
            src = state.sources.get(uid)
            hint = hint or (src.proto_hint if src is not None else None) or None
        candidates = extract(data, hint, lab=lab)
        for c in candidates:
            found.setdefault((c.ip, c.port), c.proto or "")
        events = [
            Extracted(
                id=_event_id(uid, row.sha256),
                agent=AGENT,
                at=now_ms(),
                url_id=uid,
                content_hash=row.sha256,
                count=len(candidates),
                extractor=EXTRACTOR,
                candidates=[
                    (c.ip, c.port, c.proto or "", c.confidence)
                    for c in candidates[:MAX_CANDIDATES_IN_EVENT]
                ],
            )
            for uid in sorted(sources)
        ]
        await lg.publish_many(events)
        out.extracted += len(events)
    out.candidates = len(found)
    new = sorted(addr for addr in found if addr not in state.proxies)
    out.new = len(new)
    if new:
        lines = [f"{found[a]}://{a[0]}:{a[1]}" if found[a] else f"{a[0]}:{a[1]}" for a in new]
        data = ("\n".join(lines) + "\n").encode()
        planned, _ = await plan(lg, data, "proxies", size, priority)
        out.plan = planned.plan if planned is not None else plan_id(sha256(data).hexdigest())
    return out


async def _reparse(args: argparse.Namespace) -> int:
    if args.size < 1 or args.since < 1:
        print("ppf reparse: --size and --since must be at least 1", file=sys.stderr)
        return 2
    lg = await Log.connect(args.nats, name="ppf-reparse")
    try:
        await lg.ensure_stream()
        done = await reparse(lg, args.since, size=args.size, priority=args.priority, lab=args.lab)
    finally:
        await lg.close()
    print(json.dumps(done.as_dict()))
    return 1 if done.unreadable else 0
