"""Traffic executors: taking a replica out of a load balancer's traffic and putting it back.

The inference profile's L3 response (``breakers.control.inference``) speaks only this
interface, so load balancers other than HAProxy (nginx, Kubernetes endpoints) plug in next to
it. A server is named as the load balancer names it: a backend and a server in it.

- ``drain``: no new requests go to it, requests in flight finish;
- ``maintenance``: nothing goes to it (after the drain, before the restart);
- ``ready``: back in traffic;
- ``state``: what the load balancer says now (admin state, health, sessions in flight).

Every change goes through ``JobTraffic``, the job's view of the load balancer: it acts only on
a backend/server a team admin declared for the job (``breakers.executors.targets``), never on
one a replica's heartbeat merely named.
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


class JobTraffic:
    """The load balancer as one job may use it: each call first asks the seam whether the
    server is declared for the job, and refuses (TrafficError) when it is not."""

    def __init__(self, executor: TrafficExecutor, job_id: int) -> None:
        self.executor, self.job_id, self.name = executor, job_id, executor.name

    def _checked(self, backend: str, server: str) -> None:
        from breakers.executors.targets import traffic_server

        why = traffic_server(self.job_id, backend, server)
        if why is not None:
            raise TrafficError(f"refused: {why}")

    def drain(self, backend: str, server: str) -> None:
        self._checked(backend, server)
        self.executor.drain(backend, server)

    def maintenance(self, backend: str, server: str) -> None:
        self._checked(backend, server)
        self.executor.maintenance(backend, server)

    def ready(self, backend: str, server: str) -> None:
        self._checked(backend, server)
        self.executor.ready(backend, server)

    def state(self, backend: str, server: str) -> ServerState:
        self._checked(backend, server)
        return self.executor.state(backend, server)


def traffic_executor(job_id: int) -> JobTraffic | None:
    """The configured traffic executor (``BRAKELINE_HAPROXY_SOCKET``) as job ``job_id`` may
    use it, or None when none is configured."""
    from django.conf import settings

    from breakers.executors.traffic.haproxy import HAProxyExecutor

    address = getattr(settings, "HAPROXY_SOCKET", "")
    return JobTraffic(HAProxyExecutor(address), job_id) if address else None
