"""The load balancer as one job may use it (``JobTraffic``), and the one configured for it.

Built on the interface (``breakers.executors.traffic``) and the executors that implement it;
the inference L3 response (``breakers.control.inference``) reaches a load balancer only here.
"""

from __future__ import annotations

from django.conf import settings

from breakers.executors.targets import traffic_server
from breakers.executors.traffic import ServerState, TrafficError, TrafficExecutor
from breakers.executors.traffic.haproxy import HAProxyExecutor


class JobTraffic:
    """The load balancer as one job may use it: each call first asks the seam whether the
    server is declared for the job, and refuses (TrafficError) when it is not."""

    def __init__(self, executor: TrafficExecutor, job_id: int) -> None:
        self.executor, self.job_id, self.name = executor, job_id, executor.name

    def _checked(self, backend: str, server: str) -> None:
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
    address = getattr(settings, "HAPROXY_SOCKET", "")
    return JobTraffic(HAProxyExecutor(address), job_id) if address else None
