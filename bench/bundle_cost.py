"""The console's CPU and statements per node bundle, served in-process on the real PostgreSQL.

One node of a large job (``--ranks`` 8 per node, node ``--node`` 1 of a job of ``--world``
1,024 ranks, whose rank 0 speaks from node 0) sends its bundles, served by ``bundle_reply``,
the function the lean agent route calls, with no HTTP around it: what is left is the part of a
bundle's cost that grows with its parts (decoding and validating each rank's body, its
statements). Each round serves ``--bundles`` bundles of a kind, and the worker's share apart:
the evaluation each bundle wakes, run in-process after it (``fail_safe``, as the worker's
task runs it).

Kinds, what a node's forwarder sends per flush interval:

- ``batches``: each rank's metrics batch (3 metrics × 4 steps, a batch id, the rank), a
  heartbeat riding in one batch of five (the SDK's 5 s heartbeat at a 1 s flush);
- ``batches + heartbeats``: the same and each rank's heartbeat as a part of its own;
- ``acks``: each rank's acknowledgement of a new command (a brake's, once per incident);
- ``late acks``: the same when ``--acked`` 896 ranks of other nodes acknowledged it before
  (a late node of a large job: what grows with the ranks that answered is seen here).

Printed per kind, medians over the rounds: web CPU µs per bundle and per part, statements per
bundle, worker CPU µs per bundle. With ``--against REF`` (default ``main``) the same bundles
are served, round after round, by a second process running the code of that git ref (its
``git archive``, on the same database): before and after in one run, interleaved, so a busy
neighbour weighs on both alike. CPU is the process's own (time.process_time), PostgreSQL's
apart; no timed assertion, the figures are read.

    python bundle_cost.py [--rounds 5] [--bundles 100] [--against main] [--profile web|worker]

Instructions instead of CPU time (robust on a loaded machine): run ``--serve KIND`` under
``valgrind --tool=callgrind`` with ``--bundles`` N and 2N; the difference of the two
"Collected" totals, over N, is one bundle's (web and worker; setup cancels out).
``BUNDLE_COST_CODE=<a tree>`` serves with that tree's code (``git archive main``'s, say).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

KINDS = ("batches", "batches + heartbeats", "acks", "late acks")
ACK_KINDS = ("acks", "late acks")
HERE = Path(__file__).resolve().parent
QUEUE = f"bundle-cost-bench-{os.getpid()}"


def beat(rank: int, step: int, world: int) -> dict:
    return {
        "step": step,
        "status": "running",
        "pid": 1000 + rank,
        "hostname": "gpu-node-1",
        "rank": rank,
        "world_size": world,
    }


def batch_body(rank: int, bundle: int, step: int, world: int, riding: bool) -> str:
    points = [
        {"name": name, "step": s, "value": 1.0 / (s + i + 1), "rank": rank}
        for s in range(step, step + 4)
        for i, name in enumerate(("loss", "grad_norm", "lr"))
    ]
    body: dict = {"rank": rank, "batch": f"run-{os.getpid()}-{rank}-{bundle}", "points": points}
    if riding:
        body["heartbeat"] = beat(rank, step + 3, world)
    return json.dumps(body)


def bundle_of(kind: str, bundle: int, node: range, world: int, command: int | None) -> bytes:
    """The bundle of the ranks ``node``: ``bundle`` numbers it (new batch ids and steps)."""
    step = bundle * 4
    if kind in ACK_KINDS:
        ack = {"status": "succeeded", "result": {"rank": 0, "step": step}}
        parts = []
        for rank in node:
            ack["result"]["rank"] = rank
            parts.append({"path": f"commands/{command}/ack", "body": json.dumps(ack)})
        return json.dumps({"parts": parts}).encode()
    parts = [
        {"path": "metrics", "body": batch_body(r, bundle, step, world, (bundle + r) % 5 == 0)}
        for r in node
    ]
    if kind == "batches + heartbeats":
        parts += [{"path": "heartbeat", "body": json.dumps(beat(r, step + 3, world))} for r in node]
    return json.dumps({"parts": parts}).encode()


# Bundles served unmeasured before each round: the ranks' first beats after the other
# kinds' rounds (past their deadlines by then) are not a steady node's.
WARM_UP = 5


class Counter:
    """Counts the statements Django runs (an execute wrapper: no query log kept)."""

    def __init__(self) -> None:
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001
        self.statements += 1
        return execute(sql, params, many, context)


@contextmanager
def profiled(profiler: cProfile.Profile | None) -> Iterator[None]:
    if profiler is not None:
        profiler.enable()
    try:
        yield
    finally:
        if profiler is not None:
            profiler.disable()


def serve_round(
    kind: str,
    bundles: int,
    state: dict,
    profiler: cProfile.Profile | None = None,
    side: str = "web",
) -> dict:
    """Serve ``bundles`` bundles of ``kind``; CPU µs and statements per bundle, web and worker."""
    from django.db import connection

    from breakers.agent.bundle import bundle_reply
    from breakers.control.commands import issue_command
    from breakers.detection.tasks import fail_safe
    from breakers.models import CommandKind
    from incidents.models import Job

    job = Job.objects.get(pk=state["job_id"])
    counter = Counter()
    web = worker = 0.0
    statements = 0
    for index in range(-WARM_UP, bundles):
        number = next(state["numbers"])
        command = None
        if kind in ACK_KINDS:
            command = issue_command(job.pk, CommandKind.PAUSE_DATA, reason="bench").command.pk
        if kind == "late acks":
            answered_before(command, state, step=number * 4)  # the bundle's (``bundle_of``)
        body = bundle_of(kind, number, state["node"], state["world"], command)
        job = Job.objects.get(pk=job.pk)  # the gate's token lookup hands the route its job
        counter.statements = 0
        started = time.process_time()
        with profiled(profiler if side == "web" else None), connection.execute_wrapper(counter):
            answer = bundle_reply(job, body)
        if index >= 0:
            web += time.process_time() - started
            statements += counter.statements
        if any(r["status"] >= 300 for r in answer["results"]):
            raise SystemExit(f"a part was refused: {answer['results']}")
        started = time.process_time()
        with profiled(profiler if side == "worker" else None):
            fail_safe(job.pk)
        if index >= 0:
            worker += time.process_time() - started
        if kind in ACK_KINDS:  # the job runs on: the next command finds it running
            Job.objects.filter(pk=job.pk).update(status="running")
    return {
        "web_us": web * 1e6 / bundles,
        "worker_us": worker * 1e6 / bundles,
        "statements": statements / bundles,
    }


def answered_before(command: int | None, state: dict, step: int) -> None:
    """The acknowledgements of ranks of other nodes, at the step the node's ranks will give."""
    from django.utils import timezone

    from breakers.models import Command, CommandAck

    now = timezone.now()
    others = [r for r in range(state["world"]) if r not in state["node"]][: state["acked"]]
    CommandAck.objects.bulk_create(
        CommandAck(
            command_id=command,
            rank=rank,
            status="succeeded",
            step=step,
            result={"rank": rank, "step": step},
            acknowledged_at=now,
        )
        for rank in others
    )
    Command.objects.filter(pk=command).update(first_ack_at=now)


def new_job(args: argparse.Namespace) -> dict:
    """A job of ``--world`` ranks whose rank 0 (on another node) has spoken; the state of
    the node ``--node``'s bundles."""
    from breakers.agent.bundle import bundle_reply
    from incidents.jobs import create_job

    created = create_job("bench", f"bundle-cost-{os.getpid()}", "training")
    node = range(args.node * args.ranks, (args.node + 1) * args.ranks)
    first = {"path": "heartbeat", "body": json.dumps(beat(0, 0, args.world))}
    bundle_reply(created.job, json.dumps({"parts": [first]}).encode())
    state = {"job_id": created.job.pk, "numbers": count(1), "node": node, "world": args.world}
    return state | {"acked": min(args.acked, args.world - args.ranks - 1)}


def child(args: argparse.Namespace) -> None:
    """Serve rounds asked on stdin (one JSON line each), answer each on stdout."""
    set_up()
    state = new_job(args)
    for kind in KINDS:  # warm up: imports, the ranks' rows, the caches
        serve_round(kind, 10, state)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        print(json.dumps(serve_round(ask["kind"], ask["bundles"], state)), flush=True)


def set_up() -> None:
    os.environ["BRAKELINE_CELERY_QUEUE"] = QUEUE_OF_RUN
    sys.path.insert(0, str(HERE))
    from _stack import set_up_django

    code = os.environ.get("BUNDLE_COST_CODE")
    if code:  # the tree whose code serves (``--against``'s), before this one's
        sys.path.insert(0, code)
        # Celery's Django fix-up puts the working directory first on the path, too.
        os.chdir(code)
    set_up_django()


QUEUE_OF_RUN = os.environ.get("BUNDLE_COST_QUEUE", QUEUE)


class Code:
    """A process serving bundles with one tree's code."""

    def __init__(self, label: str, tree: Path, args: argparse.Namespace) -> None:
        self.label = label
        env = dict(os.environ, PYTHONPATH=f"{tree / 'sdk'}", BUNDLE_COST_QUEUE=QUEUE)
        env["BUNDLE_COST_CODE"] = str(tree)
        shape = ["--ranks", str(args.ranks), "--node", str(args.node), "--world", str(args.world)]
        shape += ["--acked", str(args.acked)]
        command = [sys.executable, str(HERE / "bundle_cost.py"), "--child", *shape]
        self.process = subprocess.Popen(
            command, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._read()

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.label} process ended early")
        return json.loads(line)

    def serve(self, kind: str, bundles: int) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"kind": kind, "bundles": bundles}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def known_ref(ref: str) -> bool:
    check = ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]
    return subprocess.run(check, cwd=HERE.parent, capture_output=True).returncode == 0


def tree_of(ref: str, into: Path) -> Path:
    """The code of git ref ``ref`` of this repository, unpacked under ``into``."""
    archive = into / "code.tar"
    repository = HERE.parent
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", ref], cwd=repository, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def report(results: dict, labels: list[str], rounds: int, bundles: int, ranks: int) -> None:
    parts = {"batches": ranks, "batches + heartbeats": 2 * ranks, "acks": ranks}
    parts["late acks"] = ranks
    print(f"One node's bundle ({ranks} ranks), in-process; medians of {rounds} rounds of")
    print(f"{bundles} bundles. CPU of the serving process (µs), statements through Django.")
    print(f"{'kind':<22}{'code':<10}{'web/bundle':>11}{'web/part':>10}{'stmts':>7}{'worker':>9}")
    for kind in KINDS:
        for label in labels:
            rows = results[(label, kind)]
            web = median([r["web_us"] for r in rows])
            worker = median([r["worker_us"] for r in rows])
            statements = median([r["statements"] for r in rows])
            print(
                f"{kind:<22}{label:<10}{web:>11.0f}{web / parts[kind]:>10.0f}"
                f"{statements:>7.1f}{worker:>9.0f}"
            )
        if len(labels) == 2:
            before, after = (median([r["web_us"] for r in results[(lb, kind)]]) for lb in labels)
            print(f"{'':<22}{'ratio':<10}{before / after:>10.2f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bundles", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--node", type=int, default=1, help="which node of the job sends")
    parser.add_argument("--world", type=int, default=1024, help="the job's ranks")
    parser.add_argument(
        "--acked", type=int, default=896, help="late acks: other ranks that acknowledged before"
    )
    parser.add_argument("--against", default="main", help="git ref of the baseline ('' none)")
    parser.add_argument("--profile", choices=("web", "worker"), help="cProfile one round")
    parser.add_argument("--kind", choices=KINDS, default=KINDS[0], help="the kind profiled")
    parser.add_argument("--profile-out", help="where to write the profile's stats")
    parser.add_argument("--serve", choices=KINDS, help="only serve --bundles bundles of a kind")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.profile or args.serve:
        try:
            (profile if args.profile else serve)(args)
        finally:
            forget_queue()
        return
    with tempfile.TemporaryDirectory() as scratch:
        codes = [Code("this", HERE.parent, args)]
        if args.against and not known_ref(args.against):
            print(f"No git ref {args.against!r} here: this code's figures alone.")
        elif args.against:
            codes.insert(0, Code(args.against, tree_of(args.against, Path(scratch)), args))
        results: dict = {(c.label, k): [] for c in codes for k in KINDS}
        try:
            for _ in range(args.rounds):
                for kind in KINDS:
                    for code in codes:
                        results[(code.label, kind)].append(code.serve(kind, args.bundles))
        finally:
            for code in codes:
                code.close()
            set_up()
            forget_queue()
    report(results, [c.label for c in codes], args.rounds, args.bundles, args.ranks)


def serve(args: argparse.Namespace) -> None:
    """Only serve (under valgrind --tool=callgrind: instructions, whatever the load)."""
    set_up()
    serve_round(args.serve, args.bundles, new_job(args))


def forget_queue() -> None:
    """The evaluations the bundles queued (no worker reads this run's queue)."""
    from core.redis_clients import redis_client

    redis_client().delete(QUEUE_OF_RUN)


def profile(args: argparse.Namespace) -> None:
    """cProfile of one round of the first kind (``web``: bundle_reply; ``worker``: all)."""
    import pstats

    set_up()
    state = new_job(args)
    serve_round(args.kind, 10, state)
    profiler = cProfile.Profile(time.thread_time)
    serve_round(args.kind, args.bundles, state, profiler, args.profile)
    stats = pstats.Stats(profiler)
    if args.profile_out:
        stats.dump_stats(args.profile_out)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(70)


if __name__ == "__main__":
    main()
