"""Throwaway Redis topologies on loopback for the HA tests: a primary with a replica watched
by one Sentinel, and a Redis Cluster of three primaries. Each process lives in the test's
directory on a free port and is stopped by the test (SIGKILL included: the failover tests
kill the primary). With `tls` (tests/redis_tls.py) every process serves TLS only, and
replication, the cluster bus and Sentinel's links to the servers are TLS too."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import redis

from tests.redis_server import REDIS_SERVER
from tests.redis_tls import TlsFiles

REDIS_CLI = (REDIS_SERVER or "redis-server").replace("redis-server", "redis-cli")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    """One redis-server (or sentinel) with `args`, without persistence, in `directory`."""

    def __init__(self, directory: Path, *args: str, config: str | None = None, password: str | None = None,
                 tls: TlsFiles | None = None, bind: str = "127.0.0.1") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.password = password
        self.tls = tls
        self.port = free_port()
        command = [REDIS_SERVER or "redis-server"]
        # TLS only: no plain port; replication (and Sentinel's links) over TLS too
        ports = ["--port", "0", "--tls-port", str(self.port), *tls.server_args(), "--tls-replication", "yes"] \
            if tls else ["--port", str(self.port)]
        if config is not None:  # Sentinel needs a writable config file of its own
            path = directory / "sentinel.conf"
            path.write_text(f"bind {bind}\n{config}")
            command += [str(path), "--sentinel", *ports]
        else:
            command += [*ports, "--bind", bind, "--save", "", "--appendonly", "no",
                        "--dir", str(directory), *args]
            if password:
                command += ["--requirepass", password, "--masterauth", password]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        cwd=directory)
        self.wait_ready()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True,
                           password=self.password, **(self.tls.client_kwargs() if self.tls else {}))

    def connection(self) -> redis.Connection:
        """One raw connection (a cluster node's own answers, without a cluster client)."""
        if self.tls:
            kwargs = self.tls.client_kwargs()
            kwargs.pop("ssl")
            return redis.SSLConnection(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True,
                                       **kwargs)
        return redis.Connection(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True)

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis on port {self.port} exited with {self.process.returncode}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis on port {self.port} did not answer within {timeout}s")
                time.sleep(0.02)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout}s")
        time.sleep(0.05)


class SentinelSet:
    """A primary, its replica and one Sentinel watching them as SERVICE."""

    SERVICE = "governor-primary"

    def __init__(self, directory: Path, password: str | None = None, sentinel_password: str | None = None,
                 tls: TlsFiles | None = None) -> None:
        self.processes: list[RedisProcess] = []
        self.tls = tls
        auth = f"sentinel auth-pass {self.SERVICE} {password}\n" if password else ""
        own = f"requirepass {sentinel_password}\n" if sentinel_password else ""
        try:
            self.primary = self._add(RedisProcess(directory / "primary", password=password, tls=tls))
            self.replica = self._add(RedisProcess(directory / "replica", "--replicaof", "127.0.0.1",
                                                  str(self.primary.port), password=password, tls=tls))
            with self.replica.client() as c:
                wait_until(lambda: c.info("replication").get("master_link_status") == "up", 10,
                           "the replica did not sync")
            self.sentinel = self._add(RedisProcess(
                directory / "sentinel",
                config=(f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 1\n"
                        f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
                        f"sentinel failover-timeout {self.SERVICE} 5000\n"
                        f"sentinel parallel-syncs {self.SERVICE} 1\n" + auth + own),
                password=sentinel_password, tls=tls))
            with self.sentinel.client() as c:  # the Sentinel has found the replica
                wait_until(lambda: len(c.sentinel_slaves(self.SERVICE)) == 1, 15, "the sentinel found no replica")
        except BaseException:
            self.stop()
            raise

    def _add(self, process: RedisProcess) -> RedisProcess:
        self.processes.append(process)
        return process

    def url(self, query: str = "") -> str:
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return f"{scheme}://127.0.0.1:{self.sentinel.port}/{self.SERVICE}/0" + (f"?{query}" if query else "")

    def primary_port(self) -> int:
        with self.sentinel.client() as c:
            return int(c.sentinel_get_master_addr_by_name(self.SERVICE)[1])

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


class Cluster:
    """Three primaries in one Redis Cluster, every slot assigned; with `replicas`, each
    primary has that many replicas (a failover takes a few `node_timeout_ms`)."""

    def __init__(self, directory: Path, size: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                 tls: TlsFiles | None = None) -> None:
        self.nodes: list[RedisProcess] = []
        self.tls = tls
        bus = ["--tls-cluster", "yes"] if tls else []
        try:
            for i in range(size * (1 + replicas)):
                self.nodes.append(RedisProcess(directory / f"node-{i}", "--cluster-enabled", "yes",
                                               "--cluster-config-file", "nodes.conf",
                                               "--cluster-port", str(free_port()),  # not port + 10000
                                               "--cluster-node-timeout", str(node_timeout_ms), *bus, tls=tls))
            subprocess.run([REDIS_CLI, *(tls.cli_args() if tls else []), "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", str(replicas), "--cluster-yes"], check=True, timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # every node, not only the first: until gossip reaches a node it answers CLUSTERDOWN
            for node in self.nodes:
                with node.client() as c:
                    wait_until(lambda: "cluster_state:ok" in str(c.execute_command("CLUSTER", "INFO"))
                               and "cluster_slots_ok:16384" in str(c.execute_command("CLUSTER", "INFO")),
                               15, f"the cluster is not ok on node {node.port}")
                    if c.info("replication").get("role") == "slave":
                        wait_until(lambda: c.info("replication").get("master_link_status") == "up", 15,
                                   f"the replica on {node.port} did not sync")
        except BaseException:
            self.stop()
            raise

    def add_replica(self, directory: Path, primary: int, node_timeout_ms: int = 1000) -> RedisProcess:
        """A new node, joined as a replica of the primary on port `primary` (as an operator's
        supervisor would bring one back after a failover), synced."""
        node = RedisProcess(directory, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                            "--cluster-port", str(free_port()), "--cluster-node-timeout", str(node_timeout_ms),
                            *(["--tls-cluster", "yes"] if self.tls else []), tls=self.tls)
        self.nodes.append(node)
        with self.node(primary).client() as c:
            primary_id = c.execute_command("CLUSTER", "MYID")
        command = [REDIS_CLI, *(self.tls.cli_args() if self.tls else []), "--cluster", "add-node",
                   f"127.0.0.1:{node.port}", f"127.0.0.1:{primary}", "--cluster-slave", "--cluster-master-id", primary_id]
        deadline = time.monotonic() + 30
        while True:  # right after a failover the nodes may not agree yet ("[ERR] Nodes don't agree"): again
            done = subprocess.run(command, timeout=30, capture_output=True, text=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-cli --cluster add-node failed: {done.stdout[-2000:]}{done.stderr[-1000:]}")
            time.sleep(0.5)
        with node.client() as c:
            wait_until(lambda: c.info("replication").get("master_link_status") == "up", 15,
                       f"the new replica on {node.port} did not sync")
        return node

    def node(self, port: int) -> RedisProcess:
        return next(n for n in self.nodes if n.port == port)

    def owner(self, key: str) -> int:
        """The port of the primary serving `key`'s slot, as the first live node says."""
        for candidate in self.nodes:
            if candidate.process.poll() is not None:
                continue
            connection = candidate.connection()
            try:
                connection.send_command("CLUSTER", "KEYSLOT", key)
                slot = connection.read_response()
                connection.send_command("CLUSTER", "SLOTS")
                for start, end, primary, *_ in connection.read_response():
                    if start <= slot <= end:
                        return int(primary[1])
            finally:
                connection.disconnect()
        raise AssertionError(f"no owner of {key}")

    def url(self, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://{hosts}" + (f"?{query}" if query else "")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def sentinel_set(directory: Path, **options: Any) -> Iterator[SentinelSet]:
    s = SentinelSet(directory, **options)
    try:
        yield s
    finally:
        s.stop()


@contextmanager
def cluster(directory: Path, **shape: Any) -> Iterator[Cluster]:
    c = Cluster(directory, **shape)
    try:
        yield c
    finally:
        c.stop()
