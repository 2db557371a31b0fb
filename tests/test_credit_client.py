"""``x402-gateway pay --top-up``, ``pay`` on prepaid credit and ``x402-gateway credits``, against
the real gateway selling credit (CREDITS_ENABLED on Redis, the internal facilitator settling on
LiteSVM): a top-up moves exactly its USDC and is credited; a call then spends credit with no
transaction and says what is left; a wallet without credit pays per call; a top-up above
``--max-amount`` or not sold is one line, and nothing is signed.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from client.credits import run_credits, run_open_session, run_revoke_session, run_top_up
from client.pay import run_pay, usdc_text
from tests.support.gateway_process import clean_env, command
from tests.support.gateway_server import PAID_GROUPS
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    GET_BALANCE_PROVIDER_PRICE,
    PaidGateway,
    StartPaidGateway,
    balance_body,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

ONE_USDC = 1_000_000


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.splitlines()


@pytest.fixture
def key_file(tmp_path: Path, usdc_chain: UsdcChain) -> Path:
    path = tmp_path / "payer.json"
    path.write_text(json.dumps(list(bytes(usdc_chain.payer))))
    return path


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(start_paid_gateway: StartPaidGateway, clean_redis_url: str) -> PaidGateway:
    credit = {
        "CREDITS_ENABLED": "true",
        "STATE_STORE_REST_URL": clean_redis_url,
        "ROUTE_GROUPS": f"{PAID_GROUPS},credits",
    }
    return await start_paid_gateway(internal=True, env=credit)


async def top_up(gateway: PaidGateway, key_file: Path, amount: str, **options: Any) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = await run_top_up(
        amount, gateway.url, keypair_file=str(key_file), rpc_url=gateway.rpc.url, out=out, err=err, **options
    )
    return Outcome(code, out.getvalue(), err.getvalue())


async def call(gateway: PaidGateway, key_file: Path, **options: Any) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = await run_pay(
        "POST",
        gateway.url + GET_BALANCE,
        keypair_file=str(key_file),
        data=json.dumps(balance_body()),
        rpc_url=gateway.rpc.url,
        out=out,
        err=err,
        **options,
    )
    return Outcome(code, out.getvalue(), err.getvalue())


async def credits(gateway: PaidGateway, key_file: Path, *, as_json: bool = False) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = await run_credits(gateway.url, keypair_file=str(key_file), as_json=as_json, out=out, err=err)
    return Outcome(code, out.getvalue(), err.getvalue())


def usdc(chain: UsdcChain) -> tuple[int | None, int | None]:
    """The payer's and payTo's USDC."""
    return chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)


async def test_a_top_up_buys_credit_that_pay_then_spends_without_a_transaction(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    wallet, pay_to = str(usdc_chain.payer.pubkey()), str(usdc_chain.pay_to)
    (payer_before, _) = usdc(usdc_chain)

    bought = await top_up(gateway, key_file, "1")

    assert bought.code == 0, bought.err
    assert json.loads(bought.out)["result"]["balanceMicroUsdc"] == str(ONE_USDC)
    assert bought.lines[0] == f"paid 1.00 USDC to {pay_to} (transaction {solana_rpc_server.sent[-1]})"
    assert bought.lines[-1].startswith(f"credit of {wallet}: 1.00 USDC, lapses 20")
    assert usdc(usdc_chain) == (payer_before - ONE_USDC, ONE_USDC)
    sent = len(solana_rpc_server.sent)

    spent = await call(gateway, key_file)

    left = ONE_USDC - GET_BALANCE_PROVIDER_PRICE  # credit is priced without the settlement fee
    assert spent.code == 0, spent.err
    assert "result" in json.loads(spent.out) and gateway.upstream_calls == 1
    assert spent.lines == [
        f"signed in as {wallet}, credit session opened",
        f"paid from prepaid credit, no transaction: {usdc_text(left)} of credit left "
        f"(X-Credit-Balance: {left})",
    ]
    assert len(solana_rpc_server.sent) == sent and usdc(usdc_chain) == (payer_before - ONE_USDC, ONE_USDC)

    balance = await credits(gateway, key_file)
    assert balance.code == 0 and balance.err == ""
    shown = balance.out.splitlines()
    assert shown[:3] == [
        f"wallet:         {wallet}",
        f"credit:         {usdc_text(left)}",
        "held:           0.00 USDC  (by calls in flight)",
    ]
    assert shown[3].startswith("lapses:         20") and shown[3].endswith(" UTC")
    scripted = json.loads((await credits(gateway, key_file, as_json=True)).out)
    assert scripted["ok"] is True and scripted["balanceMicroUsdc"] == str(left)
    assert scripted["wallet"] == wallet and scripted["expiresAt"] > 0


async def test_without_credit_pay_says_so_and_pays_per_call(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    wallet = str(usdc_chain.payer.pubkey())

    text = await call(gateway, key_file)
    scripted = await call(gateway, key_file, output="json")

    assert text.code == 0, text.err
    assert text.lines[:2] == [
        f"signed in as {wallet}, credit session opened: refused (insufficient_credit), paying instead",
        f"paid {usdc_text(GET_BALANCE_PRICE_INTERNAL)} to {usdc_chain.pay_to} "
        f"(transaction {solana_rpc_server.sent[0]})",
    ]
    result = json.loads(scripted.out)
    assert result["signInRefused"] == "insufficient_credit" and result["creditLeftMicroUsdc"] is None
    assert result["creditSession"] == "reused"  # the session this process opened, no 402 first
    assert result["paid"]["transaction"] == solana_rpc_server.sent[1]
    assert usdc(usdc_chain)[1] == 2 * GET_BALANCE_PRICE_INTERNAL
    balance = json.loads((await credits(gateway, key_file, as_json=True)).out)
    assert (balance["balanceMicroUsdc"], balance["expiresAt"]) == ("0", 0)


async def test_max_amount_applies_to_the_credit_price_when_the_wallet_has_credit(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    assert (await top_up(gateway, key_file, "1")).code == 0
    sent = list(solana_rpc_server.sent)

    on_credit = await call(gateway, key_file, max_amount="0.0001")  # price 0.002205, credit 0.000005

    assert on_credit.code == 0, on_credit.err
    assert json.loads(on_credit.out)["result"] == {"value": 1}
    assert on_credit.lines[1] == (
        f"paid from prepaid credit, no transaction: {usdc_text(ONE_USDC - GET_BALANCE_PROVIDER_PRICE)} of "
        f"credit left (X-Credit-Balance: {ONE_USDC - GET_BALANCE_PROVIDER_PRICE})"
    )
    assert solana_rpc_server.sent == sent


async def test_max_amount_below_the_credit_price_refuses_the_call_either_way(
    gateway: PaidGateway, usdc_chain: UsdcChain, key_file: Path
) -> None:
    assert (await top_up(gateway, key_file, "1")).code == 0
    upstream_calls = gateway.upstream_calls

    refused = await call(gateway, key_file, max_amount="0.000004")

    assert refused.code == 1 and refused.out == ""
    assert refused.lines == [
        "x402-gateway pay: refusing to pay: the challenge asks 0.002205 USDC paid, "
        "0.000005 USDC from credit, more than --max-amount 0.000004 USDC"
    ]
    assert gateway.upstream_calls == upstream_calls
    balance = json.loads((await credits(gateway, key_file, as_json=True)).out)
    assert balance["balanceMicroUsdc"] == str(ONE_USDC)


async def test_max_amount_within_the_credit_price_but_no_credit_signs_nothing_above_it(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    before = usdc(usdc_chain)

    refused = await call(gateway, key_file, max_amount="0.0001")

    assert refused.code == 1 and refused.out == ""
    assert refused.lines == [
        "x402-gateway pay: refusing to pay: the challenge asks 0.002205 USDC, more than --max-amount "
        "0.0001 USDC"
    ]
    assert solana_rpc_server.sent == [] and usdc(usdc_chain) == before


async def test_a_top_up_above_max_amount_is_refused_before_signing(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    before = usdc(usdc_chain)

    refused = await top_up(gateway, key_file, "5", max_amount="1")
    scripted = await top_up(gateway, key_file, "5", max_amount="4.99", output="json")

    assert refused.code == 1 and refused.out == ""
    assert refused.lines == [
        "x402-gateway pay: refusing to pay: the challenge asks 5.00 USDC, more than --max-amount 1.00 USDC"
    ]
    assert scripted.code == 1 and json.loads(scripted.out)["error"]["code"] == "amount_above_max"
    assert solana_rpc_server.sent == [] and usdc(usdc_chain) == before


async def test_a_top_up_the_gateway_does_not_sell_is_one_line(
    gateway: PaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    refused = await top_up(gateway, key_file, "7")
    malformed = await top_up(gateway, key_file, "2.5")

    assert refused.code == 1 and refused.out == ""
    assert refused.lines == [
        f"x402-gateway pay: {gateway.url} offers no top-up of 7 USDC (it sells 1, 5, 20 USDC)"
    ]
    assert malformed.code == 1
    assert malformed.lines == ["x402-gateway pay: --top-up '2.5' must be a whole number of USDC, such as 5"]
    assert solana_rpc_server.sent == []


async def test_a_gateway_without_credit_says_it_sells_none(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
) -> None:
    plain = await start_paid_gateway(internal=True)

    balance = await credits(plain, key_file)
    bought = await top_up(plain, key_file, "1")

    assert balance.code == 1 and balance.out == ""
    assert balance.lines == [
        f"x402-gateway credits: {plain.url} sells no prepaid credit (404 at /v1/x402/credits)"
    ]
    assert bought.lines == [
        f"x402-gateway pay: {plain.url} offers no top-up of 1 USDC (it sells no prepaid credit)"
    ]
    assert solana_rpc_server.sent == []


async def test_the_console_script_tops_up_and_reads_the_balance(
    gateway: PaidGateway, usdc_chain: UsdcChain, key_file: Path
) -> None:
    """The commands as typed: argparse wiring, exit codes, stdout and stderr (the gateway serves in
    this event loop, so the subprocesses run beside it, never blocking it)."""

    async def run(*args: str) -> Outcome:
        process = await asyncio.create_subprocess_exec(
            *command(),
            *args,
            env=clean_env({}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode is not None
        return Outcome(process.returncode, out.decode(), err.decode())

    key = ("--keypair", str(key_file))
    bought = await run("pay", "--top-up", "1", gateway.url + "/", *key, "--rpc", gateway.rpc.url, "--quiet")
    balance = await run("credits", gateway.url, *key)
    both = await run("pay", "--top-up", "1", gateway.url, gateway.url + GET_BALANCE, *key)

    assert bought.code == 0, bought.err
    assert json.loads(bought.out)["result"]["balanceMicroUsdc"] == str(ONE_USDC) and bought.err == ""
    assert balance.code == 0 and f"credit:         {usdc_text(ONE_USDC)}" in balance.out.splitlines()
    assert both.code == 2 and both.lines == [
        "x402-gateway pay: --top-up AMOUNT takes one BASE_URL and no --data"
    ]


# --- credit sessions ---------------------------------------------------------------------------


async def test_pay_keeps_its_credit_session_and_calls_on_it_with_no_402(
    gateway: PaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
    tmp_path: Path,
) -> None:
    wallet = str(usdc_chain.payer.pubkey())
    assert (await top_up(gateway, key_file, "1")).code == 0
    sent, kept = len(solana_rpc_server.sent), tmp_path / "sessions.json"

    first = await call(gateway, key_file, session_file=str(kept), session_cap_usdc="0.00001", output="json")
    second = await call(gateway, key_file, session_file=str(kept), output="json")
    third = await call(gateway, key_file, session_file=str(kept), output="json")

    one, two, three = (json.loads(o.out) for o in (first, second, third))
    assert (one["creditSession"], two["creditSession"]) == ("opened", "reused")
    assert (one["creditLeftMicroUsdc"], two["creditLeftMicroUsdc"]) == (str(ONE_USDC - 5), str(ONE_USDC - 10))
    # the cap of 10 is spent: a new session (1 USDC by default) serves the third call
    assert (three["creditSession"], three["creditLeftMicroUsdc"]) == ("opened", str(ONE_USDC - 15))
    assert kept.stat().st_mode & 0o777 == 0o600
    stored = json.loads(kept.read_text())
    assert [s["wallet"] for s in stored.values()] == [wallet]
    assert len(solana_rpc_server.sent) == sent and gateway.upstream_calls == 3
    balance = json.loads((await credits(gateway, key_file, as_json=True)).out)
    assert balance["balanceMicroUsdc"] == str(ONE_USDC - 15)


async def test_credits_opens_and_revokes_a_session(
    gateway: PaidGateway, usdc_chain: UsdcChain, key_file: Path, tmp_path: Path
) -> None:
    wallet = str(usdc_chain.payer.pubkey())
    assert (await top_up(gateway, key_file, "1")).code == 0
    kept = tmp_path / "sessions.json"

    out, err = io.StringIO(), io.StringIO()
    code = await run_open_session(
        gateway.url, "0.5", keypair_file=str(key_file), ttl_s=600, session_file=str(kept), out=out, err=err
    )
    shown = out.getvalue().splitlines()
    token = shown[1].split()[-1]
    spent = await call(gateway, key_file, session_file=str(kept), output="json")
    out, err = io.StringIO(), io.StringIO()
    revoked = await run_revoke_session(
        gateway.url, "", keypair_file=str(key_file), session_file=str(kept), as_json=True, out=out, err=err
    )
    answer = json.loads(out.getvalue())
    out, err = io.StringIO(), io.StringIO()
    again = await run_revoke_session(gateway.url, token, keypair_file=str(key_file), out=out, err=err)

    assert code == 0 and shown[0] == f"wallet:         {wallet}" and token.startswith(f"xcs1.{wallet}.")
    assert shown[2:] and shown[2] == "cap:            0.50 USDC"
    assert json.loads(spent.out)["creditSession"] == "reused"  # the session credits opened
    assert revoked == 0
    assert answer == {
        "ok": True,
        "revoked": True,
        "wallet": wallet,
        "capMicroUsdc": "500000",
        "spentMicroUsdc": str(GET_BALANCE_PROVIDER_PRICE),
    }
    assert json.loads(kept.read_text()) == {}
    assert again == 1
    assert err.getvalue().splitlines() == [
        f"x402-gateway credits: {gateway.url} revoked nothing: no live credit session under this token"
    ]


async def test_a_session_cap_out_of_bounds_is_a_usage_line(gateway: PaidGateway, key_file: Path) -> None:
    refused = await call(gateway, key_file, session_cap_usdc="0")
    out, err = io.StringIO(), io.StringIO()
    opened = await run_open_session(gateway.url, "1001", keypair_file=str(key_file), out=out, err=err)

    assert refused.code == 1 and refused.lines == [
        "x402-gateway pay: --session-cap '0' must be more than 0 and at most 1000 USDC"
    ]
    assert opened == 1 and err.getvalue().splitlines() == [
        "x402-gateway credits: --open-session '1001' must be more than 0 and at most 1000 USDC"
    ]
