"""Who may say what: the events each agent role may publish, and the lease kind it takes.

One table for the gateway (what it publishes for a caller over HTTP) and the fold (what
it folds from an agent's own subjects), so both refuse the same things.
"""

from __future__ import annotations

__all__ = ["ROLE_EVENTS", "ROLE_KINDS", "ROLE_NATS_EVENTS", "may_publish", "may_publish_on_nats"]

# What each role may publish (least privilege); admin may publish anything over HTTP.
ROLE_EVENTS: dict[str, frozenset[str]] = {
    "worker": frozenset(
        {
            "Fetched",
            "Extracted",
            "ProxyWorked",
            "ProxiesChecked",
            "Deposited",
            "Discovered",
            "Released",
            "Heartbeat",
        }
    ),
    "checker": frozenset(
        {"ProxyWorked", "ProxyFailed", "ProxiesChecked", "SitesChecked", "Released", "Heartbeat"}
    ),
    "seed": frozenset({"Deposited", "Released", "Heartbeat"}),
    # Reads the pool and reports on what it was served, over HTTP only: nothing else. Its
    # ProxiesChecked is its traffic's outcomes (the rotating endpoint's), folded as its
    # reports, never as checks (reducers/reports.py ``traffic``).
    "consumer": frozenset({"ProxyReported", "ProxiesChecked"}),
    # The rotating endpoint's own identity: its consumers' traffic as site verdicts (key
    # "traffic"), a proxy's and a site's and never a consumer's name, over HTTP only.
    "endpoint": frozenset({"SitesChecked"}),
}

# On its own subjects an agent publishes observations only: a lease transition and its
# own heartbeat go through the gateway, which checks them against the ledger first, and
# a consumer's report goes through the gateway's report endpoint (it has no NATS login).
ROLE_NATS_EVENTS: dict[str, frozenset[str]] = {
    role: types - {"Released", "Heartbeat", "ProxyReported"}
    for role, types in ROLE_EVENTS.items()
    if role not in ("consumer", "endpoint")
}

ROLE_KINDS = {"worker": "source", "checker": "recheck", "seed": "seed"}


def may_publish(role: str, event_type: str) -> bool:
    return role == "admin" or event_type in ROLE_EVENTS.get(role, ())


def may_publish_on_nats(role: str, event_type: str) -> bool:
    return event_type in ROLE_NATS_EVENTS.get(role, ())
