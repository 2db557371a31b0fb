"""Pytest plugin: one real Redis-protocol server per test session, Upstash REST in front of it, and
a real 3-master Redis Cluster for the tests that ask for one.

``$REDIS_URL`` (a disposable database: tests flush it) replaces the local server, e.g. in CI
with a Redis service container.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from gateway.store import Store, open_store
from gateway.store.cluster import CLUSTER_SCHEMES, RedisClusterStore
from gateway.store.redis import RedisStore
from tests.support.redis_cluster import RedisCluster, flush, start_redis_cluster
from tests.support.redis_server import RedisServer, start_redis_server
from tests.support.upstash_rest import UpstashRestServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis-protocol server that lives for the whole session."""
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    with start_redis_server() as server:
        yield server.url


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis server of the test's own, which the test may stop (store-outage tests)."""
    with start_redis_server() as server:
        yield server


@pytest.fixture
def clean_redis_url(redis_url: str) -> str:
    """``redis_url`` after FLUSHDB (every node's FLUSHALL where a module runs on the cluster), for
    tests that must not see another test's keys."""
    flush(redis_url)
    return redis_url


@pytest.fixture
def private_store(redis_url: str) -> Iterator[RedisServer | RedisCluster]:
    """A store of the test's own, which the test may stop (store-outage tests), of the kind
    ``redis_url`` is: a Redis server, or a 3-master cluster where the module runs on one."""
    start = start_redis_cluster if redis_url.startswith(CLUSTER_SCHEMES) else start_redis_server
    with start() as store:
        yield store


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def upstash_url_and_token(redis_url: str) -> AsyncIterator[tuple[str, str]]:
    """Base URL and bearer token of an Upstash REST server backed by the session's Redis."""
    token = secrets.token_urlsafe(24)
    server = UpstashRestServer(redis_url, token)
    url = await server.start()
    yield url, token
    await server.stop()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """``redis+cluster://`` URL of a 3-master cluster on loopback that lives for the whole session
    (started on first use: some 3 s while the nodes agree on the slots)."""
    with start_redis_cluster() as cluster:
        yield cluster.url


@pytest.fixture
def clean_cluster_url(redis_cluster_url: str) -> str:
    """``redis_cluster_url`` after FLUSHALL on every node."""
    flush(redis_cluster_url)
    return redis_cluster_url


def on_redis_and_cluster() -> Any:
    """A module's ``redis_url`` for its money tests: single-node Redis, then the 3-master cluster
    (``redis_url = on_redis_and_cluster()`` in the module). Every test of the module that uses
    ``redis_url`` (or ``clean_redis_url``, ``clean_store``) runs on both, the module's gateways
    started once per store; only the money-critical modules do this, so the suite pays for the
    cluster where an invariant could break on it. A test that checks no store invariant keeps to
    single-node Redis with :data:`ON_REDIS_ONLY`."""

    @pytest.fixture(scope="module", params=["redis", "cluster"], name="redis_url")
    def module_redis_url(request: pytest.FixtureRequest, redis_url: str) -> str:
        return redis_url if request.param == "redis" else str(request.getfixturevalue("redis_cluster_url"))

    return module_redis_url


ON_REDIS_ONLY = pytest.mark.parametrize("redis_url", ["redis"], indirect=True)
"""In a module of :func:`on_redis_and_cluster`: this test runs on single-node Redis alone, as it
watches one server (its ``MONITOR``, an ACL of its own, Upstash in front of it) or checks nothing
a cluster could change."""


def store_at(url: str, timeout_s: float) -> Store:
    """The Redis store of ``url`` (a cluster's for a ``redis+cluster://`` one) waiting up to
    ``timeout_s`` for the server, for a test whose loop a loaded machine holds for seconds."""
    if url.startswith(CLUSTER_SCHEMES):
        return RedisClusterStore(url, timeout_s=timeout_s)
    return RedisStore(url, timeout_s=timeout_s)


@pytest_asyncio.fixture(loop_scope="session")
async def clean_store(clean_redis_url: str) -> AsyncIterator[Store]:
    """A store client of ``clean_redis_url`` (the backend its scheme names: a cluster's where the
    module runs on one), closed after the test."""
    store = open_store(clean_redis_url, None)
    yield store
    await store.close()


STORE_KINDS = ("memory", "redis", "upstash", "cluster")
"""Every backend a store's money behaviour is tested on."""


def fresh_store(request: pytest.FixtureRequest, kind: str, upstash: tuple[str, str] | None = None) -> Store:
    """A store of ``kind`` with nothing in it, for one test: the server behind it flushed
    (Upstash's is the session's Redis). ``upstash`` is the ``upstash_url_and_token`` fixture,
    taken by the caller as a direct dependency: pulled lazily from inside an async fixture, its
    set-up would land in the running event loop."""
    if kind == "memory":
        from gateway.store.memory import MemoryStore

        return MemoryStore()
    if kind == "cluster":
        return open_store(request.getfixturevalue("clean_cluster_url"), None)
    url = request.getfixturevalue("clean_redis_url")
    if kind == "upstash":
        if upstash is None:
            raise ValueError("an Upstash store needs the upstash_url_and_token fixture")
        return open_store(*upstash)
    return open_store(url, None)
