"""Every verification rule of an exact Solana payment, each broken by one real transaction.

Transactions are built against a real LiteSVM chain (its blockhash, its accounts) with the
same builder the gateway uses. Each broken payment is refused by the pure check with its SDK
reason, and by the local facilitator over the real RPC server before any simulation.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import base58
import msgspec
import pytest
from solders.address_lookup_table_account import AddressLookupTableAccount
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import Message, MessageV0
from solders.null_signer import NullSigner
from solders.pubkey import Pubkey
from solders.system_program import TransferParams, transfer
from solders.transaction import VersionedTransaction

from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    build_payment_payload,
    compute_unit_limit_instruction,
    compute_unit_price_instruction,
    exact_instructions,
    memo_instruction,
    partially_signed_transaction,
    transfer_checked_instruction,
)
from gateway.x402.svm import (
    LIGHTHOUSE_PROGRAM,
    TOKEN_2022_PROGRAM,
    ExactPolicy,
    Reason,
    associated_token_address,
    check_exact_payment,
    decode_transaction,
    encode_transaction,
    parse_wallet,
    payment_key,
    sign_as_fee_payer,
)
from gateway.x402.types import SOLANA_DEVNET, PaymentPayload, PaymentRequirements
from tests.support.solana_fixtures import MakeFacilitator, exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

Case = tuple[PaymentPayload, PaymentRequirements]


def mint_info(chain: UsdcChain) -> MintInfo:
    return MintInfo(address=str(chain.mint), decimals=chain.decimals, token_program=str(chain.token_program))


def base_instructions(
    chain: UsdcChain, req: PaymentRequirements, memo: bytes = b"nonce"
) -> list[Instruction]:
    return exact_instructions(req, chain.payer.pubkey(), mint_info(chain), memo=memo)


def signed(
    chain: UsdcChain,
    req: PaymentRequirements,
    instructions: list[Instruction],
    signers: list[Keypair] | None = None,
) -> PaymentPayload:
    tx = partially_signed_transaction(
        instructions,
        fee_payer=chain.fee_payer.pubkey(),
        signers=[chain.payer] if signers is None else signers,
        blockhash=chain.blockhash,
    )
    return build_payment_payload(req, tx)


def with_transaction(req: PaymentRequirements, raw: bytes | str) -> PaymentPayload:
    encoded = raw if isinstance(raw, str) else base64.b64encode(raw).decode()
    return PaymentPayload(x402Version=2, payload={"transaction": encoded}, accepted=req)


def transfer_ix(chain: UsdcChain, **overrides: Any) -> Instruction:
    args: dict[str, Any] = {
        "source": chain.payer_ata,
        "mint": chain.mint,
        "destination": chain.pay_to_ata,
        "authority": chain.payer.pubkey(),
        "amount": 10_000,
        "decimals": chain.decimals,
        "token_program": chain.token_program,
    }
    args.update(overrides)
    return transfer_checked_instruction(**args)


def replace_ix(chain: UsdcChain, index: int, ix: Instruction) -> Case:
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)
    ixs[index] = ix
    return signed(chain, req, ixs), req


# --- one builder per broken rule ------------------------------------------------------------


def case_x402_version(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return msgspec.structs.replace(payload, x402Version=3), req


def case_accepted_scheme(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return msgspec.structs.replace(payload, accepted=msgspec.structs.replace(req, scheme="upto")), req


def case_required_scheme(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return payload, msgspec.structs.replace(req, scheme="upto")


def case_network_mismatch(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return msgspec.structs.replace(payload, accepted=msgspec.structs.replace(req, network=SOLANA_DEVNET)), req


def case_not_solana(chain: UsdcChain) -> Case:
    req = exact_requirements(chain, network="eip155:8453")
    return signed(chain, req, base_instructions(chain, req)), req


def case_bad_amount(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return payload, msgspec.structs.replace(req, amount="0.01")


def case_missing_fee_payer(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return payload, msgspec.structs.replace(req, extra={})


def case_foreign_fee_payer(chain: UsdcChain) -> Case:
    other = Keypair()
    req = exact_requirements(chain, fee_payer=str(other.pubkey()))
    tx = partially_signed_transaction(
        base_instructions(chain, req),
        fee_payer=other.pubkey(),
        signers=[chain.payer],
        blockhash=chain.blockhash,
    )
    return build_payment_payload(req, tx), req


def case_payload_shape(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    return PaymentPayload(x402Version=2, payload={"transaction": 42}, accepted=req), req


def case_not_base64(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    return with_transaction(req, "this is not base64!"), req


def case_not_a_transaction(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    return with_transaction(req, b"\x02hello, I am not a transaction"), req


def case_legacy_transaction(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    message = Message.new_with_blockhash(
        base_instructions(chain, req), chain.fee_payer.pubkey(), chain.blockhash
    )
    tx = VersionedTransaction(message, [NullSigner(chain.fee_payer.pubkey()), chain.payer])
    return build_payment_payload(req, tx), req


def case_lookup_table(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    table = AddressLookupTableAccount(Keypair().pubkey(), [chain.mint])
    message = MessageV0.try_compile(
        chain.fee_payer.pubkey(), base_instructions(chain, req), [table], chain.blockhash
    )
    assert message.address_table_lookups
    tx = VersionedTransaction(message, [NullSigner(chain.fee_payer.pubkey()), chain.payer])
    return build_payment_payload(req, tx), req


def case_fee_payer_not_first(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    message = MessageV0.try_compile(chain.payer.pubkey(), base_instructions(chain, req), [], chain.blockhash)
    return build_payment_payload(req, VersionedTransaction(message, [chain.payer])), req


def case_too_few_instructions(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)
    return signed(chain, req, [ixs[0], ixs[2]]), req


def case_too_many_instructions(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)[:3] + [memo_instruction(b"m%d" % i) for i in range(5)]
    return signed(chain, req, ixs), req


def case_fee_payer_in_memo(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    ixs = [*base_instructions(chain, req)[:3], memo_instruction(b"hi", signers=[chain.fee_payer.pubkey()])]
    return signed(chain, req, ixs), req


def case_fee_payer_in_compute_budget(chain: UsdcChain) -> Case:
    ix = compute_unit_limit_instruction(20_000)
    ix = Instruction(ix.program_id, bytes(ix.data), [AccountMeta(chain.fee_payer.pubkey(), False, True)])
    return replace_ix(chain, 0, ix)


def case_fee_payer_is_authority(chain: UsdcChain) -> Case:
    fee_payer = chain.fee_payer.pubkey()
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)
    ixs[2] = transfer_ix(
        chain,
        source=associated_token_address(fee_payer, chain.mint, chain.token_program),
        authority=fee_payer,
    )
    return signed(chain, req, ixs, signers=[]), req


def case_fee_payer_is_source(chain: UsdcChain) -> Case:
    return replace_ix(chain, 2, transfer_ix(chain, source=chain.fee_payer.pubkey()))


def case_third_signer(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    stranger = Keypair()
    ixs = [*base_instructions(chain, req)[:3], memo_instruction(b"hi", signers=[stranger.pubkey()])]
    return signed(chain, req, ixs, signers=[chain.payer, stranger]), req


def case_payer_signature_missing(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    tx = VersionedTransaction(
        MessageV0.try_compile(chain.fee_payer.pubkey(), base_instructions(chain, req), [], chain.blockhash),
        [NullSigner(chain.fee_payer.pubkey()), NullSigner(chain.payer.pubkey())],
    )
    return build_payment_payload(req, tx), req


def case_payer_signature_invalid(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    tx = partially_signed_transaction(
        base_instructions(chain, req),
        fee_payer=chain.fee_payer.pubkey(),
        signers=[chain.payer],
        blockhash=chain.blockhash,
    )
    forged = VersionedTransaction.populate(
        tx.message, [tx.signatures[0], chain.payer.sign_message(b"something else")]
    )
    return build_payment_payload(req, forged), req


def case_limit_not_first(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)
    ixs[0], ixs[1] = ixs[1], ixs[0]
    return signed(chain, req, ixs), req


def case_limit_too_high(chain: UsdcChain) -> Case:
    return replace_ix(chain, 0, compute_unit_limit_instruction(200_001))


def case_price_missing(chain: UsdcChain) -> Case:
    return replace_ix(chain, 1, memo_instruction(b"no price"))


def case_price_too_high(chain: UsdcChain) -> Case:
    return replace_ix(chain, 1, compute_unit_price_instruction(5_000_001))


def case_plain_transfer(chain: UsdcChain) -> Case:
    # SPL Token ``Transfer`` (discriminator 3): no mint, no decimals.
    ix = Instruction(
        chain.token_program,
        bytes([3]) + (10_000).to_bytes(8, "little"),
        [
            AccountMeta(chain.payer_ata, False, True),
            AccountMeta(chain.pay_to_ata, False, True),
            AccountMeta(chain.payer.pubkey(), True, False),
        ],
    )
    return replace_ix(chain, 2, ix)


def case_transfer_not_token_program(chain: UsdcChain) -> Case:
    ix = transfer_ix(chain)
    return replace_ix(chain, 2, Instruction(Keypair().pubkey(), bytes(ix.data), list(ix.accounts)))


def case_mint_mismatch(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    payload = signed(chain, req, base_instructions(chain, req))
    return payload, msgspec.structs.replace(req, asset=str(Keypair().pubkey()))


def case_recipient_is_payer(chain: UsdcChain) -> Case:
    return replace_ix(chain, 2, transfer_ix(chain, destination=chain.payer_ata))


def case_recipient_other_token_program(chain: UsdcChain) -> Case:
    destination = associated_token_address(chain.pay_to, chain.mint, TOKEN_2022_PROGRAM)
    return replace_ix(chain, 2, transfer_ix(chain, destination=destination))


def case_amount_too_low(chain: UsdcChain) -> Case:
    return replace_ix(chain, 2, transfer_ix(chain, amount=9_999))


def case_amount_too_high(chain: UsdcChain) -> Case:
    return replace_ix(chain, 2, transfer_ix(chain, amount=10_001))


def case_authority_not_the_signer(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    ixs = base_instructions(chain, req)
    ix = transfer_ix(chain, authority=Keypair().pubkey())
    metas = list(ix.accounts)
    metas[3] = AccountMeta(metas[3].pubkey, is_signer=False, is_writable=False)
    ixs[2] = Instruction(ix.program_id, bytes(ix.data), metas)
    ixs[3] = memo_instruction(b"payer signs here", signers=[chain.payer.pubkey()])
    return signed(chain, req, ixs), req


def case_unknown_fourth(chain: UsdcChain) -> Case:
    pay = transfer(TransferParams(from_pubkey=chain.payer.pubkey(), to_pubkey=chain.pay_to, lamports=1))
    return replace_ix(chain, 3, pay)


def case_unknown_fifth(chain: UsdcChain) -> Case:
    req = exact_requirements(chain)
    pay = transfer(TransferParams(from_pubkey=chain.payer.pubkey(), to_pubkey=chain.pay_to, lamports=1))
    return signed(chain, req, [*base_instructions(chain, req), pay]), req


def case_memo_missing(chain: UsdcChain) -> Case:
    req = exact_requirements(chain, memo="order-42")
    return signed(chain, req, base_instructions(chain, req)[:3]), req


def case_memo_twice(chain: UsdcChain) -> Case:
    req = exact_requirements(chain, memo="order-42")
    ixs = [*base_instructions(chain, req, memo=b"order-42"), memo_instruction(b"order-42")]
    return signed(chain, req, ixs), req


def case_memo_mismatch(chain: UsdcChain) -> Case:
    req = exact_requirements(chain, memo="order-42")
    return signed(chain, req, base_instructions(chain, req, memo=b"order-43")), req


BROKEN: list[tuple[Callable[[UsdcChain], Case], Reason]] = [
    (case_x402_version, Reason.INVALID_X402_VERSION),
    (case_accepted_scheme, Reason.UNSUPPORTED_SCHEME),
    (case_required_scheme, Reason.UNSUPPORTED_SCHEME),
    (case_network_mismatch, Reason.INVALID_NETWORK),
    (case_not_solana, Reason.INVALID_NETWORK),
    (case_bad_amount, Reason.INVALID_PAYMENT_REQUIREMENTS),
    (case_missing_fee_payer, Reason.MISSING_FEE_PAYER),
    (case_foreign_fee_payer, Reason.FEE_PAYER_NOT_MANAGED),
    (case_payload_shape, Reason.INVALID_PAYLOAD),
    (case_not_base64, Reason.COULD_NOT_BE_DECODED),
    (case_not_a_transaction, Reason.COULD_NOT_BE_DECODED),
    (case_legacy_transaction, Reason.COULD_NOT_BE_DECODED),
    (case_lookup_table, Reason.TRANSACTION),
    (case_fee_payer_not_first, Reason.MISSING_FEE_PAYER),
    (case_too_few_instructions, Reason.INSTRUCTIONS_LENGTH),
    (case_too_many_instructions, Reason.INSTRUCTIONS_LENGTH),
    (case_fee_payer_in_memo, Reason.FEE_PAYER_IN_ACCOUNTS),
    (case_fee_payer_in_compute_budget, Reason.FEE_PAYER_IN_ACCOUNTS),
    (case_fee_payer_is_authority, Reason.FEE_PAYER_TRANSFERRING),
    (case_fee_payer_is_source, Reason.FEE_PAYER_TRANSFERRING),
    (case_third_signer, Reason.TRANSACTION),
    (case_payer_signature_missing, Reason.TRANSACTION),
    (case_payer_signature_invalid, Reason.TRANSACTION),
    (case_limit_not_first, Reason.COMPUTE_LIMIT),
    (case_limit_too_high, Reason.COMPUTE_LIMIT),
    (case_price_missing, Reason.COMPUTE_PRICE),
    (case_price_too_high, Reason.COMPUTE_PRICE_TOO_HIGH),
    (case_plain_transfer, Reason.NO_TRANSFER),
    (case_transfer_not_token_program, Reason.NO_TRANSFER),
    (case_mint_mismatch, Reason.MINT_MISMATCH),
    (case_recipient_is_payer, Reason.RECIPIENT_MISMATCH),
    (case_recipient_other_token_program, Reason.RECIPIENT_MISMATCH),
    (case_amount_too_low, Reason.AMOUNT_MISMATCH),
    (case_amount_too_high, Reason.AMOUNT_MISMATCH),
    (case_authority_not_the_signer, Reason.TRANSACTION),
    (case_unknown_fourth, Reason.UNKNOWN_FOURTH),
    (case_unknown_fifth, Reason.UNKNOWN_FIFTH),
    (case_memo_missing, Reason.MEMO_COUNT),
    (case_memo_twice, Reason.MEMO_COUNT),
    (case_memo_mismatch, Reason.MEMO_MISMATCH),
]
BROKEN_IDS = [build.__name__.removeprefix("case_") for build, _ in BROKEN]


def ours(chain: UsdcChain) -> list[str]:
    return [str(chain.fee_payer.pubkey())]


# --- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "reason"), BROKEN, ids=BROKEN_IDS)
def test_broken_payment_is_refused_with_its_reason(
    usdc_chain: UsdcChain, build: Callable[[UsdcChain], Case], reason: Reason
) -> None:
    payload, requirements = build(usdc_chain)
    check = check_exact_payment(payload, requirements, ours(usdc_chain))
    assert check.reason is reason, check.message
    assert check.message
    response = check.verify_response()
    assert response.isValid is False
    assert response.invalidReason == reason.value


@pytest.mark.parametrize(("build", "reason"), BROKEN, ids=BROKEN_IDS)
async def test_facilitator_refuses_broken_payment_before_simulating(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    build: Callable[[UsdcChain], Case],
    reason: Reason,
) -> None:
    payload, requirements = build(usdc_chain)
    facilitator = make_local_facilitator(usdc_chain, devnet_rpc_url=solana_rpc_server.url)
    verdict = await facilitator.verify(payload, requirements)
    assert (verdict.isValid, verdict.invalidReason) == (False, reason.value)
    settled = await facilitator.settle(payload, requirements)
    assert (settled.success, settled.errorReason, settled.transaction) == (False, reason.value, "")
    assert solana_rpc_server.calls["simulateTransaction"] == 0
    assert solana_rpc_server.calls["sendTransaction"] == 0


def test_valid_payment_passes_every_rule(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    payload = signed(usdc_chain, req, base_instructions(usdc_chain, req))
    check = check_exact_payment(payload, req, ours(usdc_chain))
    assert check.ok, check.message
    assert check.payer == str(usdc_chain.payer.pubkey())
    assert check.verify_response().isValid is True


def test_valid_payment_with_seller_memo_passes(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain, memo="order-42")
    tx = build_exact_transaction(req, usdc_chain.payer, mint_info(usdc_chain), usdc_chain.blockhash)
    assert check_exact_payment(build_payment_payload(req, tx), req, ours(usdc_chain)).ok


def test_lighthouse_instructions_after_the_transfer_are_allowed(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    lighthouse = [Instruction(LIGHTHOUSE_PROGRAM, bytes([i]), []) for i in range(3)]
    ixs = [*base_instructions(usdc_chain, req), *lighthouse]
    assert len(ixs) == 7
    assert check_exact_payment(signed(usdc_chain, req, ixs), req, ours(usdc_chain)).ok


def test_payment_with_only_three_instructions_is_valid(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    assert check_exact_payment(
        signed(usdc_chain, req, base_instructions(usdc_chain, req)[:3]), req, ours(usdc_chain)
    ).ok


def test_v1_network_name_is_accepted(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    payload = signed(usdc_chain, req, base_instructions(usdc_chain, req))
    v1 = PaymentPayload(x402Version=1, payload=payload.payload, scheme="exact", network="solana")
    assert check_exact_payment(v1, req, ours(usdc_chain)).ok


def test_token_2022_payment_passes(make_usdc_chain: Callable[..., UsdcChain]) -> None:
    chain = make_usdc_chain(token_program=TOKEN_2022_PROGRAM)
    req = exact_requirements(chain)
    tx = build_exact_transaction(req, chain.payer, mint_info(chain), chain.blockhash)
    check = check_exact_payment(build_payment_payload(req, tx), req, ours(chain))
    assert check.ok, check.message


def test_caps_are_configurable(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    payload = signed(usdc_chain, req, base_instructions(usdc_chain, req))  # 20,000 CU at 1 micro-lamport
    strict_limit = check_exact_payment(
        payload, req, ours(usdc_chain), ExactPolicy(max_compute_unit_limit=19_999)
    )
    assert strict_limit.reason is Reason.COMPUTE_LIMIT
    strict_price = check_exact_payment(payload, req, ours(usdc_chain), ExactPolicy(max_compute_unit_price=0))
    assert strict_price.reason is Reason.COMPUTE_PRICE_TOO_HIGH
    generous = ExactPolicy(max_compute_unit_limit=1_400_000)
    bigger = replace_ix(usdc_chain, 0, compute_unit_limit_instruction(1_000_000))
    assert check_exact_payment(*bigger, ours(usdc_chain), generous).ok


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"transaction": None},
        {"transaction": ["a"]},
        {"transaction": ""},
        {"transaction": "A" * 5000},
    ],
)
def test_malformed_payloads_are_invalid_results_not_exceptions(
    usdc_chain: UsdcChain, payload: dict[str, Any]
) -> None:
    req = exact_requirements(usdc_chain)
    check = check_exact_payment(
        PaymentPayload(x402Version=2, payload=payload, accepted=req), req, ours(usdc_chain)
    )
    assert check.reason in (Reason.INVALID_PAYLOAD, Reason.COULD_NOT_BE_DECODED)


@pytest.mark.parametrize("amount", ["0", "-1", "1e3", "²", "18446744073709551616", ""])
def test_unusable_required_amount_is_invalid_requirements(usdc_chain: UsdcChain, amount: str) -> None:
    req = exact_requirements(usdc_chain)
    payload = signed(usdc_chain, req, base_instructions(usdc_chain, req))
    check = check_exact_payment(payload, msgspec.structs.replace(req, amount=amount), ours(usdc_chain))
    assert check.reason is Reason.INVALID_PAYMENT_REQUIREMENTS


# --- helpers: key, fee-payer signature, codec ------------------------------------------------


def test_payment_key_ignores_slot_zero_and_tells_payments_apart(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    tx = build_exact_transaction(
        req, usdc_chain.payer, mint_info(usdc_chain), usdc_chain.blockhash, memo=b"a"
    )
    tampered = VersionedTransaction.populate(tx.message, [Keypair().sign_message(b"x"), tx.signatures[1]])
    other = build_exact_transaction(
        req, usdc_chain.payer, mint_info(usdc_chain), usdc_chain.blockhash, memo=b"b"
    )
    assert (
        payment_key(tx) == payment_key(tampered) == payment_key(sign_as_fee_payer(tx, usdc_chain.fee_payer))
    )
    assert payment_key(tx) != payment_key(other)


def test_fee_payer_signature_completes_the_transaction(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    tx = build_exact_transaction(req, usdc_chain.payer, mint_info(usdc_chain), usdc_chain.blockhash)
    assert tx.verify_with_results() == [False, True]
    full = sign_as_fee_payer(tx, usdc_chain.fee_payer)
    assert full.verify_with_results() == [True, True]
    assert decode_transaction(encode_transaction(full)) == full
    with pytest.raises(ValueError, match="not this wallet"):
        sign_as_fee_payer(tx, Keypair())


def test_builder_needs_a_fee_payer(usdc_chain: UsdcChain) -> None:
    req = msgspec.structs.replace(exact_requirements(usdc_chain), extra=None)
    with pytest.raises(ValueError, match="feePayer"):
        build_exact_transaction(req, usdc_chain.payer, mint_info(usdc_chain), Hash.default())


# --- wallet parsing ---------------------------------------------------------------------------


def test_wallet_parses_base58_secret_key() -> None:
    keypair = Keypair()
    assert parse_wallet(str(keypair)).pubkey() == keypair.pubkey()
    assert parse_wallet(base58.b58encode(bytes(keypair)).decode() + "\n").pubkey() == keypair.pubkey()


def _secret_fragments(raw: bytes) -> list[str]:
    return [
        base58.b58encode(raw).decode(),
        base58.b58encode(raw[:32]).decode(),
        raw[:32].hex(),
        str(list(raw[:8]))[1:-1],
    ]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda raw: str(list(raw)), "JSON array"),
        (lambda raw: base58.b58encode(raw[:32]).decode(), "32 bytes"),
        (lambda raw: base58.b58encode(raw + b"\1").decode(), "65 bytes"),
        (lambda raw: base58.b58encode(raw[:32] + bytes(Keypair().pubkey())).decode(), "does not match"),
        (lambda raw: base58.b58encode(raw).decode()[:-3] + "0OI", "not valid base58"),
    ],
    ids=["json-array", "seed-only", "too-long", "wrong-public-half", "not-base58"],
)
def test_wallet_errors_never_show_the_key(make: Callable[[bytes], str], expected: str) -> None:
    raw = bytes(Keypair())
    value = make(raw)
    with pytest.raises(ValueError, match=expected) as caught:
        parse_wallet(value)
    shown = f"{caught.value}|{caught.value!r}|{caught.value.__cause__!r}|{caught.value.__context__!r}"
    assert caught.value.__cause__ is None
    for fragment in [value, *_secret_fragments(raw)]:
        assert fragment not in shown


def test_wallet_public_key_half_is_checked() -> None:
    raw = bytes(Keypair())
    flipped = raw[:63] + bytes([raw[63] ^ 1])
    with pytest.raises(ValueError, match="does not match"):
        parse_wallet(base58.b58encode(flipped).decode())


def test_decoded_transaction_pubkeys_roundtrip(usdc_chain: UsdcChain) -> None:
    req = exact_requirements(usdc_chain)
    tx = build_exact_transaction(req, usdc_chain.payer, mint_info(usdc_chain), usdc_chain.blockhash)
    keys: list[Pubkey] = list(decode_transaction(encode_transaction(tx)).message.account_keys)
    assert keys[0] == usdc_chain.fee_payer.pubkey()
    assert keys[1] == usdc_chain.payer.pubkey()
