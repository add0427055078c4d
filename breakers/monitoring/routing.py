"""Which job an outside alert is about: the ``brakeline_job`` label, else the job running on
the node the alert names, now (its node registry: the nodes its points and heartbeats named,
its agent's host, its Slurm job's node list).

Only the token's team's jobs are candidates: a team's Alertmanager can never brake another
team's job. A job whose binding to the node is verified (``breakers.executors.targets.
node_binding``: an operator's node inventory, or Slurm's own node list for the job) is chosen
over one that only its agent said runs there; among equals, the one heard from last.

A route to a job the node is bound to by its agent's word only is ``verified=False``: the
alert pages people, but nothing is terminated or isolated automatically (an agent naming
another job's host must not capture, nor act on, that host's hardware alerts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.db.models import F, Q

from breakers.executors.slurm.client import job_nodes
from breakers.executors.targets import AGENT_REPORTED, node_binding
from breakers.models import ExecutorKind, NodeBinding, SchedulerBinding
from core.nodes import is_single_node_name
from incidents.models import FINAL_JOB_STATUSES, Job

JOB_LABEL = "brakeline_job"
# Where exporters put the node: ours, dcgm-exporter's, Kubernetes', Prometheus' target.
NODE_LABELS = ("brakeline_node", "Hostname", "node", "instance")
MAX_NODE_NAME = 200  # the Node and Alert columns; a longer label names no node of ours


@dataclass(frozen=True)
class Route:
    job: Job | None
    node: str
    reason: str = ""  # why there is no job ("" when routed)
    verified: bool = True  # False: only the job's agent said it runs on the node


def node_of(labels: Mapping[str, str]) -> str:
    """The node an alert's labels name, as one node's name ("" when none does)."""
    for label in NODE_LABELS:
        value = labels.get(label, "").strip()
        if label == "instance":
            value = _host_of_instance(value)
        if value and len(value) <= MAX_NODE_NAME and is_single_node_name(value):
            return value
    return ""


def _host_of_instance(instance: str) -> str:
    """``gpu-b:9400`` → ``gpu-b``; ``[::1]:9400`` → ``::1``."""
    if instance.startswith("["):
        return instance[1:].partition("]")[0]
    host, _, port = instance.rpartition(":")
    return host if host and port.isdigit() else instance


def route(team_id: int, labels: Mapping[str, str]) -> Route:
    node = node_of(labels)
    name = labels.get(JOB_LABEL, "").strip()
    if name:
        job = Job.objects.filter(team_id=team_id, name=name).first()
        if job is None and name.isdigit():
            job = Job.objects.filter(team_id=team_id, pk=int(name)).first()
        if job is None:
            return Route(None, node, f"no job {name!r} in the team (label {JOB_LABEL})")
        return Route(job, node)
    if not node:
        return Route(None, "", f"no {JOB_LABEL} label and no node label ({', '.join(NODE_LABELS)})")
    job = job_on_node(team_id, node)
    if job is None:
        return Route(None, node, f"no running job of the team on node {node}")
    return Route(job, node, verified=node_binding(job.pk, node) != AGENT_REPORTED)


def job_on_node(team_id: int, node: str) -> Job | None:
    """The team's job running on ``node`` now (short names match FQDNs: gpu-b.cluster): one
    bound to it by an operator or Slurm first, else the one heard from last."""
    names = {node, node.split(".", 1)[0]}
    live = Job.objects.filter(team_id=team_id).exclude(status__in=FINAL_JOB_STATUSES)
    latest = F("last_heartbeat_at").desc(nulls_last=True)
    bound = NodeBinding.objects.filter(hostname__in=names).values("job_id")
    job = live.filter(pk__in=bound).order_by(latest, "-pk").first()
    job = job or _slurm_job_on_node(live, names)
    registry = Q(nodes__hostname__in=names) | Q(agent_hostname__in=names)
    return job or live.filter(registry).distinct().order_by(latest, "-pk").first()


def _slurm_job_on_node(live, names: set[str]) -> Job | None:
    """A Slurm-bound job whose node list holds the node (Slurm expands the host list)."""
    bindings = SchedulerBinding.objects.filter(job__in=live, executor=ExecutorKind.SLURM).exclude(
        slurm_nodelist=""
    )
    for binding in bindings.select_related("job").order_by("-updated_at")[:50]:
        nodelist = binding.slurm_nodelist
        hosts = nodelist.split(",") if "[" not in nodelist else job_nodes(nodelist)[0]
        if hosts and names & set(hosts):
            return binding.job
    return None
