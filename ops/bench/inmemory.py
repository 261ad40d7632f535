"""The synthetic stream folded from memory, for counting instructions under callgrind.

Why: runs of the fold differ by 5-10 % on this machine, as much as what issue 10's bar
measures (``Located`` adds < 5 %). Instructions hardly do: callgrind's counts for the
same work move only with the hash seed (±0.2 %, so it is fixed), and two streams' counts,
taken one after the other, compare closely:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --toggle-collect=fold_batch \\
        python -m ops.bench.inmemory plain 200000
    PYTHONHASHSEED=0 valgrind --tool=callgrind --toggle-collect=fold_batch \\
        python -m ops.bench.inmemory located 200000

(``fold_batch`` is Folder.apply's loop in C: everything folding a batch does, without
building the messages.) No server and no file: what is counted is decode, admission and
the reducers. Both streams have one timeline: a message's time follows the count of the
events before it that are not ``Located``, so a ``Located`` has its confirmation's time
and every other event the same time in both streams (the reducers act on times: buckets
of the composition, quota windows), as ``publish_paired`` gives the bench's servers.
"""

from __future__ import annotations

import gc
import sys

from events import Located, encode
from ops.bench import synthetic
from ops.collector import for_folding
from projections.folder import Folder
from projections.log import Message
from reducers import State

__all__ = ["fold_in_memory", "messages"]

T0 = 1_790_000_000_000
STEP_US = 71  # between two events: 1,000,000 of them span 71 s, as a fast publisher's


def messages(n: int, located: bool, proxies: int | None = None) -> list[Message]:
    """The synthetic stream of ``n`` events (plus one ``Located`` per distinct proxy
    when ``located``) as the log holds it, on one timeline."""
    out: list[Message] = []
    shared = 0
    stream = synthetic.events(
        n, proxies=proxies or max(n // 10, 1), sources=max(n // 100, 1), located=located
    )
    for seq, event in enumerate(stream, 1):
        shared += not isinstance(event, Located)
        subject, _ = synthetic.route(event)
        out.append((seq, T0 + shared * STEP_US // 1000, subject.encode(), encode(event)))
    return out


def fold_in_memory(batch: list[Message], size: int = 2_000) -> State:
    """Fold ``batch`` through Folder.apply in batches of ``size``, as replay does."""
    folder = Folder(State())
    for start in range(0, len(batch), size):
        folder.apply(batch[start : start + size])
    return folder.state


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] in ("plain", "located"):
    for_folding()
    stream = messages(int(sys.argv[2]), located=sys.argv[1] == "located")
    gc.collect()
    state = fold_in_memory(stream)
    print(f"{sys.argv[1]}: folded {state.last_seq} of {len(stream)} messages", file=sys.stderr)
    sys.exit(0 if state.last_seq == len(stream) else 1)
