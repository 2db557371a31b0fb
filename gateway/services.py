"""The long-lived parts one app shares: store, upstream sessions, facilitator, limiter, usage.

Created by the app factory; opened and closed by the app's lifespan, so every aiohttp session
lives inside the running event loop and exactly once per upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from gateway.config import Settings
from gateway.facilitators import Facilitator
from gateway.metrics import Usage
from gateway.routes import RouteSpec
from gateway.store import Store, open_store
from gateway.x402.siwx import SiwxIssuer, random_secret
from middleware.ratelimit import RateLimiter

UPSTREAM_CONNECTIONS = 100


class Services:
    def __init__(self, settings: Settings, routes: list[RouteSpec], store: Store | None = None) -> None:
        self.settings = settings
        self.routes = routes
        self.store = store or open_store(settings.store_url.reveal(), settings.store_token.reveal())
        self.limiter = RateLimiter(self.store)
        self.usage = Usage(self.store)
        self.facilitator: Facilitator | None = None
        self.upstream_names = sorted({r.upstream for r in routes if r.upstream})
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        secret = settings.siwx_secret.reveal().encode() or random_secret()
        statement = "Sign in to use the asset-data routes of this gateway. No funds move."
        self.siwx = SiwxIssuer(secret, settings.base_url, statement)
        self.extras: dict[str, Any] = {}

    def session(self, upstream: str) -> aiohttp.ClientSession:
        """The one session of ``upstream``; only valid while the app is running."""
        return self._sessions[upstream]

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.upstream_timeout_s)
        for name in self.upstream_names:
            connector = aiohttp.TCPConnector(limit=UPSTREAM_CONNECTIONS, ttl_dns_cache=300)
            self._sessions[name] = aiohttp.ClientSession(
                connector=connector, timeout=timeout, raise_for_status=False, auto_decompress=True
            )

    async def stop(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        if self.facilitator is not None:
            await self.facilitator.close()
        await self.store.close()

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()
