"""The local facilitator against a real LiteSVM over the real JSON-RPC server.

Verify simulates and never broadcasts; settle moves exactly the amount, once. Duplicates are
caught through the shared store (also across facilitator instances, i.e. processes), and a
confirmation timeout is reconciled against the recorded signature without a second broadcast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from x402 import x402Client
from x402.mechanisms.svm import KeypairSigner
from x402.mechanisms.svm.exact.register import register_exact_svm_client
from x402.schemas import PaymentRequired as ReferencePaymentRequired

from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    build_payment_payload,
    create_exact_payment,
)
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.facilitators.local import SettlementRecord, load_local_facilitator
from gateway.outbound.solana_rpc import RpcResponseError, RpcUnavailable, SolanaRpc
from gateway.store import keys
from gateway.store.memory import MemoryStore
from gateway.x402.svm import TOKEN_2022_PROGRAM, Reason, decode_transaction, payment_key
from gateway.x402.types import SOLANA_DEVNET, PaymentPayload, PaymentRequirements
from tests.support.solana_fixtures import MakeFacilitator, exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

AMOUNT = 10_000


async def pay(server: LiteSvmRpcServer, chain: UsdcChain, req: PaymentRequirements) -> PaymentPayload:
    rpc = SolanaRpc(server.url)
    try:
        return await create_exact_payment(rpc, req, chain.payer)
    finally:
        await rpc.close()


def key_of(payload: PaymentPayload) -> str:
    return keys.settlement(payment_key(decode_transaction(payload.payload["transaction"])))


# --- supported --------------------------------------------------------------------------------


async def test_supported_lists_mainnet_with_our_fee_payer(
    usdc_chain: UsdcChain, make_local_facilitator: MakeFacilitator
) -> None:
    supported = await make_local_facilitator(usdc_chain).supported()
    address = str(usdc_chain.fee_payer.pubkey())
    assert [(k.x402Version, k.scheme, k.network, k.extra) for k in supported.kinds] == [
        (2, "exact", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", {"feePayer": address})
    ]
    assert supported.signers == {"solana:*": [address]}
    assert supported.extensions == []


async def test_supported_adds_devnet_when_its_rpc_is_configured(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    supported = await make_local_facilitator(usdc_chain, devnet_rpc_url=solana_rpc_server.url).supported()
    assert [k.network for k in supported.kinds] == [
        "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
        "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1",
    ]


# --- verify -----------------------------------------------------------------------------------


async def test_valid_payment_verifies_and_nothing_is_broadcast(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain, amount=str(AMOUNT))
    payload = await pay(solana_rpc_server, usdc_chain, req)
    verdict = await make_local_facilitator(usdc_chain).verify(payload, req)
    assert verdict.isValid, verdict.invalidMessage
    assert verdict.payer == str(usdc_chain.payer.pubkey())
    assert solana_rpc_server.calls["simulateTransaction"] == 1
    assert solana_rpc_server.calls["sendTransaction"] == 0
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 0


def _unfunded(make: Callable[..., UsdcChain]) -> tuple[UsdcChain, dict[str, Any]]:
    return make(payer_amount=AMOUNT - 1), {}


def _no_pay_to_account(make: Callable[..., UsdcChain]) -> tuple[UsdcChain, dict[str, Any]]:
    return make(create_pay_to_account=False), {}


def _wrong_decimals(make: Callable[..., UsdcChain]) -> tuple[UsdcChain, dict[str, Any]]:
    return make(), {"decimals": 9}


def _expired_blockhash(make: Callable[..., UsdcChain]) -> tuple[UsdcChain, dict[str, Any]]:
    return make(), {"expire": True}


@pytest.mark.parametrize(
    "scenario",
    [_unfunded, _no_pay_to_account, _wrong_decimals, _expired_blockhash],
    ids=["payer-lacks-funds", "payto-has-no-token-account", "wrong-decimals", "expired-blockhash"],
)
async def test_payment_that_would_fail_on_chain_is_refused_by_simulation(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    scenario: Callable[[Callable[..., UsdcChain]], tuple[UsdcChain, dict[str, Any]]],
) -> None:
    chain, options = scenario(make_usdc_chain)
    req = exact_requirements(chain, amount=str(AMOUNT))
    mint = MintInfo(address=str(chain.mint), decimals=options.get("decimals", 6))
    tx = build_exact_transaction(req, chain.payer, mint, chain.blockhash)
    if options.get("expire"):
        chain.svm.expire_blockhash()
    payload = build_payment_payload(req, tx)
    facilitator = make_local_facilitator(chain)

    verdict = await facilitator.verify(payload, req)
    assert (verdict.isValid, verdict.invalidReason) == (False, Reason.SIMULATION_FAILED.value)
    assert verdict.invalidMessage
    settled = await facilitator.settle(payload, req)
    # An account whose balance cannot cover the amount is refused before it is even simulated.
    reason = "insufficient_funds" if scenario is _unfunded else "transaction_simulation_failed"
    assert (settled.success, settled.errorReason, settled.transaction) == (False, reason, "")
    assert solana_rpc_server.calls["sendTransaction"] == 0
    assert chain.balance(chain.payer_ata) == (AMOUNT - 1 if scenario is _unfunded else 1_000_000_000)


async def test_devnet_payment_needs_a_devnet_rpc(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain, network=SOLANA_DEVNET)
    payload = await pay(solana_rpc_server, usdc_chain, req)
    without = await make_local_facilitator(usdc_chain).verify(payload, req)
    assert (without.isValid, without.invalidReason) == (False, "invalid_network")
    with_devnet = await make_local_facilitator(usdc_chain, devnet_rpc_url=solana_rpc_server.url).verify(
        payload, req
    )
    assert with_devnet.isValid, with_devnet.invalidMessage


# --- settle -----------------------------------------------------------------------------------


async def test_valid_payment_settles_and_moves_exactly_the_amount(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain, amount=str(AMOUNT))
    payload = await pay(solana_rpc_server, usdc_chain, req)
    payer_before = usdc_chain.balance(usdc_chain.payer_ata)
    lamports_before = usdc_chain.lamports(usdc_chain.fee_payer.pubkey())

    settled = await make_local_facilitator(usdc_chain).settle(payload, req)

    assert settled.success, settled.errorMessage
    assert settled.network == req.network
    assert settled.payer == str(usdc_chain.payer.pubkey())
    assert settled.amount == str(AMOUNT)
    assert solana_rpc_server.sent == [settled.transaction]
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == AMOUNT
    assert usdc_chain.balance(usdc_chain.payer_ata) == (payer_before or 0) - AMOUNT
    assert usdc_chain.lamports(usdc_chain.fee_payer.pubkey()) < lamports_before  # we paid the fee
    assert usdc_chain.lamports(usdc_chain.payer.pubkey()) == 0  # the client needed no SOL
    rpc = SolanaRpc(solana_rpc_server.url)
    try:
        [status] = await rpc.get_signature_statuses([settled.transaction])
        assert status is not None and status.confirmed and status.err is None
    finally:
        await rpc.close()


async def test_second_settle_of_a_settled_payment_is_a_duplicate(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain)
    payload = await pay(solana_rpc_server, usdc_chain, req)
    facilitator = make_local_facilitator(usdc_chain)
    first = await facilitator.settle(payload, req)
    second = await facilitator.settle(payload, req)

    assert first.success
    assert (second.success, second.errorReason) == (False, "duplicate_settlement")
    assert second.transaction == first.transaction  # lets an honest caller reconcile
    assert solana_rpc_server.sent == [first.transaction]
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 10_000
    replayed = await facilitator.verify(payload, req)
    assert (replayed.isValid, replayed.invalidReason) == (False, "duplicate_settlement")


async def test_duplicate_guard_is_shared_between_processes_through_the_store(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    store = MemoryStore()
    one, two = make_local_facilitator(usdc_chain, store), make_local_facilitator(usdc_chain, store)
    req = exact_requirements(usdc_chain)
    payload = await pay(solana_rpc_server, usdc_chain, req)
    assert (await one.settle(payload, req)).success
    again = await two.settle(payload, req)
    assert again.errorReason == "duplicate_settlement"
    assert len(solana_rpc_server.sent) == 1
    record = msgspec.json.decode(await store.get(key_of(payload)) or "", type=SettlementRecord)
    assert (record.state, record.signature) == ("settled", solana_rpc_server.sent[0])


@pytest.mark.parametrize("payer_amount", [1_000_000_000, 10_000], ids=["funded", "exactly the amount"])
async def test_concurrent_settles_of_one_payment_broadcast_once(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    payer_amount: int,
) -> None:
    """Holding exactly the amount, a settle that waited for its turn finds the funds moved by the
    one that landed this very payment: it answers for that one (duplicate_settlement), never as
    if the payment could not be afforded."""
    chain = make_usdc_chain(payer_amount=payer_amount)
    store = MemoryStore()
    facilitators = [make_local_facilitator(chain, store) for _ in range(4)]
    req = exact_requirements(chain)
    payload = await pay(solana_rpc_server, chain, req)
    answers = await asyncio.gather(*(f.settle(payload, req) for f in facilitators))
    assert sum(a.success for a in answers) == 1
    assert {a.errorReason for a in answers if not a.success} == {"duplicate_settlement"}
    assert len(solana_rpc_server.sent) == 1
    assert chain.balance(chain.pay_to_ata) == 10_000


async def test_confirmation_timeout_is_pending_and_reconciles_without_rebroadcast(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    store = MemoryStore()
    first_process = make_local_facilitator(usdc_chain, store, confirm_timeout_s=0.15)
    other_process = make_local_facilitator(usdc_chain, store, confirm_timeout_s=0.15)
    req = exact_requirements(usdc_chain)
    payload = await pay(solana_rpc_server, usdc_chain, req)
    solana_rpc_server.hold_confirmations = True

    pending = await first_process.settle(payload, req)
    assert (pending.success, pending.errorReason) == (False, "settlement_pending")
    signature = pending.transaction
    assert signature and solana_rpc_server.sent == [signature]
    record = msgspec.json.decode(await store.get(key_of(payload)) or "", type=SettlementRecord)
    assert (record.state, record.signature) == ("pending", signature)

    still = await other_process.settle(payload, req)
    assert (still.errorReason, still.transaction) == ("settlement_pending", signature)
    assert (await first_process.verify(payload, req)).invalidReason == "duplicate_settlement"

    solana_rpc_server.release_confirmations()
    reconciled = await other_process.settle(payload, req)
    assert reconciled.success, reconciled.errorMessage
    assert reconciled.transaction == signature
    assert reconciled.amount == req.amount
    after = await first_process.settle(payload, req)
    assert (after.errorReason, after.transaction) == ("duplicate_settlement", signature)
    assert solana_rpc_server.sent == [signature]
    assert solana_rpc_server.calls["sendTransaction"] == 1
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 10_000


async def test_token_2022_payment_verifies_and_settles(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
) -> None:
    chain = make_usdc_chain(mint=Keypair().pubkey(), token_program=TOKEN_2022_PROGRAM)
    req = exact_requirements(chain, amount="2500")
    payload = await pay(solana_rpc_server, chain, req)
    transfer = decode_transaction(payload.payload["transaction"]).message
    assert TOKEN_2022_PROGRAM in transfer.account_keys
    facilitator = make_local_facilitator(chain)
    assert (await facilitator.verify(payload, req)).isValid
    settled = await facilitator.settle(payload, req)
    assert settled.success, settled.errorMessage
    assert chain.balance(chain.pay_to_ata) == 2500


@pytest.mark.filterwarnings("ignore:Client is deprecated")
async def test_reference_x402_client_payment_verifies_and_settles(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain, amount="1234")
    client = x402Client()
    register_exact_svm_client(client, KeypairSigner(usdc_chain.payer), rpc_url=solana_rpc_server.url)
    required = ReferencePaymentRequired.model_validate(
        {
            "x402Version": 2,
            "resource": {"url": "http://gateway.test/v1/rpc"},
            "accepts": [msgspec.to_builtins(req)],
        }
    )
    reference_payload = await client.create_payment_payload(required)
    payload = msgspec.convert(reference_payload.model_dump(by_alias=True, exclude_none=True), PaymentPayload)
    assert solana_rpc_server.calls["getAccountInfo"] >= 1  # it read the mint from our server
    facilitator = make_local_facilitator(usdc_chain)

    verdict = await facilitator.verify(payload, req)
    assert verdict.isValid, verdict.invalidMessage
    settled = await facilitator.settle(payload, req)
    assert settled.success, settled.errorMessage
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 1234


# --- failures of the parts around it -----------------------------------------------------------

SECRET_URL = "http://127.0.0.1:1/rpc/SECRET-API-KEY?api-key=SECRET-API-KEY"


async def test_unreachable_rpc_is_unavailable_and_never_names_the_url(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, make_local_facilitator: MakeFacilitator
) -> None:
    req = exact_requirements(usdc_chain)
    payload = await pay(solana_rpc_server, usdc_chain, req)
    facilitator = make_local_facilitator(usdc_chain, mainnet_rpc_url=SECRET_URL)
    for operation in (facilitator.verify, facilitator.settle):
        with pytest.raises(FacilitatorUnavailable) as caught:
            await operation(payload, req)
        shown = f"{caught.value}|{caught.value!r}|{caught.value.__cause__!r}|{facilitator!r}"
        assert "SECRET-API-KEY" not in shown and "127.0.0.1:1" not in shown
    assert solana_rpc_server.calls["sendTransaction"] == 0


async def test_rpc_client_errors_are_typed_and_redacted(solana_rpc_server: LiteSvmRpcServer) -> None:
    answering = SolanaRpc(solana_rpc_server.url + "/?api-key=SECRET-API-KEY")
    unreachable = SolanaRpc(SECRET_URL)
    try:
        with pytest.raises(RpcResponseError) as refused:
            await answering.call("noSuchMethod", [], int)
        assert refused.value.code == -32601
        with pytest.raises(RpcResponseError):
            await answering.get_balance("not-a-key")
        with pytest.raises(RpcUnavailable) as down:
            await unreachable.get_latest_blockhash()
        for error in (refused.value, down.value):
            assert "SECRET-API-KEY" not in f"{error}|{error!r}|{error.__cause__!r}"
        assert "SECRET" not in repr(answering)
        assert await answering.get_account_info(str(Pubkey.new_unique())) is None
    finally:
        await answering.close()
        await unreachable.close()


async def test_load_local_facilitator_from_the_wallet_variable() -> None:
    keypair = Keypair()
    store = MemoryStore()
    assert load_local_facilitator(None, store, mainnet_rpc_url="http://127.0.0.1:1") is None
    loaded = load_local_facilitator(str(keypair), store, mainnet_rpc_url="http://127.0.0.1:1")
    assert loaded is not None and loaded.fee_payer == str(keypair.pubkey())
    assert str(keypair) not in repr(loaded)
    await loaded.close()
    with pytest.raises(ValueError, match="64-byte"):
        load_local_facilitator(str(keypair)[:20], store, mainnet_rpc_url="http://127.0.0.1:1")
