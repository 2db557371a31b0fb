"""End to end on ``x402-gateway sandbox`` (a real gateway process on its local chain): the
reference x402 MCP client pays a tool call at the banner's ``/mcp``, and the banner's
``x402-gateway mcp`` command serves the tools over stdio, paying from the demo wallet. USDC
moves from the wallet to payTo by exactly the advertised price per paid call.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from gateway.x402.types import USDC_MAINNET_MINT
from tests.support.cdp_facilitator import close_sdk_rpc_clients
from tests.support.gateway_process import clean_env, command
from tests.support.mcp_client import GET_BALANCE_TOOL, SdkSession, mcp_session
from tests.support.sandbox_process import Sandbox, run_sandbox

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with run_sandbox() as running:
        yield running


def _usdc(sandbox: Sandbox, owner: str) -> int:
    import urllib.request

    ata = get_associated_token_address(Pubkey.from_string(owner), Pubkey.from_string(USDC_MAINNET_MINT))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getTokenAccountBalance", "params": [str(ata)]})
    request = urllib.request.Request(
        sandbox.rpc_url, data=body.encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return int(json.loads(resp.read())["result"]["value"]["amount"])


def _balances(sandbox: Sandbox) -> tuple[int, int]:
    return _usdc(sandbox, sandbox.wallet), _usdc(sandbox, sandbox.pay_to)


async def test_the_reference_x402_mcp_client_pays_the_sandbox(sandbox: Sandbox) -> None:
    from x402.mcp import create_x402_mcp_client_from_config
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.client import ExactSvmScheme

    assert f"MCP: the paid tools at {sandbox.url}/mcp" in sandbox.banner
    payer = Keypair.from_bytes(bytes(json.loads(sandbox.key_file.read_text())))
    scheme = ExactSvmScheme(KeypairSigner(payer), sandbox.rpc_url)
    config: dict[str, Any] = {"schemes": [{"network": "solana:*", "client": scheme}]}
    before = _balances(sandbox)
    try:
        async with mcp_session(sandbox.url) as session:
            client = create_x402_mcp_client_from_config(SdkSession(session), config)
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            price = int(tools[GET_BALANCE_TOOL].meta["x402-gateway/price"]["microUsdc"])  # type: ignore[index]
            result = await client.call_tool(GET_BALANCE_TOOL, {"params": [sandbox.wallet]})
    finally:
        close_sdk_rpc_clients(scheme)

    assert result.payment_made is True and result.is_error is False, result.content
    assert "value" in json.loads(result.content[0]["text"])["result"]
    assert result.payment_response is not None and result.payment_response.success is True
    assert _balances(sandbox) == (before[0] - price, before[1] + price)


async def test_the_banners_mcp_command_serves_the_tools_paying_and_signing_in_from_the_demo_wallet(
    sandbox: Sandbox,
) -> None:
    [line] = [line for line in sandbox.banner.splitlines() if line.strip().startswith("x402-gateway mcp ")]
    printed = shlex.split(line)
    [program, *args] = command()
    params = StdioServerParameters(command=program, args=[*args, *printed[1:]], env=clean_env({}))
    before = _balances(sandbox)
    async with (
        stdio_client(params, errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        result = await session.call_tool(GET_BALANCE_TOOL, {"params": [sandbox.wallet]})
        signed_in = await session.call_tool("tokens.search", {"query": {"q": "sol"}})  # $0.00: a sign-in
    price = int(tools[GET_BALANCE_TOOL].meta["x402-gateway/price"]["microUsdc"])  # type: ignore[index]
    assert signed_in.isError is False, signed_in.content
    assert signed_in.structuredContent is not None and signed_in.structuredContent["ok"] is True
    assert result.isError is False, result.content
    assert result.meta is not None and result.meta["x402/payment-response"]["success"] is True
    assert _balances(sandbox) == (before[0] - price, before[1] + price)
