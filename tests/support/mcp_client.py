"""The MCP side of the tests: a ``mcp`` SDK client session on a gateway's ``/mcp``, and the
chain balances a paid tool call moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.support.paid_fixtures import PaidGateway

GET_BALANCE_TOOL = "solana.mainnet.provider_a.rpc.getBalance"
TOP_UP_1 = "/v1/x402/credits/top-up/1"
ONE_USDC = 1_000_000
GET_BALANCE_CREDIT = 5
"""routes.yaml: provider_a getBalance's credit price, its provider part."""
SESSION_META = "x402-gateway/x-credit-session"
SIGN_IN_META = "x402-gateway/sign-in-with-x"
BALANCE_META = "x402-gateway/x-credit-balance"


@asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url + "/mcp") as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def balances(paid: PaidGateway) -> tuple[int | None, int | None]:
    """The payer's USDC and payTo's."""
    chain = paid.chain
    return chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)


def credit_env(redis_url: str) -> dict[str, str]:
    """Prepaid credit on (Redis) beside the paid routes."""
    return {
        "CREDITS_ENABLED": "true",
        "STATE_STORE_REST_URL": redis_url,
        "ROUTE_GROUPS": "provider_a,provider_b,credits",
    }


async def buy_one_usdc_of_credit(paid: PaidGateway) -> None:
    """The chain's payer buys 1 USDC of prepaid credit over HTTP."""
    bought = await paid.pay(TOP_UP_1, None, await paid.payment(TOP_UP_1))
    assert bought.status == 200, bought.body
