"""pytest plugin: what the prepaid-credit tests share: a gateway that sells and takes credit, a
client that buys and spends it, and the credit and money to watch.

Fixtures (a module defining one of the same name uses its own):

* ``chain_rpc`` (module): :func:`own_chain`, a chain and JSON-RPC server of the module's own, so
  its gateways can outlive a test (the session's server serves each test's fresh chain).
* ``provider`` (module): the recording loopback provider of the module's gateways;
  ``answering`` (function): it, answering at once, with no calls recorded yet.
* ``store`` (function): the Redis store of ``redis_url``, as a test reads what gateways wrote.
* ``replicas`` (module): two ``x402-gateway serve`` processes on ``chain_rpc`` and ``provider``,
  started with the module's ``replica_env`` fixture (one Redis, one public address).

Helpers:

* :func:`served_credit_gateway`: a gateway of :func:`credit_env` served in-process (hypercorn
  on loopback), as a :class:`PaidGateway`.
* :func:`credit_env`: the paid gateway's env (LiteSVM chain, the internal facilitator settling
  with the chain's fee payer, the recording provider) with credit on, over a Redis store. Every
  limit that is not credit's own is lifted, so each refusal a test sees is the credit's doing.
* :class:`CreditClient`: over any served gateway (in-process or a process): reads a route's 402,
  signs its sign-in challenge, builds a real exact payment for a top-up, and sends them.
* :func:`fund`: credits a wallet as a top-up's delivery does (the claim-then-put round trip),
  for tests that need an exact amount of credit rather than a whole top-up.
* :func:`hold_fields`: the live holds of a wallet as Redis keeps them (amount, expiry).
* :data:`ONE_TOP_UP`: what ``POST /v1/x402/credits/top-up/1`` moves on chain.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.siwx_signer import sign_in
from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.methods.credit.book import Balance, CreditBook
from gateway.store import Entry, Store, keys, open_store
from gateway.store.claims import claim_then_put
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money, funded_wallet
from tests.support.gateway_server import PAID_GROUPS, run_gateway
from tests.support.paid_fixtures import (
    GET_BALANCE,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    balance_body,
    paid_env,
)
from tests.support.paid_processes import PaidProcesses, paid_processes
from tests.support.redis_cluster import raw_client
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from tests.support.upstream import Upstream, static

TOP_UP_1 = "/v1/x402/credits/top-up/1"
TOP_UP_1_CREDIT = 1_000_000
"""What the 1-USDC top-up sells, and what it costs: no settlement fee is added to a top-up."""
ONE_TOP_UP = Money(-TOP_UP_1_CREDIT, TOP_UP_1_CREDIT, -ONE_SETTLEMENT_FEE)
"""A 1-USDC top-up on chain: the client's USDC to payTo, one settlement's fee from our fee payer."""
BALANCES = "/v1/x402/credits"
GET_ACCOUNT_INFO = "/v1/x402/solana/mainnet/provider_a/rpc/getAccountInfo"
CALL_CREDIT = 5
"""getBalance's and getAccountInfo's credit price on provider_a: their price without the fee."""
SIWX_SECRET = "credit-attacks-siwx-secret-0123456789abcdef"
LIFTED = "100000"


@contextmanager
def own_chain() -> Iterator[tuple[UsdcChain, LiteSvmRpcServer]]:
    server = LiteSvmRpcServer().start()
    chain = setup_usdc_chain()
    server.use(chain.svm)
    try:
        yield chain, server
    finally:
        server.stop()


def credit_env(
    chain: UsdcChain, rpc: LiteSvmRpcServer, upstream: Upstream, redis_url: str, **extra: str
) -> dict[str, str]:
    """A paid gateway selling credit on Redis, settling with its own fee payer on the chain."""
    return {
        **paid_env(chain, rpc, upstream, None),
        "STATE_STORE_REST_URL": redis_url,
        "CREDITS_ENABLED": "true",
        "ROUTE_GROUPS": f"{PAID_GROUPS},credits",
        "SIWX_SECRET": SIWX_SECRET,  # replicas must share it: a sign-in issued by one is spent on another
        "RATE_LIMIT_RPC_RPS": LIFTED,
        "RATE_LIMIT_CHALLENGE_PER_MINUTE": LIFTED,
        "RATE_LIMIT_REFUSED_PAYMENTS_PER_MINUTE": LIFTED,
        **extra,
    }


@asynccontextmanager
async def served_credit_gateway(
    chain: UsdcChain,
    rpc: LiteSvmRpcServer,
    provider: Upstream,
    redis_url: str,
    *,
    store: Store | None = None,
    **extra: str,
) -> AsyncIterator[PaidGateway]:
    """A gateway of :func:`credit_env` (``extra`` added) served in-process, on ``store`` when
    given (else one of its own on ``redis_url``)."""
    env = credit_env(chain, rpc, provider, redis_url, **extra)
    async with run_gateway(env, store=store) as running, aiohttp.ClientSession() as http:
        yield PaidGateway(running, chain, rpc, provider, None, http)


@asynccontextmanager
async def started_provider() -> AsyncIterator[Upstream]:
    """A recording loopback provider, for as long as the block runs."""
    server = Upstream()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="module")
def chain_rpc() -> Iterator[tuple[UsdcChain, LiteSvmRpcServer]]:
    with own_chain() as chain_and_server:
        yield chain_and_server


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def provider() -> AsyncIterator[Upstream]:
    async with started_provider() as server:
        yield server


@pytest.fixture
def answering(provider: Upstream) -> Upstream:
    provider.responder = static(200, PROVIDER_ANSWER)
    provider.calls.clear()
    return provider


@pytest_asyncio.fixture(loop_scope="session")
async def store(redis_url: str) -> AsyncIterator[Store]:
    redis = open_store(redis_url, None)
    yield redis
    await redis.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def replicas(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, replica_env: dict[str, str]
) -> AsyncIterator[PaidProcesses]:
    """Two gateway processes on one Redis: replicas."""
    chain, rpc = chain_rpc
    async with paid_processes(
        2, chain=chain, rpc=rpc, upstream=provider, facilitator=None, env=replica_env
    ) as running:
        yield running


class Poster(Protocol):
    """A served gateway as the tests' HTTP helpers reach it (PaidGateway, Replica)."""

    async def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Reply: ...


@dataclass
class CreditClient:
    """A client of one served gateway, holding a chain to pay on."""

    gateway: Poster
    chain: UsdcChain

    async def challenge(self, path: str = GET_BALANCE, body: Any = None) -> Reply:
        reply = await self.gateway.post(path, balance_body() if body is None else body)
        assert reply.status == 402, reply.body
        return reply

    async def sign_in(self, wallet: Keypair, path: str = GET_BALANCE) -> str:
        """A ``SIGN-IN-WITH-X`` header answering the sign-in challenge of ``path``'s 402."""
        required = (await self.challenge(path)).header_json("payment-required")
        return sign_in(required["extensions"]["sign-in-with-x"], wallet)

    async def spend(self, header: str, path: str = GET_BALANCE, request_id: int = 1) -> Reply:
        """A call of ``path`` paid from credit by signing in with ``header``."""
        return await self.gateway.post(path, balance_body(request_id=request_id), {"sign-in-with-x": header})

    async def top_up_payment(self, payer: Keypair, path: str = TOP_UP_1) -> PaymentPayload:
        """A real exact payment of the top-up's 402, signed by ``payer``: the wallet credited."""
        required = (await self.challenge(path, body=b"")).header_json("payment-required")
        requirements = msgspec.convert(required["accepts"][0], PaymentRequirements)
        resource = msgspec.convert(required["resource"], ResourceInfo)
        mint = MintInfo(address=str(self.chain.mint), decimals=self.chain.decimals)
        tx = build_exact_transaction(requirements, payer, mint, self.chain.blockhash)
        return build_payment_payload(requirements, tx, resource=resource)

    async def top_up(self, payment: PaymentPayload, path: str = TOP_UP_1) -> Reply:
        return await self.gateway.post(path, b"", {"payment-signature": encode_header(payment)})

    def wallet(self, micro_usdc: int = 5 * TOP_UP_1_CREDIT) -> tuple[Keypair, Pubkey]:
        """A fresh client wallet holding ``micro_usdc`` on the chain, and its token account."""
        return funded_wallet(self.chain, micro_usdc)


def book(store: Store, upstream_timeout_s: float = 15.0) -> CreditBook:
    return CreditBook(store, lapse_days=365, upstream_timeout_s=upstream_timeout_s)


async def fund(store: Store, wallet: Keypair | str, amount: int) -> None:
    """Credit ``wallet`` with ``amount`` the way a top-up's delivery does (one claim, one credit)."""
    address = wallet if isinstance(wallet, str) else str(wallet.pubkey())
    claim = Entry(keys.delivery(address, secrets.token_hex(32)), "1", 60_000)
    assert await claim_then_put(store, [claim], [], book(store).credits(address, amount)) == 1


async def credit_of(store: Store, wallet: Keypair) -> Balance:
    return await book(store).balance(str(wallet.pubkey()))


@dataclass(frozen=True)
class HeldCredit:
    """One hold in a wallet's hold set, as the store keeps it."""

    amount: int
    expires_us: int


async def hold_fields(redis_url: str, wallet: Keypair) -> tuple[list[HeldCredit], int, int]:
    """The live holds of ``wallet`` (neither lapsed nor taken), the hold set's PTTL in ms and
    Redis's clock in microseconds."""
    client = raw_client(redis_url)
    try:
        key = keys.credit_holds(str(wallet.pubkey()))
        fields: dict[str, str] = await client.hgetall(key)
        pttl = int(await client.pttl(key))
        seconds, micros = await client.time()
    finally:
        await client.aclose()
    now_us = int(seconds) * 1_000_000 + int(micros)
    holds = []
    for value in fields.values():
        amount, expires = (int(part) for part in value.split())
        if amount > 0 and expires > now_us:  # a taken hold's mark holds 0
            holds.append(HeldCredit(amount, expires))
    return holds, pttl, now_us
