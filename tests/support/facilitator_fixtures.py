"""pytest plugin: a running fake CDP facilitator and the API keys that authenticate to it.

``cdp_facilitator`` is the everyday fixture (Ed25519 key, CDP's recommended kind);
``cdp_facilitator_es256`` uses a PEM EC key; ``start_cdp_facilitator`` starts more with any
credentials or backend. Each fake exposes ``base_url`` and ``credentials.key_id`` /
``credentials.secret`` for the client under test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.support.cdp_facilitator import (
    CdpCredentials,
    CdpFacilitatorServer,
    FacilitatorBackend,
    StaticBackend,
    closed_port_url,
    make_ed25519_credentials,
    make_es256_credentials,
)

StartFacilitator = Callable[..., Awaitable[CdpFacilitatorServer]]


@pytest.fixture
def cdp_credentials() -> CdpCredentials:
    """A fresh Ed25519 CDP API key (base64 seed + public key)."""
    return make_ed25519_credentials()


@pytest.fixture
def cdp_es256_credentials() -> CdpCredentials:
    """A fresh P-256 CDP API key (``EC PRIVATE KEY`` PEM)."""
    return make_es256_credentials()


@pytest.fixture
async def start_cdp_facilitator() -> AsyncIterator[StartFacilitator]:
    """Factory: ``await start(credentials=..., backend=...)``; every fake is stopped (and a
    backend with a ``close()`` closed) afterwards.

    ``credentials=None`` means a facilitator that needs no authentication.
    """
    started: list[CdpFacilitatorServer] = []

    async def start(
        credentials: CdpCredentials | None = None, backend: FacilitatorBackend | None = None
    ) -> CdpFacilitatorServer:
        server = CdpFacilitatorServer(backend=backend or StaticBackend(), credentials=credentials)
        started.append(server)
        await server.start()
        return server

    yield start
    for server in started:
        await server.stop()
        close = getattr(server.backend, "close", None)
        if callable(close):
            close()


@pytest.fixture
async def cdp_facilitator(
    start_cdp_facilitator: StartFacilitator, cdp_credentials: CdpCredentials
) -> CdpFacilitatorServer:
    """A running fake CDP facilitator that demands JWTs signed with ``cdp_credentials``."""
    return await start_cdp_facilitator(credentials=cdp_credentials)


@pytest.fixture
async def cdp_facilitator_es256(
    start_cdp_facilitator: StartFacilitator, cdp_es256_credentials: CdpCredentials
) -> CdpFacilitatorServer:
    """The same fake, authenticating ES256 tokens from ``cdp_es256_credentials``."""
    return await start_cdp_facilitator(credentials=cdp_es256_credentials)


@pytest.fixture
def closed_facilitator_url() -> str:
    """A facilitator base URL on a port where nothing listens."""
    return closed_port_url()
