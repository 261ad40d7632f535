"""``ppf completion bash|zsh|fish``: the shell's completion of ppf's commands and flags.

argcomplete reads them from the parsers ppf already has, asked by the shell each time
(the script printed here calls ``ppf`` with argcomplete's environment; ``main`` hands
that call to argcomplete before anything else runs), so no list of ours goes stale.
"""

from __future__ import annotations

import argparse

__all__ = ["complete", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cp = sub.add_parser(
        "completion",
        help='print the shell\'s completion script: eval "$(ppf completion bash)"',
    )
    cp.add_argument("shell", choices=("bash", "zsh", "fish"))
    cp.set_defaults(run=_print)


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's ask for completions and exit (argcomplete's environment
    says it asks); nothing otherwise."""
    import argcomplete

    argcomplete.autocomplete(parser)


def _print(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    print(shellcode(["ppf"], shell=args.shell), end="")
    return 0
