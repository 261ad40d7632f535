"""One call of the endpoint's to its gateways, asked of each in turn until one answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import msgspec

from events.wire import AGENT_HEADER

__all__ = ["ask"]


async def ask(
    http: aiohttp.ClientSession | None,
    gateways: Sequence[str],
    method: str,
    path: str,
    token: str,
    body: Any = None,
    *,
    agent: str = "",
) -> tuple[int, dict[str, Any]] | None:
    """``method path`` asked of the first gateway that answers, with ``token``: its
    status and JSON object ({} when it sent none); None when no gateway answered."""
    assert http is not None
    headers = {"Authorization": f"Bearer {token}"}
    if agent:  # a token issued a moment ago is looked up under its name
        headers[AGENT_HEADER] = agent
    for base in gateways:
        try:
            async with http.request(method, base + path, json=body, headers=headers) as r:
                data = await r.read()
                try:
                    decoded = msgspec.json.decode(data) if data else {}
                except msgspec.DecodeError:
                    decoded = {}
                return r.status, decoded if isinstance(decoded, dict) else {}
        except (aiohttp.ClientError, TimeoutError, OSError):
            continue
    return None
