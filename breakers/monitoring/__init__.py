"""The cluster's own monitoring, in and out (docs/monitoring.md).

In: Alertmanager's webhook (``receiver``), parsed by ``alertmanager`` (pure), classified by the
DCGM semantics of ``dcgm`` (pure), routed to the job running on the alert's node. Out:
Brakeline's own metrics for Prometheus (``exposition``).
"""
