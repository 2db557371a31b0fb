"""The store protocol every backend implements, and the factory that picks one.

Semantics are shared by all backends and pinned by ``tests/test_store_contract.py``:

* ``claim`` is an atomic set-if-absent with a TTL: exactly one caller wins, across processes.
* ``rate_limit`` is GCRA: up to ``limit`` requests in any ``period_ms`` window, with the
  allowance refilling evenly; one atomic decision per call, using the store's clock so that
  many gateway processes share one bucket exactly.
* Every failure to reach the backend raises :class:`StoreUnavailable`, so callers fail closed.
"""

from __future__ import annotations

from typing import Protocol

import msgspec


class StoreUnavailable(Exception):
    """The backend could not be reached or answered garbage; payments must fail closed."""


class RateDecision(msgspec.Struct, frozen=True):
    allowed: bool
    retry_after_ms: int = 0


class Store(Protocol):
    """Shared state: replay claims, cached values, rate limits and counters."""

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        """Set ``key`` to ``value`` only if absent; True when this call set it."""

    async def get(self, key: str) -> str | None:
        """The value at ``key``, or None when absent or expired."""

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        """Set ``key`` unconditionally with a TTL."""

    async def rate_limit(self, key: str, limit: int, period_ms: int) -> RateDecision:
        """Count one request against ``key`` and decide whether it is allowed."""

    async def incr(self, key: str, amount: int = 1) -> int:
        """Add ``amount`` to the counter at ``key`` (no TTL) and return the new value."""

    async def counters(self, keys: list[str]) -> dict[str, int]:
        """Current values of the counters at ``keys`` (absent counters are 0)."""

    async def ping(self) -> bool:
        """True when the backend answers."""

    async def close(self) -> None:
        """Release connections."""


def open_store(url: str | None, token: str | None) -> Store:
    """Pick the backend by the scheme of ``STATE_STORE_REST_URL``.

    ``https://`` / ``http://``: Upstash REST; ``redis://`` / ``rediss://``: Redis protocol;
    unset or ``memory://``: the in-process store (one process only).
    """
    if not url or url.startswith("memory://"):
        from gateway.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith(("redis://", "rediss://")):
        from gateway.store.redis import RedisStore

        return RedisStore(url)
    if url.startswith(("https://", "http://")):
        from gateway.store.upstash import UpstashStore

        return UpstashStore(url, token or "")
    raise ValueError(
        "STATE_STORE_REST_URL must start with https://, http://, redis://, rediss:// or memory://"
    )
