"""Rate limits backed by the shared store.

:class:`RateLimiter` makes one atomic store decision per bucket and is called by the access
middlewares at the point their flow defines (after decoding, before verifying).
:class:`ChallengeRateLimit` is the middleware for unpaid challenges, keyed by client IP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.asgi import ASGIApp, Receive, Scope, Send, header
from gateway.clientip import client_ip
from gateway.config import IpNetwork
from gateway.errors import ErrorCode, GatewayError
from gateway.routes import RateLimitSpec
from gateway.store import Store, StoreUnavailable


class RateLimiter:
    """One GCRA decision per call in the shared store; over the limit raises 429.

    ``challenge_spec`` is the per-client-IP bucket of 402 challenges: requests without a
    credential, and requests whose credential was refused (each earns a fresh challenge, so junk
    headers must not make challenges unlimited).
    """

    def __init__(
        self,
        store: Store,
        challenge_spec: RateLimitSpec | None = None,
        trusted_proxies: Sequence[IpNetwork] = (),
    ) -> None:
        self.store = store
        self.challenge_spec = challenge_spec
        self.trusted_proxies = tuple(trusted_proxies)

    async def challenge(self, scope: Scope) -> None:
        """Count one 402 challenge against the client's IP."""
        if self.challenge_spec is not None:
            await self.hit(self.challenge_spec, client_ip(scope, self.trusted_proxies))

    async def hit(self, spec: RateLimitSpec, subject: str | None = None) -> None:
        key = f"x402gw:rl:{spec.scope}" if subject is None else f"x402gw:rl:{spec.scope}:{subject}"
        try:
            decision = await self.store.rate_limit(key, spec.limit, spec.period_ms)
        except StoreUnavailable as exc:
            raise GatewayError(
                ErrorCode.STORE_UNAVAILABLE, "state store unavailable, try again later"
            ) from exc
        if not decision.allowed:
            retry_after = max(1, math.ceil(decision.retry_after_ms / 1000))
            raise GatewayError(
                ErrorCode.RATE_LIMITED,
                f"rate limit exceeded for {spec.scope}, retry after {retry_after} s",
                {"scope": spec.scope, "limit": spec.limit, "periodSeconds": spec.period_ms / 1000},
                headers={"Retry-After": str(retry_after)},
            )


class ChallengeRateLimit:
    """Limit requests that carry no credential (they get a 402 challenge) per client IP."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter, credential_headers: Sequence[bytes]) -> None:
        self.app = app
        self.limiter = limiter
        self.credential_headers = tuple(credential_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not any(header(scope, name) for name in self.credential_headers):
            await self.limiter.challenge(scope)
        await self.app(scope, receive, send)


class ScopeRateLimit:
    """Apply a route's declared per-scope limits before its handler (public routes)."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter, specs: Sequence[RateLimitSpec]) -> None:
        self.app = app
        self.limiter = limiter
        self.specs = tuple(s for s in specs if s.per == "scope")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for spec in self.specs:
            await self.limiter.hit(spec)
        await self.app(scope, receive, send)
