"""``ppf check --explain``: one proxy's check, step by step, each with its outcome.

The check is the agents' own (``agents.check.check``, which records its steps as it
takes them); what it found is then told step by step: the exit address, the anonymity,
whether the page or the certificate was tampered with, and whether it carried HTTPS
(``agents/https.py``). Outcomes: ``passed``, ``failed``, ``unavailable`` (a judge or
target that did not answer us directly either: never the proxy's failure) and
``skipped`` (a step that an earlier failure made moot).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from agents.check import Judge, Judges, Step, check
from agents.extract import PROTOS
from agents.https import tunnels_https

__all__ = ["explain", "parse_targets"]


async def explain(
    ip: str,
    port: int,
    proto: str | None,
    judges: Judge | Judges,
    https: Sequence[str] = (),
    timeout: float = 10.0,
) -> list[Step]:
    steps: list[Step] = []
    chosen = judges if isinstance(judges, Judge) else await judges.acquire(ip)
    if chosen is None:
        return [("judge", "unavailable", "no healthy judge can see this address")]
    judge: Judge = chosen
    steps.append(("judge", "passed", f"{judge.url} answers us directly; we are {judge.own_ip}"))
    began = time.monotonic()
    result = await check(ip, port, proto, judge, timeout, trace=steps)
    if not result.ok:
        if not isinstance(judges, Judge) and not await judges.answers(judge, began):
            steps.append(
                ("verdict", "unavailable", f"{judge.url} stopped answering: not the proxy")
            )
        else:
            steps.append(("verdict", "failed", result.error))
        return steps
    steps.append(("exit address", "passed", f"the judge saw {result.exit_ip}"))
    steps.append(("anonymity", "passed", result.anonymity))
    if result.mitm:
        steps.append(("tampering", "failed", "the page or the certificate was not the judge's"))
    else:
        steps.append(
            (
                "tampering",
                "passed",
                "the judge's own page, signed" if judge.signer else "the judge's own page",
            )
        )
    if not https:
        steps.append(("https", "skipped", "no HTTPS target given"))
    elif result.proto is not None:
        carried = await tunnels_https(ip, port, result.proto, https[0], timeout)
        steps.append(
            (
                "https",
                "passed" if carried else "failed",
                f"a tunnel to {https[0]}" + ("" if carried else " did not answer 2xx"),
            )
        )
    steps.append(("verdict", "passed", f"{result.proto} proxy, {result.latency_ms} ms"))
    return steps


def parse_targets(addrs: list[str], default: str | None) -> list[tuple[str, int, str | None]]:
    """``ip:port`` or ``proto://ip:port`` each; ValueError names the first bad one."""
    targets = []
    for addr in addrs:
        scheme, sep, rest = addr.partition("://")
        proto = PROTOS.get(scheme.lower()) if sep else None
        if sep and proto is None:
            raise ValueError(f"unknown protocol in {addr!r}")
        host, _, port = (rest if sep else addr).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not ip:port or proto://ip:port: {addr!r}")
        targets.append((host.strip("[]"), int(port), proto or default))
    return targets
