"""``ppf mcp``: the pool as tools for AI agents, over the Model Context Protocol.

On the official SDK (the optional extra ``ppf[mcp]``). Over stdio by default; over
streamable HTTP only with ``--listen``, on loopback unless an address is given, and only
to a caller that shows the bearer token in ``PPF_MCP_TOKEN``. It is a consumer of one
gateway (``PPF_GATEWAY``, its token in ``PPF_TOKEN``) and fetches through the rotating
endpoint (``PPF_ENDPOINT``, ``ppf serve``'s address). Four tools:

- ``get_proxies``: ``GET /v1/proxies`` with every filter it has, ``works_on`` included.
- ``check_proxies``: each proxy checked from this machine as ppf's agents check it, step
  by step (``ppf check --explain``), progress after each; an address that cannot be a
  public proxy is refused, as is an HTTPS target that cannot be a public host.
- ``fetch_url``: one GET through the endpoint (a new proxy on each try, at most
  ``FETCH_TRIES``), redirects followed by hand with every hop held to the address rule
  (``agents/fetch.py``: loopback, private, link-local and internal names refused),
  at most ``max_bytes``, as readable text (trafilatura) or the raw HTML.
- ``report_proxy``: a consumer's word on a proxy (``POST /v1/proxies/{addr}/report``),
  with the site that turned it away.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from agents.explain import parse_targets
from agents.fetch import Fetcher, refusal
from events.address import proxy_address_ok
from gatewayapi import Answer, GatewayApi

__all__ = ["FETCH_TRIES", "McpConfig", "make_server", "serve_http", "serve_stdio"]

FETCH_TRIES = 3  # each through a new proxy of the endpoint's choosing
FETCH_MAX_BYTES = 2 * 1024 * 1024
CHECK_MAX = 20  # proxies one check_proxies call takes
MAX_LIMIT = 1_000  # proxies one get_proxies call answers (a model reads each)


class McpConfig:
    """Where the tools go, from the environment: a gateway and its consumer token, the
    rotating endpoint, and whether lab addresses are allowed (``--lab``)."""

    def __init__(self, gateway: str, token: str, endpoint: str, lab: bool = False) -> None:
        self.gateway = gateway.rstrip("/")
        self.token = token
        self.endpoint = endpoint
        self.lab = lab

    @classmethod
    def from_env(cls, lab: bool = False) -> McpConfig:
        missing = [n for n in ("PPF_GATEWAY", "PPF_TOKEN") if not os.environ.get(n)]
        if missing:
            raise ValueError(f"set {' and '.join(missing)} (a gateway and a consumer token)")
        return cls(
            os.environ["PPF_GATEWAY"],
            os.environ["PPF_TOKEN"],
            os.environ.get("PPF_ENDPOINT", ""),
            lab,
        )

    def upstream(self, name: str) -> str:
        """The endpoint as a proxy URL: the consumer's name and token its login."""
        host = self.endpoint.removeprefix("http://")
        return f"http://{quote(name, safe='')}:{quote(self.token, safe='')}@{host}"


def make_server(config: McpConfig) -> MCPServer:
    server = MCPServer(
        name="ppf",
        instructions="Open proxies the ppf fleet has checked, a page fetched through them, "
        "and a word back on a proxy that failed you.",
    )
    me: dict[str, Any] = {}  # the consumer's name and judge key, asked of the gateway once

    async def gateway(ask: Callable[[GatewayApi], Awaitable[Answer]]) -> dict[str, Any]:
        """The gateway's JSON answer to ``ask``; a ToolError saying why when there is none."""
        async with aiohttp.ClientSession() as http:
            answer = await ask(GatewayApi(http, config.gateway, token=config.token))
        if answer.status == 0:
            raise ToolError(f"the gateway at {config.gateway} gave no answer: {answer.text()}")
        body = answer.json()
        if answer.status != 200 or not isinstance(body, dict):
            detail = body.get("detail", body) if isinstance(body, dict) else body
            raise ToolError(f"the gateway said {answer.status}: {detail}")
        return body

    async def whoami() -> dict[str, Any]:
        if not me:
            me.update(await gateway(lambda api: api.me()))
        return me

    async def consumer_name() -> str:
        return str((await whoami())["name"])

    @server.tool(
        description="Working open proxies from the ppf pool, filtered. Costs one query of "
        "the gateway. Free proxies come and go within minutes: what is served was alive at "
        "its last check, not a promise it answers now. works_on: sites each proxy got "
        "through to lately (site keys such as google.com). status: alive (served), "
        "suspect, unconfirmed, stale, dead or all; mitm: false (left out: they tamper "
        "with pages), true or any. min_uptime: percent of the last 7 days' known time up; "
        "stable_for_s: working without a break this long; min_speed_kb_s: a download "
        "measured from a ppf agent's vantage, not yours; datacenter: true or false by its "
        "network's name (ppf's list of hosting networks). The gateway refuses other values, "
        "saying why."
    )
    async def get_proxies(
        proto: Literal["http", "https", "socks4", "socks5"] | None = None,
        countries: list[str] | None = None,
        anonymity: Literal["elite", "anonymous", "transparent"] | None = None,
        https: bool | None = None,
        max_latency_ms: int | None = None,
        fresh_s: int | None = None,
        works_on: list[str] | None = None,
        asn: int | None = None,
        as_org: str | None = None,
        status: str = "alive",
        mitm: str = "false",
        min_uptime: int | None = None,
        stable_for_s: int | None = None,
        min_speed_kb_s: int | None = None,
        datacenter: bool | None = None,
        sort: Literal["latency", "last_seen"] = "latency",
        limit: int = 20,
    ) -> dict[str, Any]:
        if not 1 <= limit <= MAX_LIMIT:  # a model reads every row; limit=0 is the whole pool
            raise ToolError(f"limit: 1 to {MAX_LIMIT}, not {limit}")
        params = {
            "limit": limit,
            "sort": sort,
            "status": status,
            "mitm": mitm,
            "proto": proto,
            "country": ",".join(countries) if countries else None,
            "anonymity": anonymity,
            "https": https,
            "max_latency_ms": max_latency_ms,
            "fresh_s": fresh_s,
            "works_on": ",".join(works_on) if works_on else None,
            "asn": asn,
            "as_org": as_org,
            "min_uptime": min_uptime,
            "stable_for_s": stable_for_s,
            "min_speed_kb_s": min_speed_kb_s,
            "datacenter": datacenter,
        }
        return await gateway(lambda api: api.proxies(**params))

    @server.tool(
        description="Check open proxies from this machine, as ppf's agents do, and say "
        f"each step (judge, connect, exit, anonymity, tampering, HTTPS). At most {CHECK_MAX} "
        "a call; each takes up to its timeout. A pass says the proxy worked from here now; "
        "it may fail from elsewhere or a minute later. Addresses that cannot be public "
        "proxies are refused."
    )
    async def check_proxies(
        addresses: list[str], ctx: Context, https_target: str | None = None, timeout_s: float = 10
    ) -> list[dict[str, Any]]:
        from agents.explain import explain
        from agents.judgepool import JudgePool

        try:
            targets = parse_targets(addresses[:CHECK_MAX], None)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc
        refused = [
            f"{ip}:{port}"
            for ip, port, _ in targets
            if not proxy_address_ok(ip, port, lab=config.lab)
        ]
        if refused:
            raise ToolError(f"not public proxy addresses: {', '.join(refused)}")
        if https_target is not None:
            _public_url(https_target, config.lab)
        # The gateway's judge answers only nonces minted under an enrolled name's key: the
        # consumer's own, which the gateway gives it (without, every check was its 403).
        who = await whoami()
        key = bytes.fromhex(str(who.get("judge_key") or ""))
        own = [config.gateway + "/judge"]
        pool = JudgePool(own, own=own, agent=str(who["name"]), key=key)
        try:
            await pool.start(require=True)
        except ValueError as exc:  # no judge answers
            raise ToolError(f"cannot check from here: {exc}") from exc
        out = []
        try:
            for done, (ip, port, proto) in enumerate(targets, 1):
                https = [https_target] if https_target else []
                steps = await explain(ip, port, proto, pool, https, min(timeout_s, 30))
                out.append(
                    {
                        "addr": f"{ip}:{port}",
                        "verdict": steps[-1][1],
                        "steps": [{"step": a, "outcome": b, "why": c} for a, b, c in steps],
                    }
                )
                await ctx.report_progress(done, len(targets), f"{ip}:{port}: {steps[-1][1]}")
        finally:
            await pool.stop()
        return out

    @server.tool(
        description="Fetch one web page with GET through the ppf rotating endpoint: the "
        f"site sees a proxy's exit, not you. Up to {FETCH_TRIES} tries, each through "
        "another proxy; redirects followed, each checked; local, private and internal "
        "addresses and names refused. At most max_bytes (2 MiB). Readable text by default "
        "(as_text=false: the raw HTML). Free proxies are slow and some alter pages: the "
        "answer is what the exit received."
    )
    async def fetch_url(
        url: str, as_text: bool = True, max_bytes: int = FETCH_MAX_BYTES
    ) -> dict[str, Any]:
        if not config.endpoint:
            raise ToolError("no endpoint: set PPF_ENDPOINT to ppf serve's address")
        _public_url(url, config.lab)
        cap = max(1, min(max_bytes, FETCH_MAX_BYTES))
        errors = []
        async with Fetcher(
            upstream=config.upstream(await consumer_name()),
            lab=config.lab,
            timeout_s=30,
            max_bytes=cap,
            forward=True,
        ) as fetcher:
            for _ in range(FETCH_TRIES):
                result = await fetcher.fetch(url)
                if result.ok:
                    html = result.body.decode("utf-8", "replace")
                    return {
                        "url": url,
                        "status": result.status,
                        "text": _readable(html) if as_text else html,
                    }
                if result.error.startswith(("refused", "not an http")) or result.status in (
                    404,
                    410,
                ):
                    raise ToolError(result.error)
                errors.append(result.error)
        raise ToolError(f"no try got the page: {'; '.join(errors)}")

    @server.tool(
        description="Tell the fleet a proxy it served failed you (outcome=failed), or "
        "worked; with site, the site that turned it away. Within your token's hourly "
        "budget; it moves the proxy up the checkers' queue and out of what you are "
        "served, and counts toward others only within a share."
    )
    async def report_proxy(
        address: str,
        outcome: Literal["failed", "worked"],
        site: str | None = None,
        detail: str = "",
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"outcome": "blocked" if site else outcome, "detail": detail[:200]}
        if site:
            body["site"] = site
        return await gateway(lambda api: api.report(address, body))

    _refuse_unknown_arguments(server)
    return server


def _refuse_unknown_arguments(server: MCPServer) -> None:
    """A tool's argument it does not take is its error, naming it, as the HTTP API's 400
    names a parameter it does not take: the SDK drops such an argument unsaid, so a
    misspelt filter (``min_uptme``) would answer the whole pool. The names are each
    tool's own parameters, read from the schema the SDK made of it."""
    takes: dict[str, frozenset[str]] = {}
    call_tool = server.call_tool

    async def checked(name: str, arguments: dict[str, Any], context: Any) -> Any:
        if not takes:
            for tool in await server.list_tools():
                takes[tool.name] = frozenset(tool.input_schema.get("properties", {}))
        unknown = sorted(set(arguments) - takes.get(name, frozenset(arguments)))
        if unknown:
            known = ", ".join(sorted(takes[name]))
            raise ToolError(f"{name} takes no {', '.join(unknown)} (it takes {known})")
        return await call_tool(name, arguments, context)

    server.call_tool = checked  # type: ignore[method-assign,assignment]


def _public_url(url: str, lab: bool) -> None:
    """ToolError for a URL the fetcher would refuse through an upstream (agents/fetch.py
    ``refusal``), before anything is asked of the gateway or the endpoint."""
    why = refusal(url, lab=lab, upstream=True)
    if why:
        raise ToolError(why)


def _readable(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_links=False) or ""


async def serve_stdio(config: McpConfig) -> None:
    await make_server(config).run_stdio_async()


async def serve_http(config: McpConfig, host: str, port: int, bearer: str) -> None:
    """Streamable HTTP at ``/mcp``, for callers that show ``bearer``."""
    import uvicorn

    app = _Bearer(make_server(config).streamable_http_app(host=host), bearer)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    await server.serve()


class _Bearer:
    """ASGI: 401 for an HTTP request without ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            shown = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(shown, self.expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b"a bearer token is needed\n"})
                return
        await self.app(scope, receive, send)
