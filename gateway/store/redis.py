"""The Redis-protocol backend (Redis, Valkey, or anything speaking RESP): one pool per process.

Every failure becomes :class:`StoreUnavailable`. The URL may carry a password, so a connection
failure is named only by its kind (the client's own text names the host) and no original
exception is chained; a server's error reply ("ERR ...") is kept, as it holds no secret.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from gateway.store.base import STORE_TIMEOUT_S, Script, StoreUnavailable
from gateway.store.lua import counters_from_reply, text_from_reply, totals_from_replies

T = TypeVar("T")
MAX_CONNECTIONS = 100


class RedisStore:
    """Store over ``redis.asyncio``; the rate limit runs as one server-side script."""

    timeout_s: float | None
    atomic_batches: bool = True
    """A batch of counter increments is one transaction (MULTI/EXEC) on one server; a cluster has
    no transaction across slots, so there each INCRBY is atomic on its own and a failure part-way
    leaves some added, as a lost flush of usage counts would anyway."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = STORE_TIMEOUT_S,
        health_check_interval_s: int = 15,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        try:
            # A blocking pool: past max_connections a command waits up to timeout_s for a free
            # connection. The default pool raises at once (redis-py caps it at 100), which turned a
            # burst of concurrent requests into 503s.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=timeout_s,
                decode_responses=True,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                health_check_interval=health_check_interval_s,
                # One immediate retry, on a dropped connection only (never a timeout): it rescues a
                # pooled connection the server closed, and a repeated SET NX can only lose the claim.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            )
        except ValueError:
            raise ValueError("STATE_STORE_REST_URL is not a valid redis:// URL") from None
        self._bind(aioredis.Redis.from_pool(pool), timeout_s)

    def _bind(self, client: aioredis.Redis | RedisCluster, timeout_s: float | None) -> None:
        """Run every operation on ``client``: a server's, a cluster's (the same commands, routed by
        slot) or the in-process one's."""
        self.timeout_s = timeout_s
        self._redis: aioredis.Redis | RedisCluster = client
        self._scripts: dict[str, AsyncScript] = {}
        """Each script run so far, registered once: it sends EVALSHA, and the source on NOSCRIPT."""

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Await one command, turning every client failure into StoreUnavailable."""
        try:
            return await awaitable
        except ResponseError as exc:
            raise StoreUnavailable(f"redis store error: {exc}") from None
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis store unreachable ({type(exc).__name__})") from None

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        return bool(await self._call(self._redis.set(key, value, nx=True, px=ttl_ms)))

    async def get(self, key: str) -> str | None:
        value: Any = await self._call(self._redis.get(key))
        return text_from_reply(value)

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        await self._call(self._redis.set(key, value, px=ttl_ms))

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> object:
        runner = self._scripts.get(script.sha1)
        if runner is None:
            runner = self._scripts[script.sha1] = self._redis.register_script(script.source)
        reply: object = await self._call(runner(keys=list(keys), args=list(args)))
        return reply

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline(transaction=self.atomic_batches)
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
        replies: Any = await self._call(pipe.execute())
        return totals_from_replies(list(deltas), replies, per_key=1)

    async def counters(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        values: Any = await self._call(self._redis.mget(keys))
        return counters_from_reply(keys, values)

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
            pipe.pexpire(key, ttl_ms)
        replies: Any = await self._call(pipe.execute())
        return totals_from_replies(list(deltas), replies)

    async def ping(self) -> bool:
        """True when the server answers; False (not an exception) so health checks stay simple."""
        try:
            return bool(await self._call(self._redis.ping()))
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        await self._redis.aclose()
