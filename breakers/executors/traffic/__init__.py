"""Traffic executors: taking a replica out of a load balancer's traffic and putting it back.

The inference profile's L3 response (``breakers.control.inference``) speaks only this
interface, so load balancers other than HAProxy (nginx, Kubernetes endpoints) plug in next to
it. A server is named as the load balancer names it: a backend and a server in it.

- ``drain``: no new requests go to it, requests in flight finish;
- ``maintenance``: nothing goes to it (after the drain, before the restart);
- ``ready``: back in traffic;
- ``state``: what the load balancer says now (admin state, health, sessions in flight).

Every change goes through ``breakers.executors.traffic.job_traffic.JobTraffic``, the job's view
of the load balancer: it acts only on a backend/server a team admin declared for the job
(``breakers.executors.targets``), never on one a replica's heartbeat merely named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TrafficError(Exception):
    """The load balancer could not be reached or refused the change (the message says why)."""


@dataclass(frozen=True)
class ServerState:
    backend: str
    server: str
    admin: str  # ready | drain | maint
    operational: str  # the load balancer's own word: UP, DOWN, DRAIN, MAINT, no check…
    sessions: int  # requests in flight on it now

    @property
    def in_traffic(self) -> bool:
        return self.admin == "ready"


class TrafficExecutor(Protocol):
    name: str

    def drain(self, backend: str, server: str) -> None: ...

    def maintenance(self, backend: str, server: str) -> None: ...

    def ready(self, backend: str, server: str) -> None: ...

    def state(self, backend: str, server: str) -> ServerState: ...
