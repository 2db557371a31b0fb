"""The gateway's rate-limit decisions, shared by every middleware that enforces a limit.

Two kinds, by what an overshoot would cost:

* the per-IP challenge limit (402 answers, which cost nothing but CPU) is decided in the process
  and synchronised with the store in the background (:mod:`gateway.synced_limit`): no store
  round trip per 402, and a stated bound on overshoot across replicas;
* the limits of a route (an upstream key's quota, a wallet's allowance) are exact: atomic GCRA
  decisions in the shared store, all of a request's buckets in one round trip, at the point the
  caller's flow defines (the paid path charges them together with its payment look-up).

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

    def buckets(self, specs: Sequence[RateLimitSpec], wallet: str | None = None) -> list[Bucket]:
        """The store buckets of ``specs``, in order; a per-wallet spec counts ``wallet``'s own
        requests, every other one the whole scope's."""
        return [
            Bucket(
                f"x402gw:rl:{spec.scope}" if spec.per != "wallet" else f"x402gw:rl:{spec.scope}:{wallet}",
                spec.limit,
                spec.period_ms,
            )
            for spec in specs
        ]

    def enforce(self, specs: Sequence[RateLimitSpec], decisions: Sequence[RateDecision]) -> None:
        """Raise the 429 of the first refused decision (``decisions`` follow ``specs``' order)."""
        for spec, decision in zip(specs, decisions, strict=False):
            if not decision.allowed:
                raise rate_limited(spec.scope, spec.limit, spec.period_ms, decision)

    async def charge(self, specs: Sequence[RateLimitSpec], wallet: str | None = None) -> None:
        """Exact decisions for ``specs``' buckets in one atomic store round trip, in order and
        stopping at the first refusal, so a refused request spends no later bucket; raises the
        429, or ``StoreUnavailable``."""
        if specs:
            found = await self.store.check_then_limit([], self.buckets(specs, wallet))
            self.enforce(specs, found.decisions)

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
