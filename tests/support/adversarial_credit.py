"""What the prepaid-credit attack tests share: a gateway that sells and takes credit, a client
that buys and spends it, and the credit and money to watch.

* :func:`own_chain`: a chain and JSON-RPC server of a module's own, so its gateways can outlive
  a test (the session's server serves each test's fresh chain).
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import redis.asyncio as aioredis
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from gateway.credits import Balance, CreditBook
from gateway.store import Entry, Store, keys
from gateway.x402.headers import encode_header
from gateway.x402.siwx_signer import sign_in
from gateway.x402.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money, funded_wallet
from tests.support.gateway_server import PAID_GROUPS
from tests.support.paid_fixtures import GET_BALANCE, Reply, balance_body, paid_env
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from tests.support.upstream import Upstream

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
    claim = Entry(f"test-fund-{secrets.token_hex(8)}", "1", 60_000)
    assert await store.claim_then_put([claim], [], book(store).credits(address, amount)) == 1


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
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
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
