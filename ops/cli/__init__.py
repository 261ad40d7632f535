"""``ppf``: the command line (docs/architecture.md §9).

One module per command group, each registering its own subcommands with the function
that runs them (``set_defaults(run=...)``); ``main`` only parses, sets up logging and
credentials, and turns the errors every command shares into exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from eventlog.client import LogError
from ops.cli import (
    admin,
    agent,
    bench,
    checks,
    completion,
    doctor,
    endpoint,
    fleet,
    history,
    judges,
    lab,
    mcp,
    reparse,
    seed,
    serve,
    snapshots,
)
from ops.cli.admin import enroll
from ops.cli.common import SHARED_HELP, CommandError, data_dir, unsaid, watched_exit
from ops.telemetry import logs

__all__ = ["enroll", "main"]

GROUPS = (
    serve,
    endpoint,
    history,
    snapshots,
    fleet,
    admin,
    agent,
    checks,
    seed,
    reparse,
    judges,
    lab,
    bench,
    completion,
    mcp,
    doctor,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppf", description="open proxy discovery fleet")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in GROUPS:
        group.register(sub)
    _tls_beside_nats(p)
    _explain(p)
    return p


def _explain(p: argparse.ArgumentParser) -> None:
    """Each flag and argument a command declares without help takes its shared meaning
    (``SHARED_HELP``); tests/test_cli_help.py holds that none is left without one."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _explain(child)
        elif action.help is None:
            names = action.option_strings or [action.dest]
            action.help = next((SHARED_HELP[n] for n in names if n in SHARED_HELP), None)


def _tls_beside_nats(p: argparse.ArgumentParser) -> None:
    """Every command that takes ``--nats`` takes the TLS files beside it (the one place
    they are added; ``main`` hands them on as ``PPF_NATS_CA``/``_CERT``/``_KEY``, which
    ``Log.connect`` reads, so agents and every connection of the process use them)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _tls_beside_nats(child)
    if "--nats" in p._option_string_actions and "--nats-ca" not in p._option_string_actions:
        p.add_argument("--nats-ca", metavar="FILE", help="the CA of the NATS servers (tls://)")
        p.add_argument("--nats-cert", metavar="FILE", help="this client's certificate")
        p.add_argument("--nats-key", metavar="FILE", help="its key")


def _loop_runner(args: argparse.Namespace) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``asyncio.run``, or uvloop's for a command that asks for it (``ppf serve``) where
    uvloop is installed (it is not on Windows)."""
    if getattr(args, "uvloop", False):
        try:
            import uvloop
        except ImportError:
            return asyncio.run
        return uvloop.run
    return asyncio.run


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (ppf completion)
        completion.complete(p)
    args = p.parse_args(argv)
    logs.configure(getattr(args, "log_level", logging.INFO))  # a command may ask for less
    for flag in ("ca", "cert", "key"):
        if getattr(args, f"nats_{flag}", None):
            os.environ[f"PPF_NATS_{flag.upper()}"] = getattr(args, f"nats_{flag}")
    if getattr(args, "nats", None) and args.cmd != "agent":  # agents use their role's user
        from ops.nats.server import local_address, with_credentials

        store = data_dir(args) / "nats"
        if unsaid(args.nats):  # not given: where the data dir's own server listens
            args.nats = local_address(store) or str(args.nats)
        args.nats = with_credentials(args.nats, store)
    try:
        result = args.run(args)
        if not inspect.iscoroutine(result):
            return int(result)
        # The process's exit is watched only where ppf is the process (its argv its own):
        # a caller that hands main() its arguments keeps its process.
        work = watched_exit(result) if argv is None else result
        return int(_loop_runner(args)(work))
    except (LogError, CommandError) as exc:
        print(f"ppf {args.cmd}: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C (ops/cli/common.py StopSignals)
        return 130
    except BrokenPipeError:  # `ppf extract big.txt | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
