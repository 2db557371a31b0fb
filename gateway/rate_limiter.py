"""The gateway's rate-limit decisions, shared by every middleware that enforces a limit.

Two kinds, by what an overshoot would cost:

* the per-IP challenge limit (402 answers, which cost nothing but CPU) is decided in the process
  and synchronised with the store in the background (:mod:`gateway.synced_limit`): no store
  round trip per 402, and a stated bound on overshoot across replicas;
* the limits of a route (an upstream key's quota, a wallet's allowance) are exact: one atomic
  GCRA decision in the shared store per bucket, at the point the caller's flow defines.

Over a limit raises 429 ``rate_limited`` with ``Retry-After``; a store outage on an exact limit
raises ``StoreUnavailable`` (503 ``store_unavailable``, converted once in ``gateway.failures``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence

from gateway.asgi import Scope
from gateway.clientip import client_ip
from gateway.config import IpNetwork
from gateway.errors import ErrorCode, GatewayError
from gateway.routes import RateLimitSpec
from gateway.store import Bucket, RateDecision, Store, StoreUnavailable
from gateway.synced_limit import SyncedWindowLimit

CHALLENGE_SCOPE = "challenge:ip"


class RateLimiter:
    """Exact limits through the store; the challenge limit (if any) decided locally."""

    def __init__(
        self,
        store: Store,
        challenge_limit: SyncedWindowLimit | None = None,
        trusted_proxies: Sequence[IpNetwork] = (),
    ) -> None:
        self.store = store
        self.challenge_limit = challenge_limit
        self.trusted_proxies = tuple(trusted_proxies)
        self._sync: asyncio.Task[None] | None = None

    async def challenge(self, scope: Scope) -> None:
        """Count one 402 challenge against the client's IP (no store round trip)."""
        limit = self.challenge_limit
        if limit is None:
            return
        decision = limit.acquire(client_ip(scope, self.trusted_proxies))
        if not decision.allowed:
            raise rate_limited(limit.scope, limit.limit, limit.period_ms, decision)

    async def hit(self, spec: RateLimitSpec, subject: str | None = None) -> None:
        """One exact decision for ``spec``'s bucket (of ``subject``, for per-wallet limits); may
        raise ``StoreUnavailable``."""
        bucket = self.bucket(spec, subject)
        decision = await self.store.rate_limit(bucket.key, bucket.limit, bucket.period_ms)
        if not decision.allowed:
            raise self.refusal(spec, decision)

    def bucket(self, spec: RateLimitSpec, subject: str | None = None) -> Bucket:
        """The store bucket of ``spec`` (of ``subject``, for per-wallet limits), for callers that
        charge it together with other store work (the paid path)."""
        key = f"x402gw:rl:{spec.scope}" if subject is None else f"x402gw:rl:{spec.scope}:{subject}"
        return Bucket(key, spec.limit, spec.period_ms)

    def refusal(self, spec: RateLimitSpec, decision: RateDecision) -> GatewayError:
        """The 429 of a refused decision on ``spec``'s bucket."""
        return rate_limited(spec.scope, spec.limit, spec.period_ms, decision)

    def start(self) -> None:
        """Start sharing the challenge counts with the other processes (inside the event loop)."""
        if self.challenge_limit is not None and self._sync is None:
            self._sync = asyncio.create_task(self.challenge_limit.run(), name="challenge-limit-sync")

    async def stop(self) -> None:
        """Stop the background sync after one last exchange of counts."""
        if self._sync is None:
            return
        self._sync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sync
        self._sync = None
        if self.challenge_limit is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.challenge_limit.sync()


def rate_limited(scope: str, limit: int, period_ms: int, decision: RateDecision) -> GatewayError:
    retry_after = max(1, math.ceil(decision.retry_after_ms / 1000))
    return GatewayError(
        ErrorCode.RATE_LIMITED,
        f"rate limit exceeded for {scope}, retry after {retry_after} s",
        {"scope": scope, "limit": limit, "periodSeconds": period_ms / 1000},
        headers={"Retry-After": str(retry_after)},
    )
