"""The embedded in-process store: the default for local runs and the sandbox.

It serves exactly one process. Replay protection and rate limits would not hold across
workers, so ``serve --workers 2`` on it is refused by the CLI.
"""

from __future__ import annotations

import time

from gateway.store.base import RateDecision


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def gcra(tat_ms: int | None, now_ms: int, limit: int, period_ms: int) -> tuple[RateDecision, int | None]:
    """One GCRA step: the decision and the new theoretical arrival time (None: unchanged).

    The Lua script of the Redis backends implements these same lines.
    """
    interval = max(period_ms // max(limit, 1), 1)
    tat = max(tat_ms if tat_ms is not None else now_ms, now_ms)
    new_tat = tat + interval
    allow_at = new_tat - period_ms
    if allow_at > now_ms:
        return RateDecision(allowed=False, retry_after_ms=allow_at - now_ms), None
    return RateDecision(allowed=True), new_tat


PRUNE_EVERY = 10_000
"""Writes between sweeps of expired entries, so per-IP buckets cannot grow without bound."""


class MemoryStore:
    """Dict-backed store with lazy expiry and periodic sweeps; safe because one event loop owns it."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, int]] = {}
        self._counters: dict[str, int] = {}
        self._tats: dict[str, int] = {}
        self._writes = 0

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes % PRUNE_EVERY == 0:
            self.prune()

    def prune(self) -> None:
        """Drop expired values and rate-limit buckets whose allowance is full again."""
        now = _now_ms()
        self._values = {k: v for k, v in self._values.items() if v[1] > now}
        self._tats = {k: tat for k, tat in self._tats.items() if tat > now}

    def size(self) -> int:
        """Entries held (values and buckets); not ``__len__``, so an empty store stays truthy."""
        return len(self._values) + len(self._tats)

    def _live(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires <= _now_ms():
            del self._values[key]
            return None
        return value

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        if self._live(key) is not None:
            return False
        self._values[key] = (value, _now_ms() + ttl_ms)
        self._wrote()
        return True

    async def get(self, key: str) -> str | None:
        return self._live(key)

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        self._values[key] = (value, _now_ms() + ttl_ms)
        self._wrote()

    async def rate_limit(self, key: str, limit: int, period_ms: int) -> RateDecision:
        decision, new_tat = gcra(self._tats.get(key), _now_ms(), limit, period_ms)
        if new_tat is not None:
            self._tats[key] = new_tat
            self._wrote()
        return decision

    async def incr(self, key: str, amount: int = 1) -> int:
        value = self._counters.get(key, 0) + amount
        self._counters[key] = value
        return value

    async def counters(self, keys: list[str]) -> dict[str, int]:
        return {key: self._counters.get(key, 0) for key in keys}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
