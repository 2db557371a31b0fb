"""The embedded in-process store: the default for local runs and the sandbox.

It is the Redis backend over an in-process Redis (``fakeredis``, its Lua run by ``lupa``), so it
runs the very scripts of ``gateway.store.lua`` that Redis and Upstash run: no store behaviour is
written twice. It serves exactly one process. Replay protection and rate limits would not hold
across workers, so ``serve --workers 2`` on it is refused by the CLI.
"""

from __future__ import annotations

from fakeredis import FakeAsyncRedis, FakeServer

from gateway.store.redis import RedisStore


class MemoryStore(RedisStore):
    """A private in-process Redis per store: two stores never see each other's keys."""

    def __init__(self) -> None:
        server = FakeServer(version=(7,))
        self._bind(FakeAsyncRedis(server=server, decode_responses=True), None)

    async def size(self) -> int:
        """Keys held, the expired ones swept out (as Redis sweeps them: memory stays bounded by
        what is live, one bucket per client IP included)."""
        return int(await self._call(self._redis.dbsize()))
