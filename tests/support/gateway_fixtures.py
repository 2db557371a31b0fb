"""Pytest plugin: loopback upstreams for the gateway's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.support.upstream import Upstream


@pytest_asyncio.fixture(loop_scope="session")
async def upstream() -> AsyncIterator[Upstream]:
    """A fresh recording upstream per test (JSON-RPC result by default)."""
    server = Upstream()
    await server.start()
    yield server
    await server.stop()
