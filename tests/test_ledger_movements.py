"""``GET /v1/x402/credits?movements=N``: a signed-in wallet's own latest movements, from the
ledger of record, beside its balance.

A served gateway (credit on, Redis, its own fee payer on the test's LiteSVM chain, a real
PostgreSQL ledger) settles real top-ups and calls; the wallet then signs in and reads them back.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from solders.keypair import Keypair

from client.credits import run_credits
from client.siwx_signer import sign_in
from tests.support.adversarial_credit import BALANCES, CALL_CREDIT, TOP_UP_1_CREDIT, CreditClient, credit_env
from tests.support.gateway_process import run_cli
from tests.support.gateway_server import run_gateway
from tests.support.ledger_served import LedgerGateway, allow_connections, ledger_gateway, settle_activity
from tests.support.paid_fixtures import Reply
from tests.support.postgres_server import create_database
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
    pytest.mark.asyncio(loop_scope="session"),
]


async def _get(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> Reply:
    async with http.get(url, headers=headers or {}) as response:
        return Reply(response.status, response.headers, await response.read())


async def _signed_get(base_url: str, query: str, wallet: Keypair) -> Reply:
    """The balance route with ``query``, signed in as ``wallet`` (answering its own 402)."""
    url = f"{base_url}{BALANCES}{query}"
    async with aiohttp.ClientSession() as http:
        asked = await _get(http, url)
        assert asked.status == 402, asked.body
        challenge = asked.header_json("payment-required")["extensions"]["sign-in-with-x"]
        return await _get(http, url, {"sign-in-with-x": sign_in(challenge, wallet)})


async def test_a_wallet_reads_its_own_movements_newest_first(ledger: LedgerGateway) -> None:
    [wallet, other] = await settle_activity(ledger)
    settled = {e.kind.value: e.signature for e in await ledger.entries() if e.wallet == str(wallet.pubkey())}
    before = int(time.time())

    reply = await _signed_get(ledger.gateway.url, "?movements=10", wallet)
    latest = await _signed_get(ledger.gateway.url, "?movements=1", wallet)
    plain = await _signed_get(ledger.gateway.url, "", wallet)
    others = await _signed_get(ledger.gateway.url, "?movements=100", other)

    assert reply.status == 200, reply.body
    result: dict[str, Any] = reply.json()["result"]
    assert result["balanceMicroUsdc"] == str(TOP_UP_1_CREDIT - 2 * CALL_CREDIT)
    movements = result["movements"]
    assert all(before - 60 <= m.pop("at") <= before + 1 for m in movements)
    getbalance = "solana.mainnet.provider_a.rpc.getBalance"
    assert movements == [
        {"kind": "credit_spent", "amountMicroUsdc": str(CALL_CREDIT), "route": getbalance},
        {"kind": "credit_spent", "amountMicroUsdc": str(CALL_CREDIT), "route": getbalance},
        {
            "kind": "sale",
            "amountMicroUsdc": str(ledger.gateway.balance_price),
            "route": getbalance,
            "signature": settled["sale"],
        },
        {
            "kind": "top_up",
            "amountMicroUsdc": str(TOP_UP_1_CREDIT),
            "route": "credits.topUp.1",
            "signature": settled["top_up"],
        },
    ]
    assert latest.status == 200 and [m["kind"] for m in latest.json()["result"]["movements"]] == [
        "credit_spent"
    ]
    assert plain.status == 200 and "movements" not in plain.json()["result"]
    assert [m["kind"] for m in others.json()["result"]["movements"]] == ["top_up"]  # its own only


BAD_COUNTS = ["?movements=0", "?movements=101", "?movements=ten", "?movements=1&movements=2"]


@pytest.mark.parametrize("query", BAD_COUNTS)
async def test_a_count_out_of_bounds_is_refused(ledger: LedgerGateway, query: str) -> None:
    reply = await _signed_get(ledger.gateway.url, query, Keypair())

    assert reply.status == 400, reply.body
    assert reply.error_code == "invalid_request"
    assert "movements" in reply.json()["error"]["message"]


async def test_a_ledger_it_cannot_reach_is_503_and_the_balance_alone_still_answers(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    redis_url: str,
    postgres_url: str,
) -> None:
    database = await create_database(postgres_url)
    async with ledger_gateway(
        usdc_chain, solana_rpc_server, upstream, redis_url, postgres_url, journal_url=database
    ) as ledger:
        client = CreditClient(ledger.gateway, ledger.chain)
        wallet, _ = client.wallet()
        assert (await client.top_up(await client.top_up_payment(wallet))).status == 200
        await allow_connections(postgres_url, database, allowed=False)
        try:
            refused = await _signed_get(ledger.gateway.url, "?movements=5", wallet)
            plain = await _signed_get(ledger.gateway.url, "", wallet)
        finally:
            await allow_connections(postgres_url, database, allowed=True)
        again = await _signed_get(ledger.gateway.url, "?movements=5", wallet)

    assert refused.status == 503, refused.body
    assert refused.json()["error"] == {
        "code": "store_unavailable",
        "message": "the ledger of record is unavailable",
    }
    assert plain.status == 200 and plain.json()["result"]["balanceMicroUsdc"] == str(TOP_UP_1_CREDIT)
    assert again.status == 200 and [m["kind"] for m in again.json()["result"]["movements"]] == ["top_up"]


async def test_without_a_ledger_movements_are_refused_not_shown_empty(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, upstream: Upstream, redis_url: str
) -> None:
    env = credit_env(usdc_chain, solana_rpc_server, upstream, redis_url)
    async with run_gateway(env) as running:
        refused = await _signed_get(running.url, "?movements=5", Keypair())
        plain = await _signed_get(running.url, "", Keypair())

    assert refused.status == 400, refused.body
    assert refused.json() == {
        "ok": False,
        "error": {
            "code": "invalid_request",
            "message": "movements are listed from the ledger of record, which this gateway does not keep",
        },
    }
    assert plain.status == 200 and "movements" not in plain.json()["result"]


async def test_openapi_documents_the_movements_parameter(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, upstream: Upstream, redis_url: str
) -> None:
    env = credit_env(usdc_chain, solana_rpc_server, upstream, redis_url)
    async with run_gateway(env) as running, aiohttp.ClientSession() as http:
        document = (await _get(http, running.url + "/openapi.json")).json()

    [parameter] = [p for p in document["paths"][BALANCES]["get"]["parameters"] if p.get("in") == "query"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == ("movements", "query", False)
    assert parameter["schema"]["minimum"] == 1 and parameter["schema"]["maximum"] == 100


async def test_the_credits_command_lists_the_movements(ledger: LedgerGateway, tmp_path: Path) -> None:
    [wallet, _] = await settle_activity(ledger)
    key_file = tmp_path / "wallet.json"
    key_file.write_text(json.dumps(list(bytes(wallet))))
    top_up = next(
        e for e in await ledger.entries() if e.wallet == str(wallet.pubkey()) and e.kind.value == "top_up"
    )
    out, err = io.StringIO(), io.StringIO()

    code = await run_credits(ledger.gateway.url, keypair_file=str(key_file), movements=2, out=out, err=err)
    as_json = io.StringIO()
    json_code = await run_credits(
        ledger.gateway.url, keypair_file=str(key_file), movements=4, as_json=True, out=as_json, err=err
    )

    assert (code, json_code, err.getvalue()) == (0, 0, "")
    lines = out.getvalue().splitlines()
    assert lines[4] == "movements:      2 latest, newest first"
    assert [line.split()[2:] for line in lines[5:]] == [
        ["UTC", "credit_spent", "0.000005", "USDC", "solana.mainnet.provider_a.rpc.getBalance"]
    ] * 2
    listed = json.loads(as_json.getvalue())["movements"]
    assert [m["kind"] for m in listed] == ["credit_spent", "credit_spent", "sale", "top_up"]
    assert listed[3]["signature"] == top_up.signature


async def test_the_credits_command_refuses_a_count_out_of_bounds_in_one_line() -> None:
    for count in ("0", "101", "some"):
        done = await asyncio.to_thread(
            run_cli, {}, "credits", "http://127.0.0.1:9", "--keypair", "k.json", "--movements", count
        )
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "a number of movements" in done.stderr
