"""Paid MCP tools at ``/mcp``, against the real gateway served on loopback, paid on LiteSVM.

The client is the ``mcp`` SDK's (Streamable HTTP), and for payments the reference x402 SDK's MCP
client (``x402.mcp.create_x402_mcp_client_from_config``) with the exact SVM client scheme,
unchanged. The gateway settles through its internal facilitator on the chain, so balances are
read back from the chain: the payer down by the price, payTo up by it, nothing moved when the
provider failed, and a payment given twice is never settled twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from mcp import ClientSession, types

from gateway.mcp.meta import PAYMENT_META
from tests.support.cdp_facilitator import close_sdk_rpc_clients
from tests.support.gateway_server import run_gateway
from tests.support.mcp_client import (
    BALANCE_META,
    GET_BALANCE_CREDIT,
    GET_BALANCE_TOOL,
    ONE_USDC,
    SESSION_META,
    SIGN_IN_META,
    SdkSession,
    balances,
    buy_one_usdc_of_credit,
    credit_env,
    mcp_session,
)
from tests.support.paid_fixtures import (
    ACCOUNT,
    GET_BALANCE_PRICE_INTERNAL,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    StartPaidGateway,
)
from tests.support.solana_rpc_server import UsdcChain
from tests.support.upstream import ASSET_API_KEY, Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")


@contextmanager
def exact_svm_config(chain: UsdcChain, rpc_url: str) -> Iterator[dict[str, Any]]:
    """``create_x402_mcp_client_from_config``'s config: the exact SVM client scheme for the
    chain's payer, paying without asking."""
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.client import ExactSvmScheme

    scheme = ExactSvmScheme(KeypairSigner(chain.payer), rpc_url)
    try:
        yield {"schemes": [{"network": "solana:*", "client": scheme}], "auto_payment": True}
    finally:
        close_sdk_rpc_clients(scheme)


@pytest.fixture
async def gateway(start_paid_gateway: StartPaidGateway) -> PaidGateway:
    """The paid gateway settling through its own fee payer on LiteSVM."""
    return await start_paid_gateway(internal=True)


async def test_lists_one_tool_per_sold_method_with_its_price_and_schemas(gateway: PaidGateway) -> None:
    async with mcp_session(gateway.url) as session:
        listed = (await session.list_tools()).tools
    tools = {tool.name: tool for tool in listed}
    sold = {r.name for r in gateway.running.services.routes if r.handler == "jsonrpc" and r.listed}
    assert set(tools) == sold and len(sold) > 10
    balance = tools[GET_BALANCE_TOOL]
    assert balance.description == (
        "Lamport balance of an account (mainnet, provider_a). "
        "Price: $0.002205 USDC per call (x402 exact, Solana)."
    )
    assert balance.meta == {"x402-gateway/price": {"microUsdc": str(GET_BALANCE_PRICE_INTERNAL)}}
    assert balance.inputSchema["required"] == ["params"]
    assert balance.inputSchema["properties"]["params"]["prefixItems"][0]["pattern"].startswith("^[1-9A-H")
    assert balance.inputSchema["examples"] == [{"params": ["9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"]}]
    assert balance.outputSchema is not None and balance.outputSchema["required"] == ["jsonrpc", "result"]


async def test_an_unpaid_call_gets_the_payment_requirements_and_reaches_no_provider(
    gateway: PaidGateway,
) -> None:
    before = balances(gateway)
    async with mcp_session(gateway.url) as session:
        result = await session.call_tool(GET_BALANCE_TOOL, {"params": [ACCOUNT]})
    assert result.isError is True
    required = result.structuredContent
    assert required is not None and required["x402Version"] == 2
    [accept] = [a for a in required["accepts"] if a["scheme"] == "exact"]
    assert int(accept["amount"]) == GET_BALANCE_PRICE_INTERNAL
    assert accept["payTo"] == str(gateway.chain.pay_to)
    assert required["resource"]["url"] == gateway.url + "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
    assert json.loads(result.content[0].text) == required  # type: ignore[union-attr]
    assert gateway.upstream_calls == 0
    assert balances(gateway) == before


async def test_the_reference_x402_mcp_client_pays_a_call_end_to_end(gateway: PaidGateway) -> None:
    from x402.mcp import create_x402_mcp_client_from_config

    gateway.upstream.responder = static(200, PROVIDER_ANSWER)
    payer_before, pay_to_before = balances(gateway)
    assert payer_before is not None and pay_to_before is not None
    with exact_svm_config(gateway.chain, gateway.rpc.url) as config:
        async with mcp_session(gateway.url) as session:
            client = create_x402_mcp_client_from_config(SdkSession(session), config)
            listed = await client.list_tools()
            result = await client.call_tool(GET_BALANCE_TOOL, {"params": [ACCOUNT]})

    assert GET_BALANCE_TOOL in {tool.name for tool in listed.tools}
    assert result.payment_made is True and result.is_error is False, result.content
    assert json.loads(result.content[0]["text"])["result"]["value"] == MARKER
    settled = result.payment_response
    assert settled is not None and settled.success is True
    assert settled.transaction == gateway.rpc.sent[-1]
    assert settled.payer == str(gateway.chain.payer.pubkey())
    assert balances(gateway) == (
        payer_before - GET_BALANCE_PRICE_INTERNAL,
        pay_to_before + GET_BALANCE_PRICE_INTERNAL,
    )
    assert [call.json["method"] for call in gateway.upstream.calls] == ["getBalance"]


async def _payment_for(session: ClientSession, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
    """A payment the reference client signs for the tool's current requirements (JSON, as sent)."""
    from x402 import x402Client
    from x402.mcp.utils import build_x402_client_config
    from x402.schemas import parse_payment_required

    unpaid = await session.call_tool(GET_BALANCE_TOOL, arguments)
    assert unpaid.isError and unpaid.structuredContent is not None
    client = x402Client.from_config(build_x402_client_config(config))
    payload = await client.create_payment_payload(parse_payment_required(unpaid.structuredContent))
    return payload.model_dump(by_alias=True, exclude_none=True)


async def _paid_call(session: ClientSession, arguments: dict[str, Any], payment: Any) -> types.CallToolResult:
    return await session.call_tool(GET_BALANCE_TOOL, arguments, meta={PAYMENT_META: payment})


async def test_nothing_is_settled_when_the_provider_fails(gateway: PaidGateway) -> None:
    gateway.upstream.responder = static(500, {"error": "down"})
    before = balances(gateway)
    with exact_svm_config(gateway.chain, gateway.rpc.url) as config:
        async with mcp_session(gateway.url) as session:
            payment = await _payment_for(session, config, {"params": [ACCOUNT]})
            failed = await _paid_call(session, {"params": [ACCOUNT]}, payment)
    assert failed.isError is True and failed.meta is None
    assert failed.structuredContent is not None
    assert failed.structuredContent["status"] == 502
    assert failed.structuredContent["error"]["code"] == "upstream_error"
    assert "x402Version" not in failed.structuredContent  # not a payment to make again
    assert len(gateway.upstream.calls) == 1
    assert gateway.rpc.sent == []
    assert balances(gateway) == before


async def test_a_payment_answers_its_identical_retry_and_is_refused_for_another_call(
    gateway: PaidGateway,
) -> None:
    gateway.upstream.responder = static(200, PROVIDER_ANSWER)
    payer_before, pay_to_before = balances(gateway)
    assert payer_before is not None and pay_to_before is not None
    asked = {"params": [ACCOUNT]}
    with exact_svm_config(gateway.chain, gateway.rpc.url) as config:
        async with mcp_session(gateway.url) as session:
            payment = await _payment_for(session, config, asked)
            first = await _paid_call(session, asked, payment)
            again = await _paid_call(session, asked, json.dumps(payment))  # its JSON text: the same payment
            other = await _paid_call(session, {"params": [str(gateway.chain.pay_to)]}, payment)

    assert first.isError is False and first.meta is not None
    assert again.isError is False and again.structuredContent == first.structuredContent
    assert again.meta == first.meta  # the same receipt: one settlement
    assert len(gateway.rpc.sent) == 1 and len(gateway.upstream.calls) == 1
    assert other.isError is True and other.structuredContent is not None
    assert other.structuredContent["error"] == "payment_already_used"  # a fresh 402, naming why
    assert other.structuredContent["accepts"][0]["amount"] == str(GET_BALANCE_PRICE_INTERNAL)
    assert balances(gateway) == (
        payer_before - GET_BALANCE_PRICE_INTERNAL,
        pay_to_before + GET_BALANCE_PRICE_INTERNAL,
    )


@pytest.fixture
async def credit_gateway(start_paid_gateway: StartPaidGateway, clean_redis_url: str) -> PaidGateway:
    """The paid gateway with prepaid credit on (Redis), 1 USDC of it bought by the chain's payer."""
    paid = await start_paid_gateway(internal=True, env=credit_env(clean_redis_url))
    await buy_one_usdc_of_credit(paid)
    return paid


async def test_a_call_spends_prepaid_credit_through_a_session_token_or_a_sign_in(
    credit_gateway: PaidGateway,
) -> None:
    from client.sessions import open_session
    from client.siwx_signer import sign_in

    paid = credit_gateway
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    after_top_up, sent = balances(paid), len(paid.rpc.sent)
    credit = await open_session(paid.http, paid.url, paid.chain.payer, cap=ONE_USDC)
    async with mcp_session(paid.url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        on_session = await session.call_tool(
            GET_BALANCE_TOOL, {"params": [ACCOUNT]}, meta={SESSION_META: credit.token}
        )
        unpaid = await session.call_tool(GET_BALANCE_TOOL, {"params": [ACCOUNT]})
        assert unpaid.structuredContent is not None
        extension = unpaid.structuredContent["extensions"]["sign-in-with-x"]
        signed = sign_in(extension, paid.chain.payer, request_url=unpaid.structuredContent["resource"]["url"])
        signed_in = await session.call_tool(
            GET_BALANCE_TOOL, {"params": [ACCOUNT]}, meta={SIGN_IN_META: signed}
        )

    assert tools[GET_BALANCE_TOOL].description is not None
    assert tools[GET_BALANCE_TOOL].description.endswith(
        "Price: $0.002205 USDC per call (x402 exact, Solana), or $0.000005 from prepaid credit."
    )
    assert tools[GET_BALANCE_TOOL].meta == {
        "x402-gateway/price": {"microUsdc": str(GET_BALANCE_PRICE_INTERNAL), "creditMicroUsdc": "5"}
    }
    assert on_session.isError is False, on_session.structuredContent
    assert on_session.meta == {BALANCE_META: str(ONE_USDC - GET_BALANCE_CREDIT)}
    assert signed_in.isError is False, signed_in.structuredContent
    assert signed_in.meta == {BALANCE_META: str(ONE_USDC - 2 * GET_BALANCE_CREDIT)}
    assert (balances(paid), len(paid.rpc.sent)) == (after_top_up, sent)  # no transaction, no USDC moved
    assert len(paid.upstream.calls) == 2


async def test_asset_data_routes_are_tools_answered_on_a_sign_in(asset_api: Upstream) -> None:
    from solders.keypair import Keypair

    from client.siwx_signer import sign_in

    env = {
        "ROUTE_GROUPS": "tokens",
        "ASSET_API_BASE_URL": asset_api.url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": "siwx-test-secret-0123456789abcdef-0123",
    }
    wallet = Keypair()
    async with run_gateway(env) as gw, mcp_session(gw.url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        arguments = {"path": {"assetId": "solana-sol"}, "query": {"include": "profile", "marketsLimit": 5}}
        unpaid = await session.call_tool("tokens.assetDetail", arguments)
        assert unpaid.isError is True and unpaid.structuredContent is not None
        challenge = unpaid.structuredContent
        signed = sign_in(challenge["extensions"]["sign-in-with-x"], wallet, request_url=gw.url)
        answered = await session.call_tool("tokens.assetDetail", arguments, meta={SIGN_IN_META: signed})
        fresh = (await session.call_tool("tokens.assetDetail", arguments)).structuredContent
        assert fresh is not None
        again = sign_in(fresh["extensions"]["sign-in-with-x"], wallet, request_url=gw.url)
        invalid = await session.call_tool(
            "tokens.assetDetail",
            {"path": {"assetId": "solana-sol"}, "query": {"marketsLimit": 51}},
            meta={SIGN_IN_META: again},
        )

    served = {r.name for r in gw.services.routes if r.handler == "tokens" and r.listed}
    assert set(tools) == served
    detail = tools["tokens.assetDetail"]
    assert (
        detail.description
        == "Asset detail with optional include blocks. Free with a sign-in-with-x (no payment)."
    )
    assert detail.inputSchema["required"] == ["path"]
    assert set(detail.inputSchema["properties"]) == {"path", "query"}
    assert challenge["accepts"] == [] and detail.meta is None
    assert answered.isError is False, answered.structuredContent
    assert answered.structuredContent is not None
    assert answered.structuredContent["result"] == {"path": "/v1/assets/solana-sol", "items": [1, 2]}
    call = asset_api.calls[0]
    assert call.query == {"include": "profile", "marketsLimit": "5"}
    assert invalid.isError is True and invalid.structuredContent is not None  # the route's validation
    assert invalid.structuredContent["status"] == 400
    assert invalid.structuredContent["error"]["code"] == "invalid_request"
    assert len(asset_api.calls) == 1  # nothing reached the upstream


async def test_the_catalog_names_each_routes_tool_and_the_endpoint(gateway: PaidGateway) -> None:
    catalog = (await gateway.get("/v1/catalog")).json()
    async with mcp_session(gateway.url) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
    assert catalog["mcp"] == {
        "url": gateway.url + "/mcp",
        "transport": "streamable-http",
        "paymentMeta": "x402/payment",
    }
    named = {entry["mcpTool"] for entry in catalog["routes"] if "mcpTool" in entry}
    assert named == listed
    assert all(entry["mcpTool"] == entry["name"] for entry in catalog["routes"] if "mcpTool" in entry)


async def test_unpaid_calls_count_against_the_client_ips_challenge_limit_as_over_http(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(internal=True, env={"RATE_LIMIT_CHALLENGE_PER_MINUTE": "2"})
    async with mcp_session(paid.url) as session:
        over_mcp = [await session.call_tool(GET_BALANCE_TOOL, {"params": [ACCOUNT]}) for _ in range(2)]
        limited = await session.call_tool(GET_BALANCE_TOOL, {"params": [ACCOUNT]})
    over_http = await paid.post("/v1/x402/solana/mainnet/provider_a/rpc/getBalance", {"params": [ACCOUNT]})

    assert [r.structuredContent is not None and r.structuredContent.get("x402Version") for r in over_mcp] == [
        2,
        2,
    ]
    assert limited.isError is True and limited.structuredContent is not None
    assert limited.structuredContent["status"] == 429
    assert limited.structuredContent["error"]["code"] == "rate_limited"
    assert int(limited.structuredContent["retryAfter"]) > 0
    assert over_http.status == 429  # one budget, whichever way the client came
    assert paid.upstream_calls == 0


def _packaged_tools(**env: str) -> dict[str, Any]:
    from gateway.config import load_settings
    from gateway.mcp.tools import route_tools
    from gateway.routing.pricing import credit_terms, facilitator_fee
    from gateway.routing.routes import load_routes, named_limits

    settings = load_settings({"GATEWAY_BASE_URL": "http://127.0.0.1", **env})
    routes = load_routes(settings.routes_file, named_limits(settings))
    return {t.name: t for t in route_tools(routes, facilitator_fee(settings), credit_terms(settings))}


def test_a_tool_call_is_the_routes_request_byte_for_byte_the_same_for_the_same_arguments() -> None:
    tools = _packaged_tools()
    rpc = tools[GET_BALANCE_TOOL]
    first = rpc.request({"params": [ACCOUNT, {"commitment": "finalized"}]})
    assert first == rpc.request({"params": [ACCOUNT, {"commitment": "finalized"}]})
    assert (first.method, first.path, first.query) == (
        "POST",
        "/v1/x402/solana/mainnet/provider_a/rpc/getBalance",
        b"",
    )
    assert json.loads(first.body) == {
        "id": 1,
        "jsonrpc": "2.0",
        "method": "getBalance",
        "params": [ACCOUNT, {"commitment": "finalized"}],
    }
    detail = tools["tokens.assetDetail"].request(
        {"path": {"assetId": "a/b c"}, "query": {"marketsLimit": 5, "include": "risk,profile"}}
    )
    assert detail.path == "/v1/x402/tokens/assets/a%2Fb%20c"  # a slash never reaches another route
    assert detail.query == b"include=risk%2Cprofile&marketsLimit=5"
    snapshots = tools["tokens.marketSnapshots"].request({"body": {"mints": ["m1"]}})
    assert (snapshots.method, json.loads(snapshots.body)) == ("POST", {"mints": ["m1"]})
    assert not any(name.startswith(("credits.", "facilitator.", "health")) for name in tools)
    assert "credit" not in rpc.description  # credit off: only the exact price
    assert rpc.description.endswith("Price: $0.000005 USDC per call (x402 exact, Solana).")


async def test_the_endpoint_takes_posts_only_and_names_an_unknown_tool(gateway: PaidGateway) -> None:
    for method in ("GET", "DELETE"):
        async with gateway.http.request(method, gateway.url + "/mcp") as resp:
            assert (resp.status, resp.headers["allow"]) == (405, "POST")
            assert (await resp.json())["error"]["code"] == "method_not_allowed"
    async with mcp_session(gateway.url) as session:
        unknown = await session.call_tool("solana.mainnet.provider_a.rpc.noSuchMethod", {})
    assert unknown.isError is True
    assert unknown.content[0].text == "unknown tool 'solana.mainnet.provider_a.rpc.noSuchMethod'"  # type: ignore[union-attr]
    assert gateway.upstream_calls == 0
