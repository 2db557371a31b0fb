"""The local chain's listing methods and the DAS sample, called through the JSON-RPC dispatcher."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from client.svm_payer import MintInfo, build_exact_transaction
from gateway.sandbox.chain import INVALID_PARAMS, TOKEN_PROGRAM, LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.sandbox.faucet import FUND_METHOD, fund_method, parse_amount, run_fund
from gateway.sandbox.upstreams import das_methods
from gateway.x402.svm import encode_transaction, sign_as_fee_payer
from gateway.x402.types import SOLANA_MAINNET, PaymentRequirements


def _call(server: LiteSvmRpcServer, method: str, params: Any) -> Any:
    answer = server.handle({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    assert "error" not in answer, answer
    return answer["result"]


def _send_payments(chain: UsdcChain, server: LiteSvmRpcServer, count: int, amount: int = 600) -> list[str]:
    """``count`` distinct payments of ``amount`` from the chain's payer, broadcast; their signatures."""
    requirements = PaymentRequirements(
        scheme="exact",
        network=SOLANA_MAINNET,
        amount=str(amount),
        asset=str(chain.mint),
        payTo=str(chain.pay_to),
        maxTimeoutSeconds=60,
        extra={"feePayer": str(chain.fee_payer.pubkey())},
    )
    mint = MintInfo(str(chain.mint), 6)
    sent: list[str] = []
    for _ in range(count):  # distinct transactions over one blockhash (each its own priority fee)
        tx = build_exact_transaction(requirements, chain.payer, mint, chain.blockhash)
        signed = encode_transaction(sign_as_fee_payer(tx, chain.fee_payer))
        sent.append(_call(server, "sendTransaction", [signed, {"encoding": "base64"}]))
    return sent


def _paid_chain() -> tuple[UsdcChain, LiteSvmRpcServer, str]:
    chain = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=chain.svm, extra_methods=das_methods())
    server.watch(*chain.addresses)
    (signature,) = _send_payments(chain, server, 1, amount=1005)
    return chain, server, signature


def test_landed_payments_are_listed_and_readable() -> None:
    chain, server, signature = _paid_chain()
    listed = _call(server, "getSignaturesForAddress", [str(chain.payer.pubkey()), {"limit": 5}])
    assert [s["signature"] for s in listed] == [signature]
    tx = _call(server, "getTransaction", [signature, {"encoding": "base64"}])
    assert tx["meta"]["err"] is None and tx["transaction"][1] == "base64"


def test_held_landings_wait_unexecuted_until_released_then_land_in_the_order_sent() -> None:
    chain = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=chain.svm, hold_landing=True)
    balance = chain.balance(chain.payer_ata)
    sent = _send_payments(chain, server, 2)

    statuses = _call(server, "getSignatureStatuses", [sent])
    assert statuses["value"] == [None, None] and chain.balance(chain.payer_ata) == balance
    server.land_held()

    landed = _call(server, "getSignatureStatuses", [sent])["value"]
    assert [s["err"] for s in landed] == [None, None]
    assert landed[0]["slot"] <= landed[1]["slot"]
    assert chain.balance(chain.payer_ata) == balance - 1200
    assert server.hold_landing is False


def test_a_delayed_landing_of_the_chain_served_before_lands_nothing_of_the_next() -> None:
    first = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=first.svm, land_delay_s=0.05)
    _send_payments(first, server, 1)
    second = setup_usdc_chain()
    server.use(second.svm)  # the next test's chain, its first timer still running
    server.hold_landing = True
    (held,) = _send_payments(second, server, 1)

    time.sleep(0.3)  # the first chain's timer has fired by now

    assert _call(server, "getSignatureStatuses", [[held]])["value"] == [None]
    server.land_held()
    assert _call(server, "getSignatureStatuses", [[held]])["value"][0]["err"] is None


def test_a_blockhash_is_valid_until_the_chain_expires_it() -> None:
    chain = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=chain.svm)
    signed_over = str(chain.blockhash)

    assert _call(server, "isBlockhashValid", [signed_over, {"commitment": "processed"}])["value"] is True
    chain.svm.expire_blockhash()
    assert _call(server, "isBlockhashValid", [signed_over])["value"] is False
    assert _call(server, "isBlockhashValid", [str(chain.blockhash)])["value"] is True
    refused = server.handle(
        {"jsonrpc": "2.0", "id": 1, "method": "isBlockhashValid", "params": ["not-a-hash"]}
    )
    assert refused["error"]["code"] == INVALID_PARAMS


def test_token_accounts_by_owner_and_program_accounts_filter_the_known_accounts() -> None:
    chain, server, _ = _paid_chain()
    owner = str(chain.pay_to)
    by_owner = _call(server, "getTokenAccountsByOwner", [owner, {"mint": str(chain.mint)}])
    assert [a["pubkey"] for a in by_owner["value"]] == [str(chain.pay_to_ata)]
    filters = [{"dataSize": 165}, {"memcmp": {"offset": 32, "bytes": owner}}]
    config = {"filters": filters, "dataSlice": {"offset": 64, "length": 8}}
    program = _call(server, "getProgramAccounts", [str(TOKEN_PROGRAM), config])
    assert [a["pubkey"] for a in program] == [str(chain.pay_to_ata)]
    stranger = str(Keypair().pubkey())
    assert _call(server, "getTokenAccountsByOwner", [stranger, {"mint": str(chain.mint)}])["value"] == []


def test_das_sample_answers_are_deterministic_and_marked() -> None:
    _, server, _ = _paid_chain()
    owner = str(Keypair().pubkey())
    first = _call(server, "getAssetsByOwner", {"ownerAddress": owner, "limit": 2})
    assert first == _call(server, "getAssetsByOwner", {"ownerAddress": owner, "limit": 2})
    assert first["sandbox"] is True and len(first["items"]) == 2
    asset = _call(server, "getAsset", {"id": owner})
    assert asset["sandbox"] is True and asset["id"] == owner
    assert _call(server, "searchAssets", [{"limit": 3}])["sandbox"] is True


def _funding_chain() -> tuple[UsdcChain, LiteSvmRpcServer]:
    chain = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=chain.svm)
    server.extra_methods[FUND_METHOD] = fund_method(chain, server)
    server.watch(*chain.addresses)
    return chain, server


def _supply(server: LiteSvmRpcServer, chain: UsdcChain) -> int:
    mint = _call(server, "getAccountInfo", [str(chain.mint), {"encoding": "jsonParsed"}])
    return int(mint["value"]["data"]["parsed"]["info"]["supply"])


def test_sandbox_fund_adds_usdc_and_sol_to_any_wallet_and_lists_its_account() -> None:
    chain, server = _funding_chain()
    supply = _supply(server, chain)
    wallet = Keypair().pubkey()
    account = get_associated_token_address(wallet, chain.mint)

    first = _call(server, FUND_METHOD, [str(wallet), {"usdcMicro": 2_500_000, "lamports": 7}])
    second = _call(server, FUND_METHOD, [str(wallet), {"usdcMicro": 1}])

    assert first == {
        "wallet": str(wallet),
        "usdcAccount": str(account),
        "usdcMicro": "2500000",
        "lamports": 7,
    }
    assert second == {**first, "usdcMicro": "2500001"}
    assert chain.balance(account) == 2_500_001 and chain.lamports(wallet) == 7
    assert _supply(server, chain) == supply + 2_500_001
    owned = _call(server, "getTokenAccountsByOwner", [str(wallet), {"mint": str(chain.mint)}])
    assert [entry["pubkey"] for entry in owned["value"]] == [str(account)]  # kept by a state snapshot
    assert server.calls[FUND_METHOD] == 2


def test_sandbox_fund_adds_to_a_wallet_that_already_holds_usdc() -> None:
    chain, server = _funding_chain()
    held = chain.balance(chain.payer_ata) or 0

    _call(server, FUND_METHOD, [str(chain.payer.pubkey()), {"usdcMicro": 5}])

    assert chain.balance(chain.payer_ata) == held + 5


def test_sandbox_fund_refuses_malformed_params_and_moves_nothing() -> None:
    chain, server = _funding_chain()
    supply = _supply(server, chain)
    wallet = str(Keypair().pubkey())

    for params in (
        None,
        [wallet],
        ["not-a-wallet", {"usdcMicro": 1}],
        [wallet, {"usdcMicro": -1}],
        [wallet, {"usdcMicro": 10**13}],
        [wallet, {"lamports": "5"}],
        [wallet, {"usdc": 5}],
    ):
        answer = server.handle({"jsonrpc": "2.0", "id": 1, "method": FUND_METHOD, "params": params})
        assert answer["error"]["code"] == INVALID_PARAMS, (params, answer)
    assert _supply(server, chain) == supply and chain.lamports(Pubkey.from_string(wallet)) == 0


async def test_fund_on_a_node_without_the_sandbox_method_says_it_is_no_sandbox() -> None:
    chain = setup_usdc_chain()
    with LiteSvmRpcServer(svm=chain.svm) as plain:  # the tests' Solana node: no sandboxFund
        url, err = plain.url, io.StringIO()
        code = await run_fund(str(Keypair().pubkey()), usdc_micro=1, lamports=0, rpc=url, err=err)

    assert code == 1
    assert err.getvalue() == (
        f"x402-gateway sandbox fund: {url} is not a sandbox's chain (it does not know sandboxFund): "
        "only `x402-gateway sandbox` hands out test funds\n"
    )
    assert plain.calls[FUND_METHOD] == 0


@pytest.mark.parametrize(
    ("text", "decimals", "base"),
    [("100", 6, 100_000_000), ("0.5", 9, 500_000_000), ("0", 6, 0), ("1000", 9, 10**12)],
)
def test_fund_amounts_are_read_in_base_units(text: str, decimals: int, base: int) -> None:
    assert parse_amount(text, decimals, 1000, "X") == base


@pytest.mark.parametrize("text", ["-1", "1001", "1e99999999999", "nan", "0.0000000001", "lots"])
def test_a_fund_amount_out_of_range_is_refused_in_words(text: str) -> None:
    with pytest.raises(
        ValueError, match=f"^'?{re.escape(text)}'? is (out of range: X from 0 to 1000|not an amount)"
    ):
        parse_amount(text, 9, 1000, "X")
