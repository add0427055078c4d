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
    ports = {"r1": free_port(), "r2": free_port(), "port": free_port()}
    socket_path = tmp_path / "haproxy.sock"
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.format(socket=socket_path, **ports))
    logs = {name: tmp_path / f"{name}.log" for name in ("r1", "r2", "haproxy")}
    started: list[subprocess.Popen] = []
    settings.HAPROXY_SOCKET = str(socket_path)
    settings.INFERENCE_DRAIN_SECONDS = 10.0
    settings.EXECUTOR_GRACE_SECONDS = 5.0
    haproxy_api = HAProxyExecutor(str(socket_path))
    traffic = Traffic(ports["port"])
    caller = threading.Thread(target=traffic.run, daemon=True)
    seen_states: list[tuple[float, str]] = []
    watching = threading.Event()

    def watch_runtime_api() -> None:
        while not watching.is_set():
            with contextlib.suppress(TrafficError):  # HAProxy not up yet
                seen_states.append((time.time(), haproxy_api.state("models", "r1").admin))
            time.sleep(0.02)

    def context() -> str:
        return "\n".join(
            f"--- {n}\n{p.read_text(errors='replace')[-1500:]}"
            for n, p in logs.items()
            if p.exists()
        )

    try:
        for name in ("r1", "r2"):
            started.append(start_replica(name, ports[name], env, logs[name]))
        haproxy_log = logs["haproxy"].open("ab")
        haproxy = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=haproxy_log, stderr=subprocess.STDOUT
        )
        started.append(haproxy)
        wait_for_port(ports["port"], haproxy)
        for name in ("r1", "r2"):
            wait_for_port(ports[name], started[0 if name == "r1" else 1])
        # Registered; from this host, with the start time the local executor checks.
        local = where == "this host"
        wait_for(
            lambda: (
                InferenceReplica.objects.filter(
                    job_id=agent.job_id, pid_start_time__isnull=not local
                ).count()
                == 2
            ),
            "both replicas registered",
            context=context,
        )
        first_pid = InferenceReplica.objects.get(job_id=agent.job_id, name="r1").pid
        caller.start()
        poller = threading.Thread(target=watch_runtime_api, daemon=True)
        poller.start()
        wait_for(
            lambda: traffic.served_by("r1") > 5 and traffic.served_by("r2") > 5,
            "traffic on both replicas",
            context=context,
        )

        # The fault: r1's model starts answering NaN.
        poison = http.client.HTTPConnection("127.0.0.1", ports["r1"], timeout=5)
        poison.request("POST", "/poison", b"{}")
        assert poison.getresponse().status == 200

        def back() -> InferenceReplica | None:
            replica = InferenceReplica.objects.get(job_id=agent.job_id, name="r1")
            restarted = replica.restarts == 1 and replica.pid != first_pid
            return replica if restarted and replica.status == ReplicaStatus.SERVING else None

        replica = wait_for(
            back, "r1 drained, restarted and back in traffic", timeout=120, context=context
        )
        back_at = time.time()
        wait_for(lambda: traffic.served_by("r1", since=back_at) > 5, "r1 answering again")
    finally:
        traffic.stop.set()
        watching.set()
        if caller.ident is not None:  # started (a failure may come before)
            caller.join(15)
        rows = InferenceReplica.objects.filter(job_id=agent.job_id, name="r1")
        restarted_pid = rows.values_list("pid", flat=True).first()
        for process in started:
            process.terminate()
        for process in started:
            process.wait(10)
        if restarted_pid and restarted_pid != first_pid:
            # Started during this test (by the console's executor, or by the replica's own
            # restart): ours to stop.
            os.kill(restarted_pid, signal.SIGTERM)

    assert traffic.failures == [], traffic.failures[:5]

    alert = Alert.objects.get(job_id=agent.job_id, rule_key="inference-replica-unhealthy")
    assert alert.severity == "L3" and alert.node == "r1" and alert.status == "resolved"
    assert "NaN/Inf outputs" in alert.description
    incident = Incident.objects.get(pk=alert.incident_id)
    notes = {row.data.get("event"): row for row in incident.timeline.all() if row.data}
    restarted = "replica_restarted" if where == "this host" else "replica_restart_requested"
    for event in ("replica_response_started", "replica_drained", restarted, "replica_back"):
        assert event in notes, sorted(notes)
    if where == "this host":
        assert notes["replica_restarted"].data["new_pid"] == replica.pid
    else:
        assert "not on this worker's host" in notes[restarted].message
    out_of_traffic = notes["replica_back"].data["seconds_out_of_traffic"]
    assert out_of_traffic > 0 and f"after {out_of_traffic:.1f} s out of traffic" in (
        notes["replica_back"].message
    )
    # No checkpoint for an inference job: no command was issued at all.
    assert not agent_commands(agent.job_id)

    # The runtime API: r1 was in maintenance (after its drain) while it restarted, then ready.
    states = [state for _, state in seen_states]
    assert "maint" in states and states[-1] == "ready"
    drained_at = notes["replica_drained"].at.timestamp()
    back_in_at = notes["replica_back"].at.timestamp()
    assert back_in_at - drained_at > 0
    during = [
        (replica, output)
        for sent, done, replica, output in traffic.answers
        if drained_at < sent and done < back_in_at
    ]
    assert during and {replica for replica, _ in during} == {"r2"}
    # NaN answers came only from r1, and none once it was drained.
    nan_sent = [sent for sent, _, replica, output in traffic.answers if output == "NaN"]
    assert nan_sent and max(nan_sent) < drained_at
    assert all(output != "NaN" for sent, _, _, output in traffic.answers if sent > back_in_at)
    # The incident's timeline, as a person reads it; the job page lists the replicas.
    from incidents.models import Team
    from tests.support.authz import make_member

    client.force_login(make_member(Team.objects.get(name="research"), "viewer"))
    timeline = client.get(f"/incidents/{incident.pk}/").content.decode()
    steps = (
        "leaves traffic, restarts",
        "Drained in haproxy (models/r1)",
        "Restarted by the local executor" if where == "this host" else "asked to restart itself",
        f"after {out_of_traffic:.1f} s out of traffic",
    )
    for words in steps:
        assert words in timeline, words
    job_page = client.get(f"/jobs/{agent.job_id}/").content.decode()
    assert 'data-replica="r1"' in job_page and "1 restart" in job_page
    print(
        f"inference L3 ({where}): {len(traffic.answers)} requests, 0 failed; "
        f"{len(nan_sent)} NaN answers before the drain; {len(during)} answered by r2 alone "
        f"while r1 was out; r1 out of traffic {out_of_traffic:.2f} s; drain to back "
        f"{back_in_at - drained_at:.2f} s"
    )


def agent_commands(job_id: int) -> list:
    from breakers.models import Command

    return list(Command.objects.filter(job_id=job_id))
