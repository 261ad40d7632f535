"""A cluster of nats-server nodes on this machine (``ppf up --cluster 3``, the tests):
NATS's own clustering, routes between every pair, JetStream on each node with a store
of its own, and one set of fleet secrets for all (``ClusterRole.secrets``).

For hosts, deploy/README.md gives the same configuration one node a machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.natsauth import NatsAuth
from ops.nats.server import ClusterRole, NatsServer, free_port

__all__ = ["LocalCluster"]


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` distinct free ports, none in ``taken``."""
    found: list[int] = []
    while len(found) < count:
        found.append(free_port(avoid=taken | set(found)))
    return found


class LocalCluster:
    """``size`` nodes under ``data``: ``data/node<i>`` each, ``data/auth.json`` shared.
    ``ports``: the client ports (free ones by default); route ports are free ones."""

    def __init__(
        self, data: Path, size: int = 3, host: str = "127.0.0.1", ports: list[int] | None = None
    ) -> None:
        self.data = data
        ports = ports or _free_ports(size, set())
        # Never one of the client ports (``ppf up --cluster`` takes a run of them, which
        # the kernel may hand out as free: seen as a node failing to bind in CI).
        routes = _free_ports(size, set(ports))
        secrets = data / "auth.json"
        self.nodes = []
        for i in range(size):
            others = tuple(f"nats://{host}:{routes[j]}" for j in range(size) if j != i)
            role = ClusterRole(
                name=f"ppf-{i + 1}", route_port=routes[i], routes=others, secrets=secrets
            )
            self.nodes.append(NatsServer(data / f"node{i + 1}", host, ports[i], cluster=role))

    @property
    def url(self) -> str:
        """The service's URLs of every node, comma-separated."""
        return ",".join(node.url for node in self.nodes)

    @property
    def address(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def agent_auth(self) -> NatsAuth:
        """As ``NatsServer.agent_auth``, with every node's address for the agents."""
        first = self.nodes[0].agent_auth()
        return NatsAuth(
            address=self.address,
            service_url=self.url,
            issuer_seed=first.issuer_seed,
            sys_password=first.sys_password,
        )

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
        except BaseException:  # a node that cannot start (its port taken): none left up
            self.stop()
            raise
        # Where this machine's commands dial it (ops/nats/server.py local_address).
        dial = ",".join(node.address.replace("0.0.0.0", "127.0.0.1") for node in self.nodes)
        (self.data / "listen").write_text(dial + "\n")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)
