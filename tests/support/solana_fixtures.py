"""pytest plugin: a LiteSVM-backed Solana JSON-RPC server, fresh USDC chains, local facilitators.

* ``solana_rpc_server`` (session): one loopback server for the whole run.
* ``usdc_chain`` (function): a fresh LiteSVM with USDC (Token program) at the real mainnet
  mint address, installed on the server; knobs and call counters reset.
* ``make_usdc_chain`` (function): a factory for other variants (Token-2022, no payTo account,
  an unfunded payer, ...), each installed on the server when made.
* ``make_local_facilitator`` (function): ``LocalFacilitator`` instances over a chain's fee payer
  and the server (fast confirmation polling), closed after the test.
* :func:`exact_requirements`: v2 requirements for paying on a chain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from gateway.facilitators.local import LocalFacilitator
from gateway.methods.exact.confirmations import PollSchedule
from gateway.store import Store
from gateway.store.memory import MemoryStore
from gateway.x402.types import SOLANA_MAINNET, PaymentRequirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, setup_usdc_chain

MakeFacilitator = Callable[..., LocalFacilitator]


def exact_requirements(
    chain: UsdcChain,
    *,
    amount: str = "10000",
    network: str = SOLANA_MAINNET,
    fee_payer: str | None = None,
    memo: str | None = None,
    max_timeout_seconds: int = 60,
) -> PaymentRequirements:
    """Exact requirements paying ``amount`` of the chain's mint to its payTo, fee payer in extra."""
    extra: dict[str, Any] = {"feePayer": fee_payer or str(chain.fee_payer.pubkey())}
    if memo is not None:
        extra["memo"] = memo
    return PaymentRequirements(
        scheme="exact",
        network=network,
        amount=amount,
        asset=str(chain.mint),
        payTo=str(chain.pay_to),
        maxTimeoutSeconds=max_timeout_seconds,
        extra=extra,
    )


@pytest.fixture(scope="session")
def solana_rpc_server() -> Iterator[LiteSvmRpcServer]:
    server = LiteSvmRpcServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_usdc_chain(solana_rpc_server: LiteSvmRpcServer) -> Callable[..., UsdcChain]:
    def make(**kwargs: Any) -> UsdcChain:
        chain = setup_usdc_chain(**kwargs)
        solana_rpc_server.use(chain.svm)
        return chain

    return make


@pytest.fixture
def usdc_chain(make_usdc_chain: Callable[..., UsdcChain]) -> UsdcChain:
    return make_usdc_chain()


@pytest_asyncio.fixture(loop_scope="session")
async def make_local_facilitator(solana_rpc_server: LiteSvmRpcServer) -> AsyncIterator[MakeFacilitator]:
    """Factory: ``make(chain, store=..., **LocalFacilitator kwargs)``; all closed afterwards."""
    made: list[LocalFacilitator] = []

    def make(chain: UsdcChain, store: Store | None = None, **kwargs: Any) -> LocalFacilitator:
        options: dict[str, Any] = {
            "mainnet_rpc_url": solana_rpc_server.url,
            "poll_schedule": PollSchedule(first_s=0.005, max_s=0.01, min_gap_s=0.002),
            "confirm_timeout_s": 2.0,
            "rpc_timeout_s": 5.0,
            "url": "http://127.0.0.1/api/internal/facilitator",
        }
        options.update(kwargs)
        facilitator = LocalFacilitator(
            chain.fee_payer, store if store is not None else MemoryStore(), **options
        )
        made.append(facilitator)
        return facilitator

    yield make
    for facilitator in made:
        await facilitator.close()
