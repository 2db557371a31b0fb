"""The rate-limit middlewares; the decisions are :class:`gateway.limits.rate_limiter.RateLimiter`'s.

:class:`ChallengeRateLimit` counts requests without a credential (they get a 402) per client IP;
:class:`ScopeRateLimit` applies a public route's declared limits before its handler. The paid and
sign-in middlewares call the same limiter at the point their own flow defines.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.limits.rate_limiter import RateLimiter
from gateway.routing.routes import RateLimitSpec
from gateway.web.asgi import ASGIApp, Receive, Scope, Send, header


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
        await self.limiter.charge(self.specs)
        await self.app(scope, receive, send)
