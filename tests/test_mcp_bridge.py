"""``x402-gateway mcp``: the local stdio MCP server paying a gateway's tools from a wallet.

The bridge runs as the real command in a subprocess, driven by the ``mcp`` SDK's stdio client;
the gateway is the real one served on loopback, settling through its own fee payer on LiteSVM.
It spends the wallet's prepaid credit through one credit session while the wallet has some,
pays exact USDC otherwise, and refuses, before signing anything, a call above ``--max-amount``
or past ``--max-session-amount``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from prometheus_client import REGISTRY
from solders.keypair import Keypair

from tests.support.gateway_process import clean_env, launched_command, run_cli
from tests.support.mcp_client import (
    BALANCE_META,
    GET_BALANCE_CREDIT,
    GET_BALANCE_TOOL,
    ONE_USDC,
    balances,
    buy_one_usdc_of_credit,
    credit_env,
)
from tests.support.paid_fixtures import (
    ACCOUNT,
    GET_BALANCE_PRICE_INTERNAL,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    StartPaidGateway,
)
from tests.support.ports import refusing_port
from tests.support.upstream import static

pytestmark = pytest.mark.slow  # each case starts the bridge process (about a second)

ASKED = {"params": [ACCOUNT]}


def _challenges() -> float:
    """The 402s getBalance has answered in this process (the served gateway's counter)."""
    labels = {"route": GET_BALANCE_TOOL, "method": "POST", "status": "402"}
    return REGISTRY.get_sample_value("x402_requests_total", labels) or 0.0


def key_file(tmp_path: Path, keypair: Keypair) -> Path:
    path = tmp_path / "wallet.json"
    path.write_text(json.dumps(list(bytes(keypair))))
    return path


@asynccontextmanager
async def bridge(paid: PaidGateway, wallet: Path, *options: str) -> AsyncIterator[ClientSession]:
    """``x402-gateway mcp`` on ``paid``, as an MCP client starts it, initialized. Forked from the
    fork server through its launcher (tests/test_sandbox_mcp.py starts the console script)."""
    [program, *args] = launched_command({})
    params = StdioServerParameters(
        command=program,
        args=[*args, "mcp", "--gateway", paid.url, "--keypair", str(wallet), "--rpc", paid.rpc.url, *options],
        env=clean_env({}),
    )
    async with (
        stdio_client(params, errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_the_bridge_lists_the_gateways_tools_and_pays_exact_from_the_wallet(
    start_paid_gateway: StartPaidGateway, tmp_path: Path
) -> None:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payer_before, pay_to_before = balances(paid)
    assert payer_before is not None and pay_to_before is not None
    async with bridge(paid, key_file(tmp_path, paid.chain.payer)) as session:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        result = await session.call_tool(GET_BALANCE_TOOL, ASKED)

    assert GET_BALANCE_TOOL in tools
    assert result.isError is False, result.content
    assert result.structuredContent is not None and result.structuredContent["result"]["value"] == MARKER
    assert result.meta is not None
    settled = result.meta["x402/payment-response"]
    assert settled["success"] is True and settled["transaction"] == paid.rpc.sent[-1]
    assert balances(paid) == (
        payer_before - GET_BALANCE_PRICE_INTERNAL,
        pay_to_before + GET_BALANCE_PRICE_INTERNAL,
    )


async def test_the_bridge_spends_prepaid_credit_through_a_credit_session(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str, tmp_path: Path
) -> None:
    paid = await start_paid_gateway(internal=True, env=credit_env(clean_redis_url))
    await buy_one_usdc_of_credit(paid)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    after_top_up, sent = balances(paid), len(paid.rpc.sent)
    challenged = _challenges()
    async with bridge(paid, key_file(tmp_path, paid.chain.payer)) as session:
        calls = [await session.call_tool(GET_BALANCE_TOOL, ASKED) for _ in range(2)]
    assert _challenges() == challenged + 1  # the second call went straight to the session

    assert [call.isError for call in calls] == [False, False], calls[-1].content
    assert [call.meta for call in calls] == [
        {BALANCE_META: str(ONE_USDC - GET_BALANCE_CREDIT)},
        {BALANCE_META: str(ONE_USDC - 2 * GET_BALANCE_CREDIT)},
    ]
    assert (balances(paid), len(paid.rpc.sent)) == (after_top_up, sent)  # nothing paid on chain
    assert len(paid.upstream.calls) == 2


async def test_the_bridge_refuses_a_call_above_max_amount_and_past_the_session_amount(
    start_paid_gateway: StartPaidGateway, tmp_path: Path
) -> None:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    wallet = key_file(tmp_path, paid.chain.payer)
    payer_before, pay_to_before = balances(paid)
    assert payer_before is not None and pay_to_before is not None
    async with bridge(paid, wallet, "--max-amount", "0.002") as session:
        above = await session.call_tool(GET_BALANCE_TOOL, ASKED)
    assert above.isError is True and above.structuredContent is not None
    assert above.structuredContent["error"] == {
        "code": "amount_above_max",
        "message": "refusing to pay: the challenge asks 0.002205 USDC, more than --max-amount 0.002 USDC",
    }
    assert (balances(paid), paid.rpc.sent, paid.upstream.calls) == ((payer_before, pay_to_before), [], [])

    async with bridge(paid, wallet, "--max-session-amount", "0.004") as session:
        first = await session.call_tool(GET_BALANCE_TOOL, ASKED)
        second = await session.call_tool(GET_BALANCE_TOOL, ASKED)
    assert first.isError is False, first.content
    assert second.isError is True and second.structuredContent is not None
    assert second.structuredContent["error"] == {
        "code": "session_amount_spent",
        "message": "refusing to pay: the call asks 0.002205 USDC, more than the 0.001795 USDC left of "
        "--max-session-amount 0.004 USDC",
    }
    assert len(paid.rpc.sent) == 1 and len(paid.upstream.calls) == 1
    assert balances(paid) == (
        payer_before - GET_BALANCE_PRICE_INTERNAL,
        pay_to_before + GET_BALANCE_PRICE_INTERNAL,
    )


async def test_the_bridge_pays_exact_when_the_wallet_has_no_credit(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str, tmp_path: Path
) -> None:
    paid = await start_paid_gateway(internal=True, env=credit_env(clean_redis_url))
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payer_before, pay_to_before = balances(paid)
    assert payer_before is not None and pay_to_before is not None
    async with bridge(paid, key_file(tmp_path, paid.chain.payer)) as session:
        result = await session.call_tool(GET_BALANCE_TOOL, ASKED)

    assert result.isError is False, result.content
    assert result.meta is not None and result.meta["x402/payment-response"]["success"] is True
    assert balances(paid) == (
        payer_before - GET_BALANCE_PRICE_INTERNAL,
        pay_to_before + GET_BALANCE_PRICE_INTERNAL,
    )


async def test_a_call_the_provider_failed_costs_nothing_and_spends_none_of_the_session_amount(
    start_paid_gateway: StartPaidGateway, tmp_path: Path
) -> None:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(500, {"error": "down"})
    before = balances(paid)
    async with bridge(paid, key_file(tmp_path, paid.chain.payer), "--max-session-amount", "0.003") as session:
        failed = await session.call_tool(GET_BALANCE_TOOL, ASKED)
        assert (balances(paid), paid.rpc.sent) == (before, [])
        paid.upstream.responder = static(200, PROVIDER_ANSWER)
        answered = await session.call_tool(GET_BALANCE_TOOL, ASKED)  # the whole 0.003 is still there

    assert failed.isError is True and failed.structuredContent is not None
    assert failed.structuredContent["status"] == 502
    assert answered.isError is False, answered.content
    assert len(paid.rpc.sent) == 1


def test_the_bridge_exits_with_one_line_when_the_gateway_is_out_of_reach_or_an_option_is_bad(
    tmp_path: Path,
) -> None:
    wallet = str(key_file(tmp_path, Keypair()))
    gateway = f"http://127.0.0.1:{refusing_port()}"
    unreachable = run_cli({}, "mcp", "--gateway", gateway, "--keypair", wallet)
    bad = run_cli({}, "mcp", "--gateway", gateway, "--keypair", wallet, "--max-session-amount", "lots")
    assert unreachable.returncode == 1
    assert unreachable.stderr.splitlines() == [
        f"x402-gateway mcp: {gateway}/mcp: ConnectError: All connection attempts failed"
    ]
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "x402-gateway mcp: --max-session-amount 'lots' is not a USDC amount such as 0.10"
    ]
