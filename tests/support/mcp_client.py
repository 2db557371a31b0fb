"""The MCP side of the tests: a ``mcp`` SDK client session on a gateway's ``/mcp``, and the
chain balances a paid tool call moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from mcp import ClientSession, types
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


class SdkSession:
    """The MCP client the reference ``x402MCPClient`` wraps: ``call_tool(params, **options)`` with
    ``params`` as the JSON-RPC request's (name, arguments, ``_meta``), answered with the result's
    wire fields; this is the ``mcp`` SDK's ClientSession under that calling convention."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call_tool(self, params: dict[str, Any], read_timeout_seconds: timedelta | None = None) -> Any:
        result = await self.session.call_tool(
            params["name"], params.get("arguments"), read_timeout_seconds, meta=params.get("_meta")
        )
        return SimpleNamespace(
            content=[item.model_dump() for item in result.content],
            isError=result.isError,
            _meta=result.meta or {},
            structuredContent=result.structuredContent,
        )

    async def list_tools(self) -> types.ListToolsResult:
        return await self.session.list_tools()
