"""The inference profile end to end: a real HAProxy in front of two real replicas.

Two replicas of a small stdlib HTTP model server run with the SDK's inference mode and
heartbeat to the real console (Daphne); HAProxy (the Debian package) balances a client's
requests over them. One replica is made to answer NaN: its health hook says so, the console
raises the L3, and the inference response drains it in HAProxy (seen through the runtime API,
and in the traffic: only the other replica answers), restarts it through the local executor
and puts it back when the new process heartbeats healthy. The client sees no failed request.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from breakers.executors.traffic import TrafficError
from breakers.executors.traffic.haproxy import HAProxyExecutor
from breakers.models import InferenceReplica, InferenceServer, ReplicaStatus
from incidents.models import Alert, Incident
from tests.brakeline.live import training_environment
from tests.conftest import free_port, wait_for_port
from tests.support.waiting import wait_for

SERVER = Path(__file__).resolve().parent / "scripts" / "model_server.py"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(HAPROXY).exists(), reason="needs haproxy (apt-get install haproxy)"
    ),
]

CONFIG = """
global
    stats socket {socket} mode 600 level admin
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
    option http-server-close
    retries 3
    option redispatch 1
frontend api
    bind 127.0.0.1:{port}
    default_backend models
backend models
    balance roundrobin
    server r1 127.0.0.1:{r1}
    server r2 127.0.0.1:{r2}
"""


@dataclass
class Traffic:
    """A client calling the API through HAProxy without pause, as a user would."""

    port: int
    answers: list[tuple[float, float, str, object]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.time()
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                connection.request(
                    "POST", "/predict", json.dumps({"x": 1.5}), {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                body = response.read()
                connection.close()
            except OSError as error:
                self.failures.append(f"{type(error).__name__}: {error}")
                continue
            if response.status != 200:
                self.failures.append(f"HTTP {response.status}: {body[:200]!r}")
                continue
            answer = json.loads(body)
            self.answers.append((sent, time.time(), answer["replica"], answer["output"]))
            time.sleep(0.005)

    def served_by(self, name: str, since: float = 0.0) -> int:
        return sum(1 for sent, _, replica, _ in self.answers if replica == name and sent > since)


def start_replica(name: str, port: int, env: dict, log: Path) -> subprocess.Popen:
    # A session of its own, like a service manager starts it: the console's executor refuses
    # to signal a process of its own process group.
    return subprocess.Popen(
        [sys.executable, str(SERVER), name, str(port)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@dataclass
class Stack:
    """Two replicas behind a real HAProxy, a client calling without pause, and a poller of
    HAProxy's runtime API recording r1's state."""

    tmp: Path
    env: dict
    ports: dict[str, int] = field(default_factory=dict)
    started: list[subprocess.Popen] = field(default_factory=list)
    seen_states: list[tuple[float, str]] = field(default_factory=list)
    watching: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = {"r1": free_port(), "r2": free_port(), "port": free_port()}
        self.socket = self.tmp / "haproxy.sock"
        self.logs = {name: self.tmp / f"{name}.log" for name in ("r1", "r2", "haproxy")}
        self.traffic = Traffic(self.ports["port"])

    def context(self) -> str:
        return "\n".join(
            f"--- {n}\n{p.read_text(errors='replace')[-1500:]}"
            for n, p in self.logs.items()
            if p.exists()
        )

    def start(self) -> None:
        config = self.tmp / "haproxy.cfg"
        config.write_text(CONFIG.format(socket=self.socket, **self.ports))
        for name in ("r1", "r2"):
            self.started.append(start_replica(name, self.ports[name], self.env, self.logs[name]))
        haproxy = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)],
            stdout=self.logs["haproxy"].open("ab"),
            stderr=subprocess.STDOUT,
        )
        self.started.append(haproxy)
        wait_for_port(self.ports["port"], haproxy)
        for index, name in enumerate(("r1", "r2")):
            wait_for_port(self.ports[name], self.started[index])

    def call_and_watch(self) -> None:
        api = HAProxyExecutor(str(self.socket))

        def watch_runtime_api() -> None:
            while not self.watching.is_set():
                with contextlib.suppress(TrafficError):  # HAProxy not up yet
                    self.seen_states.append((time.time(), api.state("models", "r1").admin))
                time.sleep(0.02)

        for target in (self.traffic.run, watch_runtime_api):
            self.threads.append(threading.Thread(target=target, daemon=True))
            self.threads[-1].start()

    def stop(self, job_id: int, first_pid: int | None) -> None:
        self.traffic.stop.set()
        self.watching.set()
        for thread in self.threads:
            thread.join(15)
        rows = InferenceReplica.objects.filter(job_id=job_id, name="r1")
        restarted_pid = rows.values_list("pid", flat=True).first()
        for process in self.started:
            process.terminate()
        for process in self.started:
            process.wait(10)
        if restarted_pid and first_pid and restarted_pid != first_pid:
            # Started during this test (by the console's executor, or by the replica's own
            # restart): ours to stop.
            os.kill(restarted_pid, signal.SIGTERM)


@pytest.mark.parametrize(
    "where",
    [
        "this host",  # the local executor restarts it from outside
        "another host",  # it cannot: the replica's SDK is asked to restart itself
    ],
)
def test_a_replica_answering_nan_is_drained_restarted_and_put_back(
    where, live_console, make_agent, worker, settings, tmp_path, client
):
    agent = make_agent(name=f"model-api-{where.split()[0]}", kind="inference")
    for name in ("r1", "r2"):  # declared by a team admin: what the executor may act on
        InferenceServer.objects.create(job_id=agent.job_id, backend="models", server=name)
    env = training_environment(live_console, agent.token)
    if where == "another host":
        env["REPLICA_HOSTNAME"] = "gpu-far-away"
    stack = Stack(tmp_path, env)
    settings.HAPROXY_SOCKET = str(stack.socket)
    settings.INFERENCE_DRAIN_SECONDS = 10.0
    settings.EXECUTOR_GRACE_SECONDS = 5.0
    first_pid = None
    try:
        stack.start()
        first_pid = serve_and_poison(stack, agent.job_id, local=where == "this host")
    finally:
        stack.stop(agent.job_id, first_pid)

    assert stack.traffic.failures == [], stack.traffic.failures[:5]
    notes = incident_notes(agent.job_id, where)
    figures = traffic_followed_the_drain(stack, notes)
    the_pages_tell_it(client, agent.job_id, notes, where)
    print(f"inference L3 ({where}): {figures}")


def serve_and_poison(stack: Stack, job_id: int, *, local: bool) -> int:
    """Traffic on both replicas, then r1 answers NaN until it is drained, restarted and back
    in traffic. Returns r1's first pid."""
    # Registered; from this host, with the start time the local executor checks.
    wait_for(
        lambda: (
            InferenceReplica.objects.filter(job_id=job_id, pid_start_time__isnull=not local).count()
            == 2
        ),
        "both replicas registered",
        context=stack.context,
    )
    first_pid = InferenceReplica.objects.get(job_id=job_id, name="r1").pid
    stack.call_and_watch()
    traffic = stack.traffic
    wait_for(
        lambda: traffic.served_by("r1") > 5 and traffic.served_by("r2") > 5,
        "traffic on both replicas",
        context=stack.context,
    )
    poison = http.client.HTTPConnection("127.0.0.1", stack.ports["r1"], timeout=5)
    poison.request("POST", "/poison", b"{}")
    assert poison.getresponse().status == 200

    def back() -> InferenceReplica | None:
        replica = InferenceReplica.objects.get(job_id=job_id, name="r1")
        restarted = replica.restarts == 1 and replica.pid != first_pid
        return replica if restarted and replica.status == ReplicaStatus.SERVING else None

    wait_for(back, "r1 drained, restarted and back in traffic", timeout=120, context=stack.context)
    back_at = time.time()
    wait_for(lambda: traffic.served_by("r1", since=back_at) > 5, "r1 answering again")
    return first_pid


def incident_notes(job_id: int, where: str) -> dict:
    """The L3, resolved, and its incident's timeline: started, drained, restarted, back."""
    alert = Alert.objects.get(job_id=job_id, rule_key="inference-replica-unhealthy")
    assert alert.severity == "L3" and alert.node == "r1" and alert.status == "resolved"
    assert "NaN/Inf outputs" in alert.description
    incident = Incident.objects.get(pk=alert.incident_id)
    notes = {row.data.get("event"): row for row in incident.timeline.all() if row.data}
    notes["incident"] = incident
    restarted = "replica_restarted" if where == "this host" else "replica_restart_requested"
    for event in ("replica_response_started", "replica_drained", restarted, "replica_back"):
        assert event in notes, sorted(notes)
    if where == "this host":
        replica = InferenceReplica.objects.get(job_id=job_id, name="r1")
        assert notes["replica_restarted"].data["new_pid"] == replica.pid
    else:
        assert "not on this worker's host" in notes[restarted].message
    out_of_traffic = notes["replica_back"].data["seconds_out_of_traffic"]
    assert out_of_traffic > 0 and f"after {out_of_traffic:.1f} s out of traffic" in (
        notes["replica_back"].message
    )
    # No checkpoint for an inference job: no command was issued at all.
    assert not agent_commands(job_id)
    return notes


def traffic_followed_the_drain(stack: Stack, notes: dict) -> str:
    """r1 in maintenance while it restarted, then ready; r2 alone answered meanwhile; NaN
    answers only from r1 and none once drained."""
    answers = stack.traffic.answers
    states = [state for _, state in stack.seen_states]
    assert "maint" in states and states[-1] == "ready"
    drained_at = notes["replica_drained"].at.timestamp()
    back_in_at = notes["replica_back"].at.timestamp()
    assert back_in_at - drained_at > 0
    during = [
        (sent, done, replica)
        for sent, done, replica, _ in answers
        if drained_at < sent and done < back_in_at
    ]
    # The drained row is written once HAProxy has r1 in maintenance, the back row before
    # HAProxy is told "ready": r1 answering in between is a timeline that misstates them.
    r1_out = [(sent, done) for sent, done, replica in during if replica == "r1"]
    assert during and not r1_out, (drained_at, back_in_at, r1_out)
    nan_sent = [sent for sent, _, replica, output in answers if output == "NaN"]
    assert nan_sent and max(nan_sent) < drained_at
    assert all(output != "NaN" for sent, _, _, output in answers if sent > back_in_at)
    out = notes["replica_back"].data["seconds_out_of_traffic"]
    return (
        f"{len(answers)} requests, 0 failed; {len(nan_sent)} NaN answers before the drain; "
        f"{len(during)} answered by r2 alone while r1 was out; r1 out of traffic {out:.2f} s; "
        f"drain to back {back_in_at - drained_at:.2f} s"
    )


def the_pages_tell_it(client, job_id: int, notes: dict, where: str) -> None:
    """The incident's timeline, as a person reads it; the job page lists the replicas."""
    from incidents.models import Team
    from tests.support.authz import make_member

    client.force_login(make_member(Team.objects.get(name="research"), "viewer"))
    timeline = client.get(f"/incidents/{notes['incident'].pk}/").content.decode()
    out_of_traffic = notes["replica_back"].data["seconds_out_of_traffic"]
    steps = (
        "leaves traffic, restarts",
        "Drained in haproxy (models/r1)",
        "Restarted by the local executor" if where == "this host" else "asked to restart itself",
        f"after {out_of_traffic:.1f} s out of traffic",
    )
    for words in steps:
        assert words in timeline, words
    job_page = client.get(f"/jobs/{job_id}/").content.decode()
    assert 'data-replica="r1"' in job_page and "1 restart" in job_page


def agent_commands(job_id: int) -> list:
    from breakers.models import Command

    return list(Command.objects.filter(job_id=job_id))
