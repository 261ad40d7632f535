"""The OpenAPI document, built from the wire types (``events/wire.py``).

Handlers decode requests with those types and encode responses with them, so the
document cannot drift from what is served.
"""

from __future__ import annotations

from typing import Any

import msgspec

from events import AnyEvent, wire
from gateway.queries import PROXY_PARAMS, WORKS_ON

__all__ = ["openapi"]

_AUTH: list[dict[str, list[str]]] = [{"bearer": []}]


def _body(ref: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _reply(ref: str | None, description: str = "OK", media: str = "application/json") -> Any:
    schema = {"$ref": f"#/components/schemas/{ref}"} if ref else {"type": "object"}
    return {"description": description, "content": {media: {"schema": schema}}}


def _problems(*codes: int) -> dict[str, Any]:
    return {str(code): _reply("Problem", "problem", "application/problem+json") for code in codes}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _dropin() -> dict[str, Any]:
    """jhao104/proxy_pool's calls and Python3WebSpider's /random (gateway/dropin.py)."""
    kind = [_query("type", {"type": "string"}), WORKS_ON.openapi()]
    paths: dict[str, Any] = {}
    for path, summary, params, media in (
        ("/get", "a random HTTP proxy, in proxy_pool's shape", kind, "application/json"),
        ("/pop", "as /get (an exclusive checkout is POST /v1/checkout)", kind, "application/json"),
        ("/all", "every served HTTP proxy, in proxy_pool's shape", kind, "application/json"),
        ("/count", "counts, in proxy_pool's shape", [], "application/json"),
        (
            "/delete",
            "a report without a token (moves the proxy up the checkers' queue)",
            [{"name": "proxy", "in": "query", "required": True, "schema": {"type": "string"}}],
            "application/json",
        ),
    ):
        shape = {"type": "array"} if path == "/all" else {"type": "object"}
        ok = {"description": "OK", "content": {media: {"schema": shape}}}
        op = {
            "get": {
                "summary": summary,
                "parameters": params,
                "responses": {"200": ok, **_problems(400, 401, 403, 404, 429)},
            }
        }
        paths[path] = paths[path + "/"] = op
    paths["/random"] = {
        "get": {
            "summary": "a random HTTP proxy as ip:port (Python3WebSpider ProxyPool)",
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_problems(401, 404),
            },
        }
    }
    return paths


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document (committed as schemas/openapi.json)."""
    types = [
        wire.LeaseRequest,
        wire.LeasesReply,
        wire.HeartbeatReply,
        wire.ReleaseRequest,
        wire.ReleaseReply,
        wire.ReportRequest,
        wire.ReportReply,
        wire.EventsRequest,
        wire.EventsAccepted,
        wire.SourcesRequest,
        wire.SourcesAdded,
        wire.AgentMe,
        wire.CheckoutRequest,
        wire.CheckoutReply,
        wire.CheckoutRelease,
        wire.EndpointFigures,
        wire.Problem,
    ]
    (event_schema, *_), components = msgspec.json.schema_components(
        [AnyEvent, *types], ref_template="#/components/schemas/{name}"
    )
    # The events of a batch are the event union (decoded one by one, so a bad one can be
    # named by its index); say so in the document rather than "any value".
    components["EventsRequest"]["properties"]["events"]["items"] = event_schema
    lease_path = {"name": "lease", "in": "path", "required": True, "schema": {"type": "string"}}
    proxy_filters = [p.openapi() for p in PROXY_PARAMS]
    paths: dict[str, Any] = {
        "/v1/events": {
            "post": {
                "summary": "publish a batch of observations",
                "security": _AUTH,
                "requestBody": _body("EventsRequest"),
                "responses": {
                    "200": _reply("EventsAccepted"),
                    **_problems(400, 401, 403, 413, 429, 503),
                },
            }
        },
        "/v1/leases": {
            "post": {
                "summary": "lease the top due targets of a kind",
                "security": _AUTH,
                "requestBody": _body("LeaseRequest"),
                "responses": {
                    "200": _reply("LeasesReply"),
                    **_problems(400, 401, 403, 429, 503),
                },
            },
            "get": {"summary": "the lease ledger", "responses": {"200": _reply(None)}},
        },
        "/v1/checkout": {
            "post": {
                "summary": "proxies for this consumer alone until released or expired "
                "(gateway/checkout.py); the same idempotency_key returns the same checkout",
                "security": _AUTH,
                "requestBody": _body("CheckoutRequest"),
                "responses": {"200": _reply("CheckoutReply"), **_problems(400, 401, 403, 429)},
            }
        },
        "/v1/checkout/{checkout}/release": {
            "post": {
                "summary": "give a checkout's proxies back, with per-proxy outcomes (reports)",
                "security": _AUTH,
                "parameters": [
                    {
                        "name": "checkout",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "requestBody": _body("CheckoutRelease"),
                "responses": {"200": _reply(None), **_problems(400, 401, 403, 404, 429)},
            }
        },
        "/v1/leases/{lease}/heartbeat": {
            "post": {
                "summary": "extend a held lease",
                "security": _AUTH,
                "parameters": [lease_path],
                "responses": {"200": _reply("HeartbeatReply"), **_problems(401, 403, 409)},
            }
        },
        "/v1/leases/{lease}/release": {
            "post": {
                "summary": "release a held lease",
                "security": _AUTH,
                "parameters": [lease_path],
                "requestBody": _body("ReleaseRequest"),
                "responses": {"200": _reply("ReleaseReply"), **_problems(400, 401, 403, 409)},
            }
        },
        "/v1/proxies": {
            "get": {
                "summary": "the pool, filtered",
                "parameters": proxy_filters,
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {"schema": {"type": "object"}},
                            # a proxy's object (as in application/json's) a line
                            "application/x-ndjson": {"schema": {"type": "string"}},
                            "text/plain": {"schema": {"type": "string"}},
                            "text/csv": {"schema": {"type": "string"}},
                            "text/yaml": {"schema": {}},  # a mapping, once parsed
                            # format=pac: a proxy auto-config file (JavaScript)
                            "application/x-ns-proxy-autoconfig": {"schema": {"type": "string"}},
                        },
                    },
                    "304": {"description": "not modified since the ETag given"},
                    **_problems(400, 401),
                },
            }
        },
        "/v1/proxies/{addr}": {
            "get": {
                "summary": "one proxy, ip:port",
                "parameters": [
                    {"name": "addr", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": _reply(None), **_problems(400, 404)},
            }
        },
        "/v1/outages": {
            "get": {
                "summary": "networks where many proxies failed at once (computed every 30 s)",
                "responses": {"200": _reply(None)},
            }
        },
        "/v1/endpoints/figures": {
            "post": {
                "summary": "what one process of a rotating endpoint did since it started "
                "(endpoint; every 5 s, kept in the gateway's memory for /v1/stats' endpoint)",
                "security": _AUTH,
                "requestBody": _body("EndpointFigures"),
                "responses": {"200": _reply(None), **_problems(400, 401, 403, 413, 429)},
            }
        },
        "/v1/proxies/{addr}/report": {
            "post": {
                "summary": "a consumer's word on a proxy it was served (consumer; without a "
                "token once guarded, it only moves the proxy up the checkers' queue)",
                "security": [*_AUTH, {}],
                "parameters": [
                    {"name": "addr", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "requestBody": _body("ReportRequest"),
                "responses": {
                    "200": _reply("ReportReply"),
                    **_problems(400, 401, 403, 404, 429, 503),
                },
            }
        },
        "/v1/deposits/{key}": {
            "put": {
                "summary": "store a seed batch (<plan>/<range>/<cursor>, the caller's range at "
                "its cursor) or a raw page (page/<sha256 of the body>); announce it after "
                "with Deposited (worker, seed)",
                "security": _AUTH,
                "parameters": [
                    {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "X-Content-SHA256",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                },
                "responses": {
                    "200": _reply("DepositReply"),
                    **_problems(400, 401, 403, 404, 409, 413, 503),
                },
            }
        },
        "/v1/sites": {
            "get": {
                "summary": "per site, the proxies through, turned away and unknown, the "
                "answers of each kind and the vantages that saw them (admin)",
                "security": _AUTH,
                "responses": {"200": _reply(None), **_problems(401, 403)},
            }
        },
        "/v1/sites/rules": {
            "get": {
                "summary": "the operator's rules for reading sites' answers (ppf sites add): "
                "endpoints and agents (and the admin)",
                "security": _AUTH,
                "responses": {"200": _reply(None), **_problems(401, 403)},
            }
        },
        "/v1/sources": {
            "get": {
                "summary": "sources with scores",
                "parameters": [
                    _query("limit", {"type": "integer", "minimum": 0}),
                    _query("due", {"enum": ["true", "false"]}),
                    _query("sort", {"enum": ["score", "yield"]}),
                ],
                "responses": {"200": _reply(None), **_problems(400)},
            },
            "post": {
                "summary": "add sources (admin)",
                "security": _AUTH,
                "requestBody": _body("SourcesRequest"),
                "responses": {"200": _reply("SourcesAdded"), **_problems(400, 401, 403)},
            },
        },
        "/v1/sources/{url_id}": {
            "get": {
                "summary": "one source",
                "parameters": [
                    {"name": "url_id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": _reply(None), **_problems(404)},
            }
        },
        "/v1/agents": {"get": {"summary": "the fleet", "responses": {"200": _reply(None)}}},
        "/v1/agents/me": {
            "get": {
                "summary": "the agent behind the token",
                "security": _AUTH,
                "responses": {"200": _reply("AgentMe"), **_problems(401, 403, 429)},
            }
        },
        "/v1/stats": {"get": {"summary": "pipeline health", "responses": {"200": _reply(None)}}},
        "/v1/stats/series": {
            "get": {"summary": "the dashboard's time series", "responses": {"200": _reply(None)}}
        },
        "/healthz": {"get": {"summary": "liveness", "responses": {"200": _reply(None)}}},
        "/readyz": {
            "get": {
                "summary": "ready when within the lag bound",
                "responses": {"200": _reply(None), "503": _reply(None, "lagging")},
            }
        },
        "/judge": {
            "get": {
                "summary": "echo of the caller, to a nonce of ppf's own checks (gateway/judge.py)",
                "parameters": [
                    {"name": "n", "in": "query", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": _reply(None),
                    "403": {"description": "not a ppf check's nonce: nothing echoed"},
                },
            }
        },
        "/judge/bytes": {
            "get": {
                "summary": "size bytes for a check's timed download through a proxy, to a "
                "nonce of ppf's own checks (agents/speed.py)",
                "parameters": [
                    {"name": "n", "in": "query", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "size",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
                    },
                ],
                "responses": {
                    "200": {"description": "the bytes"},
                    "400": {"description": "size out of bounds"},
                    "403": {"description": "not a ppf check's nonce: nothing sent"},
                },
            }
        },
        "/openapi.json": {"get": {"summary": "this document", "responses": {"200": _reply(None)}}},
        "/metrics": {
            "get": {
                "summary": "Prometheus text format (gateway/metrics.py)",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        **_dropin(),
        "/": {
            "get": {
                "summary": "the dashboard",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "ppf gateway", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
