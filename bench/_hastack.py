"""The fault stack with fail-over (docs/deployment-ha.md): PostgreSQL under Patroni (two
members and an etcd) and Redis under Sentinel (a master, a replica, three sentinels), all on
free ports of this machine, with the console configured as docs/deployment-ha.md says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench._faultstack import Stack, free_port, pg_bin, port_open, wait_until

SCOPE = "brakeline-faults"
MASTER = "faults"
PROMOTION_PAUSE_SECONDS = 2.0


def ha_missing() -> str | None:
    """What this machine lacks for the fail-over stack (None: nothing)."""
    for binary in ("etcd", "patroni", "patronictl", "redis-server", "redis-sentinel"):
        if not shutil.which(binary):
            return f"{binary} is not installed (Debian: etcd-server, patroni, redis-sentinel)"
    return None


class HAStack(Stack):
    def __init__(self, workers: int = 2) -> None:
        super().__init__(workers)
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.pg_ports = [free_port(), free_port()]
        self.rest_ports = [free_port(), free_port()]
        self.redis_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.env.update(
            DATABASE_URL=f"postgresql://postgres@127.0.0.1:{self.pg_ports[0]}/brakeline",
            BRAKELINE_DATABASE_HOSTS=",".join(f"127.0.0.1:{p}" for p in self.pg_ports),
            REDIS_URL=f"redis://127.0.0.1:{self.redis_ports[0]}/0",
            BRAKELINE_REDIS_SENTINELS=",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports),
            BRAKELINE_REDIS_SENTINEL_MASTER=MASTER,
        )
        self.redis_port = self.redis_ports[0]

    # -- PostgreSQL under Patroni ------------------------------------------------------------
    def init_postgres(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer}"
        self._start(
            "etcd",
            [
                "etcd",
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"default={peer}",
            ],
        )
        wait_until(lambda: port_open(self.etcd_port), "etcd to listen")
        for member in (0, 1):
            self._start_member(member)
            if member == 0:
                wait_until(lambda: self.leader() == "pg0", "Patroni to bootstrap pg0", 120, 0.5)
        wait_until(lambda: self._replica_streaming(), "pg1 to stream from pg0", 120, 0.5)
        self.sql("CREATE DATABASE brakeline", database="postgres", autocommit=True)

    def _start_member(self, member: int) -> None:
        config = self.dir / f"patroni{member}.yml"
        config.write_text(json.dumps(self._patroni_config(member)))  # YAML is a superset
        if os.geteuid() == 0:
            shutil.chown(config, "postgres")
        self._start(f"patroni{member}", self._as_postgres("patroni", str(config)))

    def _patroni_config(self, member: int) -> dict:
        rest = f"127.0.0.1:{self.rest_ports[member]}"
        address = f"127.0.0.1:{self.pg_ports[member]}"
        parameters = {"fsync": "off", "unix_socket_directories": str(self.dir)}
        return {
            "scope": SCOPE,
            "name": f"pg{member}",
            "restapi": {"listen": rest, "connect_address": rest},
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "postgresql": {"use_pg_rewind": False, "parameters": parameters},
                },
                "initdb": [{"auth": "trust"}, {"username": "postgres"}, "no-sync"],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": address,
                "connect_address": address,
                "data_dir": str(self.dir / f"pg{member}"),
                "bin_dir": str(pg_bin()),
                "pgpass": str(self.dir / f"pgpass{member}"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                },
                "parameters": parameters,
                # Fencing before a promotion takes time in real set-ups; here it also keeps the
                # moment without a primary long enough for the NaN to be logged inside it.
                "pre_promote": f"sleep {PROMOTION_PAUSE_SECONDS:g}",
            },
        }

    def _rest(self, member: int, path: str) -> tuple[int, dict]:
        url = f"http://127.0.0.1:{self.rest_ports[member]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=3) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, {}
        except (OSError, ValueError):
            return 0, {}

    def leader(self) -> str | None:
        """The member that is primary and takes writes, by Patroni's own REST answer."""
        for member in (0, 1):
            status, body = self._rest(member, "/primary")
            if status == 200 and body.get("role") in ("master", "primary"):
                return f"pg{member}"
        return None

    def _replica_streaming(self) -> bool:
        status, body = self._rest(1, "/replica")
        return status == 200 and body.get("state") == "running"

    def switchover(self) -> None:
        """Patroni moves the primary to the other member (a planned switch-over)."""
        old = self.leader()
        new = "pg1" if old == "pg0" else "pg0"
        subprocess.run(
            self._as_postgres(
                "patronictl",
                "-c",
                str(self.dir / "patroni0.yml"),
                "switchover",
                "--leader",
                str(old),
                "--candidate",
                new,
                "--force",
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    def start_postgres(self) -> None:  # the members restart on their own (Patroni)
        pass

    def stop_postgres(self) -> None:
        """Patroni stops its PostgreSQL when it is told to stop; what is left is killed."""
        for member in (0, 1):
            if f"patroni{member}" in self.processes:
                self.kill(f"patroni{member}", sig=15)
        subprocess.run(["pkill", "-KILL", "-f", "--", f"{self.dir}/pg"], check=False)

    def sql(
        self,
        query: str,
        parameters: tuple = (),
        database: str = "brakeline",
        autocommit: bool = False,
    ) -> list[tuple]:
        import psycopg

        hosts = ",".join("127.0.0.1" for _ in self.pg_ports)
        ports = ",".join(str(p) for p in self.pg_ports)
        conninfo = (
            f"host={hosts} port={ports} user=postgres dbname={database} "
            "target_session_attrs=read-write connect_timeout=10"
        )
        with psycopg.connect(conninfo, autocommit=autocommit) as connection:
            cursor = connection.execute(query, parameters)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    # -- Redis under Sentinel ----------------------------------------------------------------
    def start_redis(self) -> None:
        for index in range(len(self.redis_ports)):
            self._start_redis_server(index, replica_of=None if index == 0 else self.redis_ports[0])
        for index, port in enumerate(self.sentinel_ports):
            config = self.dir / f"sentinel{index}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.redis_ports[0]} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
            )
            self._start(f"sentinel{index}", ["redis-sentinel", str(config)])
        for port in self.sentinel_ports:
            wait_until(lambda p=port: port_open(p), "a sentinel to listen")
        wait_until(lambda: self._sentinels_agree(), "the sentinels to see the master", 60, 0.2)

    def _start_redis_server(self, index: int, replica_of: int | None) -> None:
        port = str(self.redis_ports[index])
        command = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
        ]
        if replica_of is not None:
            command += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._start(f"redis{index}", command)
        wait_until(lambda: port_open(self.redis_ports[index]), "Redis to listen")

    def redis_master(self) -> int | None:
        """The master's port, as the first sentinel answering says."""
        for port in self.sentinel_ports:
            said = subprocess.run(
                ["redis-cli", "-p", str(port), "sentinel", "get-master-addr-by-name", MASTER],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            if len(said) == 2 and said[1].isdigit():
                return int(said[1])
        return None

    def _sentinels_agree(self) -> bool:
        return self.redis_master() == self.redis_ports[0] and all(
            "num-other-sentinels"
            in subprocess.run(
                ["redis-cli", "-p", str(port), "sentinel", "master", MASTER],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
            for port in self.sentinel_ports
        )

    def kill_redis_master(self) -> int:
        """SIGKILL the master; returns the index of the killed server."""
        master = self.redis_master()
        index = self.redis_ports.index(master) if master in self.redis_ports else 0
        self.kill(f"redis{index}")
        return index

    def restart_redis_server(self, index: int) -> None:
        """The killed server comes back empty; the sentinels make it a replica of the master."""
        master = self.redis_master()
        self._start_redis_server(
            index, replica_of=master if master != self.redis_ports[index] else None
        )

    def shutdown_redis(self) -> None:
        for name in [n for n in self.processes if n.startswith(("sentinel", "redis"))]:
            self.kill(name)

    def close(self) -> None:
        self.stop_postgres()  # before the SIGKILLs of Stack.close: Patroni's children too
        super().close()

    def watchdog_last_run(self) -> float | None:
        self.redis_port = self.redis_master() or self.redis_ports[0]
        return super().watchdog_last_run()


def elapsed_until(predicate, timeout: float = 60.0) -> float:
    """Seconds until ``predicate()`` is true (polled every 50 ms)."""
    started = time.monotonic()
    wait_until(predicate, "the fail-over", timeout, 0.05)
    return time.monotonic() - started


__all__ = ["HAStack", "Path", "elapsed_until", "ha_missing"]
