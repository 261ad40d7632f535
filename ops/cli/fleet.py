"""``ppf secrets``: the fleet's shared NATS secrets, made once and given to every node and
gateway of a cluster (deploy/README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sc = sub.add_parser("secrets", help="make (or read) the fleet's NATS secrets")
    sc.add_argument("file", help="the auth.json to make or read (mode 0600)")
    sc.set_defaults(run=_secrets)


def _secrets(args: argparse.Namespace) -> int:
    """Print the lines every node's nats.env takes, from ``file`` (made when missing)."""
    from ops.nats.server import fleet_secrets, server_env

    for key, value in server_env(fleet_secrets(Path(args.file))).items():
        print(f"{key}={value}")
    return 0
