"""The command line explains itself: every flag and argument of every command has a
help text, and a command's errors are said under the name it was typed as."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

from ops.cli import parser


def _unexplained(p: argparse.ArgumentParser, path: str = "ppf") -> list[str]:
    """Flags and arguments without a help text, as ``command flag``."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _unexplained(child, f"{path} {name}")
        elif not action.help:
            found.append(f"{path} {(action.option_strings or [action.dest])[-1]}")
    return found


def test_every_flag_and_argument_of_every_command_says_what_it_is() -> None:
    """``--listen``, ``--nats``, ``--db``, ``--type`` and the rest had no help text; each
    now has its own or the shared one (ops/cli/common.py SHARED_HELP), and each renders
    (its ``%(default)s`` filled in)."""
    root = parser()
    assert _unexplained(root) == []
    for command in (["replay"], ["tail"], ["up"], ["bench", "fold"], ["token", "issue"]):
        sub = root
        for word in command:
            sub = next(
                a for a in sub._actions if isinstance(a, argparse._SubParsersAction)
            ).choices[word]
        assert "%(" not in sub.format_help()


def test_the_help_rule_finds_a_bare_flag() -> None:
    """The rule is not vacuous: a flag added without help is found."""
    p = argparse.ArgumentParser(prog="x")
    sub = p.add_subparsers()
    sub.add_parser("y").add_argument("--bare")
    assert _unexplained(p) == ["ppf y --bare"]


def test_an_import_is_told_apart_from_a_seed_plan_in_its_errors(
    ppf_bin: str, tmp_path: Path
) -> None:
    """``ppf import proxies`` said its errors as "ppf seed plan:"; each command now says
    its own name."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for command in (["import", "proxies"], ["seed", "plan"]):
        out = subprocess.run(
            [ppf_bin, *command, str(empty)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out.stderr
        assert f"ppf {' '.join(command)}: {empty} has no items" in out.stderr


def test_ppf_judges_and_ppf_check_name_the_judges_ppf_up_uses(tmp_path: Path) -> None:
    """``ppf judges`` listed the built-in public judges whatever ran here; without
    ``--judge`` it now names those of the ``ppf up`` beside the data directory, as
    ``ppf check`` checks through them: its own judge first (ppf's), then the public
    list. Given ``--judge``, those alone, each taken as ppf's."""
    from agents.judgepool import BUILTIN_JUDGES
    from ops.cli.judges import judges_in_use

    data = tmp_path / "data"
    data.mkdir()
    args = argparse.Namespace(judge=[], data=str(data))
    assert judges_in_use(args) == (list(BUILTIN_JUDGES), [])  # no ppf up ran here
    (data / "gateway").write_text("http://127.0.0.1:18080\n")
    own = "http://127.0.0.1:18080/judge"
    assert judges_in_use(args) == ([own, *BUILTIN_JUDGES], [own])
    given = argparse.Namespace(judge=["http://judge.example/"], data=str(data))
    assert judges_in_use(given) == (["http://judge.example/"], ["http://judge.example/"])
    judges = next(
        a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["judges"]
    assert "those of the ppf up beside the data directory" in " ".join(judges.format_help().split())


async def test_a_token_is_replaced_only_when_asked_and_only_a_token_held_is_revoked(
    ppf_bin: str, nats_server: Any
) -> None:
    """``ppf token issue`` for a name that has a token replaced it silently (the old one
    then failed everywhere); now it refuses without ``--rotate``. Revoking a name that
    holds none (never issued, or revoked already) reported success; now it is an error.
    Heartbeats on the name's subject do not hide its enrolment."""
    import asyncio

    import events as ev
    from eventlog.client import Log
    from events.mint import fresh_id, now_ms

    async def ppf(*argv: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            ppf_bin, "token", *argv, "--nats", nats_server.url,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, err.decode()

    assert await ppf("issue", "shop", "--role", "consumer") == (0, "")
    lg = await Log.connect(nats_server.url)
    try:
        for _ in range(3):
            await lg.publish(ev.Heartbeat(id=fresh_id(), agent="shop", at=now_ms()))
    finally:
        await lg.close()
    code, said = await ppf("issue", "shop", "--role", "consumer")
    assert code == 2 and "'shop' has a token already: --rotate replaces it" in said
    assert (await ppf("issue", "shop", "--role", "consumer", "--rotate"))[0] == 0
    code, said = await ppf("revoke", "nobody-here")
    assert code == 2 and "'nobody-here' has no token (never issued, or revoked)" in said
    assert (await ppf("revoke", "shop"))[0] == 0
    code, said = await ppf("revoke", "shop")
    assert code == 2 and "has no token" in said
    assert (await ppf("issue", "shop", "--role", "consumer"))[0] == 0  # revoked: free again
