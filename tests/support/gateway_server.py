"""Run the real gateway app under hypercorn on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from solders.keypair import Keypair
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.routing.routes import RouteSpec, load_routes, named_limits
from gateway.routing.vocabulary import ACCESS_MODES, HANDLERS
from gateway.store import Store
from tests.support.cdp_facilitator import make_ed25519_credentials
from tests.support.ports import bound_socket

PAY_TO = str(Keypair().pubkey())
_CDP = make_ed25519_credentials("LEAK-KEY-ID")
FULL_ENV = {
    # Every route group configured, with secrets that must never be echoed ("LEAK-"); nothing
    # listens on port 9, so no facilitator or upstream is ever reached.
    "FACILITATOR_URL": "http://127.0.0.1:9/",
    "FACILITATOR_API_KEY_ID": _CDP.key_id,
    "FACILITATOR_API_KEY_SECRET": _CDP.secret,
    "X402_PAY_TO_WALLET": PAY_TO,
    "PROVIDER_A_MAINNET_RPC_URL": "http://127.0.0.1:9/a/?api-key=LEAK-A",
    "PROVIDER_A_DEVNET_RPC_URL": "http://127.0.0.1:9/a-dev/?api-key=LEAK-A",
    "PROVIDER_B_MAINNET_RPC_URL": "http://127.0.0.1:9/b/LEAK-B",
    "PROVIDER_B_DEVNET_RPC_URL": "http://127.0.0.1:9/b-dev/LEAK-B",
    "ASSET_API_BASE_URL": "http://127.0.0.1:9/assets",
    "ASSET_API_KEY": "LEAK-ASSET-KEY",
    "SIWX_SECRET": "LEAK-SIWX-SECRET-0123456789abcdef0123456789",
    "INTERNAL_SETTLEMENT_SECRET": "LEAK-INTERNAL-SECRET-0123456789abcdef",
}
SERVICE_ONLY_ENV = {"ROUTE_GROUPS": "none"}
"""Only the service (and internal) routes: the operator switched every sellable group off."""
PAID_GROUPS = "provider_a,provider_b"
"""ROUTE_GROUPS of a gateway configured for the paid Solana routes only."""


@dataclass
class RunningGateway:
    url: str
    app: Starlette
    settings: Settings

    @property
    def services(self) -> Any:
        return self.app.state.services


@asynccontextmanager
async def run_app(app: Any, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block exits; yields the base URL.

    Hypercorn gets an already-bound socket (``fd://``), so no other process can take the port
    between choosing and serving it.
    """
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1
    stop = asyncio.Event()
    task = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    try:
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


_ROUTE_TABLES: dict[tuple[Any, ...], bytes] = {}
"""Route tables already loaded in this worker, pickled, by everything a load depends on."""


def routes_of(settings: Settings) -> list[RouteSpec]:
    """What ``create_app`` would load from ``settings.routes_file``, loading each table once.

    A load is what the gateway does at start-up: a YAML parse and a check of every schema and
    example, some 15 ms, and most in-process gateways of the suite load the same packaged table.
    The key is the file's bytes, the named limits (the environment's part of the load) and the
    words routes.yaml may use (a test registers a payment method of its own), so an edited or
    different table, or one read under other words, loads afresh. Each caller gets its own copy
    (unpickled), so no test sees another's changes to a route's schemas. A table that does not
    load is never kept: ``load_routes`` raises its error each time, as ``create_app`` would.
    """
    path, limits = settings.routes_file, named_limits(settings)
    try:
        text = path.read_bytes()
    except OSError:
        return load_routes(path, limits)
    words = (tuple(ACCESS_MODES.items()), tuple(HANDLERS.items()))
    key = (str(path), text, tuple(sorted(limits.items())), words)
    kept = _ROUTE_TABLES.get(key)
    if kept is None:
        kept = _ROUTE_TABLES[key] = pickle.dumps(load_routes(path, limits))
    return list(pickle.loads(kept))


@asynccontextmanager
async def run_gateway(
    env: Mapping[str, str], routes: list[RouteSpec] | None = None, store: Store | None = None
) -> AsyncIterator[RunningGateway]:
    """Build the gateway from ``env`` (GATEWAY_BASE_URL defaults to the bound address) and serve it."""
    sock = bound_socket()
    full = {"GATEWAY_BASE_URL": f"http://127.0.0.1:{sock.getsockname()[1]}", **env}
    try:
        settings = load_settings(full)
        app = create_app(settings, routes_of(settings) if routes is None else routes, store)
    except BaseException:
        sock.close()
        raise
    async with run_app(app, sock) as url:
        yield RunningGateway(url=url, app=app, settings=settings)
