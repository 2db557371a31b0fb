"""Attacks on the operator's fee payer, mounted against the running gateway settling with its own
wallet (``FACILITATOR_URL=internal``) on LiteSVM, with real signed transactions.

* Twelve concurrent payments (different memos) from a wallet that affords one: before, every
  one was simulated against the same balance and broadcast with preflight skipped, so the fee
  payer paid for those that failed on chain. Now exactly one settles and nothing else is sent.
* Payments whose compute budget is over the operator's caps (the priority fee the fee payer
  would pay) are refused at verify: no provider call, nothing broadcast, no balance moves.
* Payments that would move the fee payer's money, pay the wrong party or the wrong amount,
  or smuggle extra instructions are refused the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.svm_payer import (
    MintInfo,
    build_payment_payload,
    exact_instructions,
    memo_instruction,
    partially_signed_transaction,
    transfer_checked_instruction,
)
from gateway.x402.svm import TOKEN_PROGRAM, associated_token_address
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    PaidGateway,
    StartPaidGateway,
    balance_body,
)
from tests.support.solana_rpc_server import UsdcChain, set_token_account

CONCURRENT_PAYMENTS = 12
SPL_CLOSE_ACCOUNT = 9
NO_MONEY_MOVED = Money(0, 0, 0)
COMPUTE_LIMIT = "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction"
COMPUTE_PRICE_TOO_HIGH = (
    "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high"
)


async def _internal(start_paid_gateway: StartPaidGateway) -> PaidGateway:
    # One wallet pays every request here: its own limit must not be what refuses them.
    return await start_paid_gateway(internal=True, env={"RATE_LIMIT_WALLET_RPS": "1000"})


def _mint(chain: UsdcChain) -> MintInfo:
    return MintInfo(address=str(chain.mint), decimals=chain.decimals)


def _payment(
    paid: PaidGateway,
    requirements: PaymentRequirements,
    resource: ResourceInfo,
    instructions: list[Instruction],
    payer: Keypair | None = None,
) -> PaymentPayload:
    fee_payer = Pubkey.from_string(str((requirements.extra or {})["feePayer"]))
    tx = partially_signed_transaction(
        instructions, fee_payer=fee_payer, signers=[payer or paid.chain.payer], blockhash=paid.chain.blockhash
    )
    return build_payment_payload(requirements, tx, resource=resource)


async def test_twelve_concurrent_payments_from_a_wallet_that_affords_one_settle_exactly_one(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await _internal(start_paid_gateway)
    poor = Keypair()
    poor_ata = set_token_account(usdc_chain.svm, poor.pubkey(), usdc_chain.mint, GET_BALANCE_PRICE_INTERNAL)
    requirements, resource = await paid.requirements()
    payments = [paid.sign(requirements, resource, payer=poor) for _ in range(CONCURRENT_PAYMENTS)]
    assert len({p.payload["transaction"] for p in payments}) == CONCURRENT_PAYMENTS  # distinct memos
    before = Money.of(usdc_chain, poor_ata)

    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), p) for p in payments))

    statuses = sorted(reply.status for reply in replies)
    assert statuses == [200] + [402] * (CONCURRENT_PAYMENTS - 1), [r.body for r in replies]
    for refused in (reply for reply in replies if reply.status == 402):
        # Refused at settlement (its simulation, under the payer's lock, found the balance
        # spent) or already at verify, when the winner had settled first: never broadcast.
        assert refused.json()["error"] in {"settlement_failed", "transaction_simulation_failed"}
        assert "payment-response" not in refused.headers
    assert len(paid.rpc.sent) == 1  # nothing else reached the chain, so nothing failed there
    assert Money.of(usdc_chain, poor_ata).minus(before) == Money(
        -GET_BALANCE_PRICE_INTERNAL, GET_BALANCE_PRICE_INTERNAL, -ONE_SETTLEMENT_FEE
    )


@pytest.mark.parametrize(
    ("compute_unit_limit", "compute_unit_price", "reason"),
    [
        (50_001, 1, COMPUTE_LIMIT),
        (20_000, 20_001, COMPUTE_PRICE_TOO_HIGH),
        (1_400_000, 5_000_000, COMPUTE_LIMIT),
    ],
)
async def test_a_compute_budget_over_the_caps_is_refused_before_anything_is_broadcast(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    compute_unit_limit: int,
    compute_unit_price: int,
    reason: str,
) -> None:
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    instructions = exact_instructions(
        requirements,
        usdc_chain.payer.pubkey(),
        _mint(usdc_chain),
        compute_unit_limit=compute_unit_limit,
        compute_unit_price=compute_unit_price,
    )
    before = Money.of(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), _payment(paid, requirements, resource, instructions))

    assert reply.status == 402 and reply.json()["error"] == reason
    assert paid.upstream_calls == 0 and paid.rpc.sent == []
    assert Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED


def _someone_elses_account(chain: UsdcChain) -> Pubkey:
    return associated_token_address(Keypair().pubkey(), chain.mint, TOKEN_PROGRAM)


def _second_transfer(chain: UsdcChain, requirements: PaymentRequirements) -> Instruction:
    """A second TransferChecked out of the payer's account, after the memo."""
    return _replace_transfer(chain, requirements, destination=_someone_elses_account(chain))


def _close_account(chain: UsdcChain) -> Instruction:
    """Close the payer's token account, its rent to the payer: a second instruction that moves funds."""
    payer = chain.payer.pubkey()
    account = associated_token_address(payer, chain.mint, TOKEN_PROGRAM)
    metas = [
        AccountMeta(account, is_signer=False, is_writable=True),
        AccountMeta(payer, is_signer=False, is_writable=True),
        AccountMeta(payer, is_signer=True, is_writable=False),
    ]
    return Instruction(TOKEN_PROGRAM, bytes([SPL_CLOSE_ACCOUNT]), metas)


Tamper = Callable[[UsdcChain, PaymentRequirements, list[Instruction]], list[Instruction]]


def _replace_transfer(chain: UsdcChain, requirements: PaymentRequirements, **changes: object) -> Instruction:
    pay_to = Pubkey.from_string(requirements.payTo)
    fields: dict[str, object] = {
        "source": associated_token_address(chain.payer.pubkey(), chain.mint, TOKEN_PROGRAM),
        "mint": chain.mint,
        "destination": associated_token_address(pay_to, chain.mint, TOKEN_PROGRAM),
        "authority": chain.payer.pubkey(),
        "amount": int(requirements.amount),
        "decimals": chain.decimals,
        "token_program": TOKEN_PROGRAM,
    }
    fields.update(changes)
    return transfer_checked_instruction(**fields)  # type: ignore[arg-type]


TAMPERS: dict[str, tuple[Tamper, str]] = {
    "wrong amount": (
        lambda c, r, ix: [*ix[:2], _replace_transfer(c, r, amount=int(r.amount) - 1), *ix[3:]],
        "invalid_exact_svm_payload_amount_mismatch",
    ),
    "wrong recipient": (
        lambda c, r, ix: [
            *ix[:2],
            _replace_transfer(c, r, destination=_someone_elses_account(c)),
            *ix[3:],
        ],
        "invalid_exact_svm_payload_recipient_mismatch",
    ),
    "a second transfer after the memo": (
        lambda c, r, ix: [*ix, _second_transfer(c, r)],
        "invalid_exact_svm_payload_unknown_fifth_instruction",
    ),
    "a close-account after the transfer": (
        lambda c, r, ix: [*ix, _close_account(c)],
        "invalid_exact_svm_payload_unknown_fifth_instruction",
    ),
}


@pytest.mark.parametrize("attack", sorted(TAMPERS))
async def test_a_payment_tampered_to_move_other_money_is_refused_and_nothing_moves(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, attack: str
) -> None:
    tamper, reason = TAMPERS[attack]
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    honest = exact_instructions(requirements, usdc_chain.payer.pubkey(), _mint(usdc_chain))
    before = Money.of(usdc_chain)

    payment = _payment(paid, requirements, resource, tamper(usdc_chain, requirements, honest))
    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402 and reply.json()["error"] == reason, reply.body
    assert paid.upstream_calls == 0 and paid.rpc.sent == []
    assert Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED


async def test_the_fee_payer_as_the_transfer_authority_is_refused_and_nothing_moves(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    fee_payer = usdc_chain.fee_payer.pubkey()
    honest = exact_instructions(requirements, usdc_chain.payer.pubkey(), _mint(usdc_chain))
    stolen = _replace_transfer(
        usdc_chain,
        requirements,
        source=associated_token_address(fee_payer, usdc_chain.mint, TOKEN_PROGRAM),
        authority=fee_payer,
    )
    before = Money.of(usdc_chain)

    # The client still signs (the memo names it), so only the transfer's authority is the attack.
    memo = memo_instruction(b"fee payer pays", signers=[usdc_chain.payer.pubkey()])
    payment = _payment(paid, requirements, resource, [*honest[:2], stolen, memo])
    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402, reply.body
    assert reply.json()["error"] == "invalid_exact_svm_payload_transaction_fee_payer_transferring_funds"
    assert paid.upstream_calls == 0 and paid.rpc.sent == []
    assert Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED


async def test_a_cheap_routes_payment_is_refused_on_an_expensive_route(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await _internal(start_paid_gateway)
    cheap = await paid.payment(GET_BALANCE)
    expensive = "/v1/x402/solana/mainnet/provider_a/das/searchAssets"
    before = Money.of(usdc_chain)

    reply = await paid.pay(expensive, {"params": {"ownerAddress": str(usdc_chain.payer.pubkey())}}, cheap)

    assert reply.status == 402 and reply.json()["error"] == "amount_mismatch", reply.body
    assert paid.upstream_calls == 0 and paid.rpc.sent == []
    assert Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED
