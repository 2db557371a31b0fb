"""Pytest plugin: loopback upstreams for the gateway's tests, and a client to call it with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio

from tests.support.log_capture import captured_log_lines
from tests.support.upstream import Upstream, asset_data


@pytest_asyncio.fixture(loop_scope="session")
async def upstream() -> AsyncIterator[Upstream]:
    """A fresh recording upstream per test (JSON-RPC result by default)."""
    server = Upstream()
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def asset_api_server() -> AsyncIterator[Upstream]:
    """The asset-data API, one per module, so a module's gateway can outlive a test (take
    ``asset_api`` in the test itself for a clean record)."""
    server = Upstream(responder=asset_data)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def asset_api(asset_api_server: Upstream) -> Iterator[Upstream]:
    """The module's asset-data API, answering as ``asset_data`` with no calls recorded yet;
    a test may script other answers, undone after it."""
    asset_api_server.responder = asset_data
    asset_api_server.calls.clear()
    yield asset_api_server
    asset_api_server.responder = asset_data


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for the test, closed after it; a request that hangs fails in 30 s, not at
    the suite's timeout."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every log line of the test's in-process gateways, as rendered for stdout."""
    with captured_log_lines() as lines:
        yield lines
