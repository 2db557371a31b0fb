"""The Redis Cluster backend: the Redis backend's scripts over ``redis.asyncio.cluster``.

``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster://`` for TLS)
names the startup nodes; the client learns the rest of the cluster from them. Every script keeps
to one slot (every key shares one hash tag: ``gateway.store.keys``, ``docs/store.md``), so the
cluster runs each on the one node that owns it. Batches of independent keys (usage counters,
limit windows, hold sets) are pipelines, split per node should their keys ever span nodes, each
key's change atomic on its own.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import unquote

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, ConnectionError, SlotNotCoveredError

from gateway.store.base import STORE_TIMEOUT_S, StoreUnavailable
from gateway.store.lua import counters_from_reply
from gateway.store.redis import MAX_CONNECTIONS, RedisStore

BAD_CLUSTER_URL = "STATE_STORE_REST_URL is not a valid redis+cluster://host:port[,host:port...] URL"


T = TypeVar("T")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """The startup nodes (host, port), username, password and TLS of a cluster URL; ValueError
    (naming no part of the URL: it may hold a password) when it is not one."""
    scheme = next((s for s in CLUSTER_SCHEMES if url.startswith(s)), None)
    if scheme is None:
        raise ValueError(BAD_CLUSTER_URL)
    rest = url[len(scheme) :]
    userinfo, at, hosts = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts, _, database = hosts.partition("/")
    if database not in ("", "0"):  # a cluster has one database
        raise ValueError(BAD_CLUSTER_URL)
    nodes: list[tuple[str, int]] = []
    for node in hosts.split(","):
        host, colon, port = node.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(BAD_CLUSTER_URL)
        nodes.append((host, int(port)))
    return nodes, username, password, scheme == "rediss+cluster://"


def _discard(awaitable: Awaitable[object]) -> None:
    """Close a command's coroutine that will never be awaited (no "never awaited" warning)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


class _Cluster(RedisCluster):
    """The cluster client, retrying only what cannot have run: a dropped connection, a cluster
    that is down or a slot not covered (after learning the slots again). Never a timeout: a
    script that timed out may have run, and running it twice could count a payment twice."""

    ERRORS_ALLOW_RETRY = (ConnectionError, ClusterDownError, SlotNotCoveredError)  # type: ignore[assignment]


class RedisClusterStore(RedisStore):
    """Store over a Redis Cluster (or Valkey cluster, or a cluster-mode managed Redis)."""

    atomic_batches = False

    def __init__(
        self, url: str, *, timeout_s: float = STORE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        nodes, username, password, tls = parse_cluster_url(url)
        client = _Cluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            username=username,
            password=password,
            ssl=tls,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            max_connections=max_connections,
            retry=Retry(NoBackoff(), 1),
        )
        self._bind(client, timeout_s)
        self._cluster = client
        self._learning = asyncio.Lock()
        self._timeout_s = timeout_s
        self._free = asyncio.Semaphore(max_connections)
        """Commands in flight, at most a node's pool: the cluster client raises at once when a
        node's pool is used up, where the single-node backend's blocking pool waits (a burst of
        concurrent requests would be 503s). Every gateway key lives on one node, so this bounds
        that node's connections."""

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Learn the cluster's slots once, before the first command: commands sent concurrently
        while the client learns them found connections half made (redis-py initialises lazily,
        on each command, until ``_initialize`` is cleared)."""
        if self._cluster._initialize:
            try:
                async with self._learning:
                    if self._cluster._initialize:
                        await super()._call(self._cluster.initialize())
            except BaseException:
                _discard(awaitable)
                raise
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._free.acquire()
        except TimeoutError:
            _discard(awaitable)
            raise StoreUnavailable("redis store unreachable (no free connection in time)") from None
        try:
            return await super()._call(awaitable)
        finally:
            self._free.release()

    async def counters(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        cluster: Any = self._redis
        values: Any = await self._call(cluster.mget_nonatomic(keys))
        return counters_from_reply(keys, values)
