"""The Upstash REST backend: the same commands and script as the Redis backend, over HTTPS.

The client has no timeout of its own and retries after 3 s by default, so each call is bounded
here and client retries are off (a retried SET NX or script could double-count; we fail closed).
Failures become :class:`StoreUnavailable` naming only the kind of failure, never the URL or token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from upstash_redis.asyncio import Redis
from upstash_redis.errors import UpstashError

from gateway.store.base import STORE_TIMEOUT_S, Script, StoreUnavailable
from gateway.store.lua import counters_from_reply, text_from_reply, totals_from_replies

T = TypeVar("T")


class UpstashStore:
    """Store over ``upstash_redis.asyncio``; one HTTP connection pool per process."""

    def __init__(self, url: str, token: str, *, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self._redis = Redis(url, token, rest_retries=0, allow_telemetry=False)
        self.timeout_s: float | None = timeout_s

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Await one request with a deadline, turning every failure into StoreUnavailable.

        The client's failures are untyped (httpx errors, JSON and base64 decoding errors, missing
        keys in a malformed answer), so anything but cancellation counts as unavailable.
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                return await awaitable
        except UpstashError as exc:
            # The server's own error text ("ERR ...", "Unauthorized") names no secret.
            raise StoreUnavailable(f"upstash store error: {exc}") from None
        except Exception as exc:
            raise StoreUnavailable(f"upstash store unreachable ({type(exc).__name__})") from None

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        # The client answers True when set and False (not None) when the key exists.
        result: Any = await self._call(self._redis.set(key, value, nx=True, px=ttl_ms))
        return result is True

    async def get(self, key: str) -> str | None:
        return text_from_reply(await self._call(self._redis.get(key)))

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        await self._call(self._redis.set(key, value, px=ttl_ms))

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> object:
        reply: object = await self._call(self._script(script, list(keys), list(args)))
        return reply

    async def _script(self, script: Script, keys: list[str], args: list[str]) -> Any:
        """EVALSHA, and on a server that has not seen the script yet, EVAL (which caches it)."""
        try:
            return await self._redis.evalsha(script.sha1, keys=keys, args=args)
        except UpstashError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self._redis.eval(script.source, keys=keys, args=args)

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        if not deltas:
            return {}
        transaction = self._redis.multi()
        for key, delta in deltas.items():
            transaction.incrby(key, delta)
        return totals_from_replies(list(deltas), await self._call(transaction.exec()), per_key=1)

    async def counters(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        return counters_from_reply(keys, await self._call(self._redis.mget(*keys)))

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline()
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
            pipe.pexpire(key, ttl_ms)
        return totals_from_replies(list(deltas), await self._call(pipe.exec()))

    async def ping(self) -> bool:
        """True when the server answers; False (not an exception) so health checks stay simple."""
        try:
            await self._call(self._redis.ping())
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        await self._redis.close()
