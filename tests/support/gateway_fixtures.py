"""Pytest plugin: loopback upstreams for the gateway's tests, and a client to call it with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio

from tests.support.upstream import Upstream


@pytest_asyncio.fixture(loop_scope="session")
async def upstream() -> AsyncIterator[Upstream]:
    """A fresh recording upstream per test (JSON-RPC result by default)."""
    server = Upstream()
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for the test, closed after it."""
    async with aiohttp.ClientSession() as session:
        yield session
