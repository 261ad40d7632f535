"""``ppf mcp``: the pool's tools for AI agents over the Model Context Protocol
(``ops/mcp.py``), on stdio, or on streamable HTTP behind a bearer token."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mc = sub.add_parser(
        "mcp",
        help="an MCP server of the pool (get, check, fetch, report); needs ppf[mcp]",
        description="Speaks to PPF_GATEWAY with the consumer token PPF_TOKEN, and "
        "fetches through the rotating endpoint PPF_ENDPOINT (host:port).",
    )
    mc.add_argument(
        "--listen",
        default=None,
        metavar="[HOST:]PORT",
        help="streamable HTTP at /mcp instead of stdio (HOST: 127.0.0.1 unless given); "
        "callers show PPF_MCP_TOKEN as a bearer token",
    )
    mc.add_argument("--lab", action="store_true", help="allow loopback and private addresses")
    mc.set_defaults(run=_run)


async def _run(args: argparse.Namespace) -> int:
    try:
        from ops.mcp import McpConfig, serve_http, serve_stdio
    except ImportError as exc:
        print(f"ppf mcp: {exc.name} is missing: pip install 'ppf[mcp]'", file=sys.stderr)
        return 2
    try:
        config = McpConfig.from_env(lab=args.lab)
    except ValueError as exc:
        print(f"ppf mcp: {exc}", file=sys.stderr)
        return 2
    if args.listen is None:
        await serve_stdio(config)
        return 0
    host, _, port = args.listen.rpartition(":")
    bearer = os.environ.get("PPF_MCP_TOKEN", "")
    if not port.isdigit() or not bearer:
        why = "--listen [HOST:]PORT" if not port.isdigit() else "set PPF_MCP_TOKEN"
        print(f"ppf mcp: {why}", file=sys.stderr)
        return 2
    await serve_http(config, host.strip("[]") or "127.0.0.1", int(port), bearer)
    return 0
