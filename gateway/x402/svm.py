"""The ``exact`` scheme on Solana, facilitator side: pure functions, no I/O.

* :func:`check_exact_payment` applies every structural rule of the x402 exact scheme on
  Solana, under the profile in ``docs/x402-profile.md``, to a v2 payment and answers an
  :class:`ExactCheck` with the SDK reason string. Simulation is the caller's job (it needs
  RPC): see ``gateway.facilitators.local``.
* :func:`parse_wallet` reads ``FACILITATOR_WALLET_BASE58`` with messages that never echo the key.
* :func:`sign_as_fee_payer` fills signature slot 0; :func:`payment_key` is the duplicate-settlement
  key (SHA-256 of the signed message, immune to whatever bytes a client puts in slot 0).

All parsing is solders' and base58's; nothing here decodes a transaction by hand.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
from collections.abc import Collection
from typing import Any

import base58
import msgspec
from solders.keypair import Keypair
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address
from solders.transaction import VersionedTransaction

from gateway.x402.types import (
    SCHEME_EXACT,
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    V1_NETWORKS,
    ExactSvmPayload,
    PaymentPayload,
    PaymentRequirements,
    VerifyResponse,
)

COMPUTE_BUDGET_PROGRAM = Pubkey.from_string("ComputeBudget111111111111111111111111111111")
LAMPORTS_PER_SIGNATURE = 5_000
"""Solana's base fee per signature."""
MICRO_LAMPORTS_PER_LAMPORT = 1_000_000
TOKEN_PROGRAM = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
TOKEN_2022_PROGRAM = Pubkey.from_string("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb")
MEMO_PROGRAM = Pubkey.from_string("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr")
LIGHTHOUSE_PROGRAM = Pubkey.from_string("L2TExMFKdjpN9kozasaurPirfHy9P8sbXoAN1qA3S95")
TOKEN_PROGRAMS = frozenset({TOKEN_PROGRAM, TOKEN_2022_PROGRAM})
TRAILING_PROGRAMS = frozenset({MEMO_PROGRAM, LIGHTHOUSE_PROGRAM})

SET_COMPUTE_UNIT_LIMIT = 2
SET_COMPUTE_UNIT_PRICE = 3
TRANSFER_CHECKED = 12
MIN_INSTRUCTIONS = 3
MAX_INSTRUCTIONS = 7
MAX_TRANSACTION_BYTES = 1232
"""Solana's packet limit: a transaction larger than this can never be sent."""

SUPPORTED_NETWORKS = (SOLANA_MAINNET, SOLANA_DEVNET)

_P = "invalid_exact_svm_payload_"


class Reason(enum.StrEnum):
    """Reason strings of the x402 SDKs (generic reasons and the exact-SVM ones)."""

    INVALID_X402_VERSION = "invalid_x402_version"
    UNSUPPORTED_SCHEME = "unsupported_scheme"
    INVALID_NETWORK = "invalid_network"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_PAYMENT_REQUIREMENTS = "invalid_payment_requirements"
    MISSING_FEE_PAYER = _P + "missing_fee_payer"
    FEE_PAYER_NOT_MANAGED = "fee_payer_not_managed_by_facilitator"
    COULD_NOT_BE_DECODED = _P + "transaction_could_not_be_decoded"
    TRANSACTION = _P + "transaction"
    """Generic SDK reason for a transaction defect without a specific string (lookup tables,
    signers, signatures); ``invalidMessage`` says which."""
    INSTRUCTIONS_LENGTH = _P + "transaction_instructions_length"
    COMPUTE_LIMIT = _P + "transaction_instructions_compute_limit_instruction"
    COMPUTE_PRICE = _P + "transaction_instructions_compute_price_instruction"
    COMPUTE_PRICE_TOO_HIGH = _P + "transaction_instructions_compute_price_instruction_too_high"
    NO_TRANSFER = _P + "no_transfer_instruction"
    MINT_MISMATCH = _P + "mint_mismatch"
    RECIPIENT_MISMATCH = _P + "recipient_mismatch"
    AMOUNT_MISMATCH = _P + "amount_mismatch"
    FEE_PAYER_TRANSFERRING = _P + "transaction_fee_payer_transferring_funds"
    FEE_PAYER_IN_ACCOUNTS = _P + "transaction_fee_payer_included_in_instruction_accounts"
    UNKNOWN_FOURTH = _P + "unknown_fourth_instruction"
    UNKNOWN_FIFTH = _P + "unknown_fifth_instruction"
    UNKNOWN_SIXTH = _P + "unknown_sixth_instruction"
    UNKNOWN_SEVENTH = _P + "unknown_seventh_instruction"
    MEMO_COUNT = _P + "memo_count"
    MEMO_MISMATCH = _P + "memo_mismatch"
    SIMULATION_FAILED = "transaction_simulation_failed"
    DUPLICATE_SETTLEMENT = "duplicate_settlement"
    SETTLEMENT_PENDING = "settlement_pending"
    TRANSACTION_FAILED = "transaction_failed"
    """It landed and failed on chain: the fee payer paid its fee."""
    INSUFFICIENT_FUNDS = "insufficient_funds"
    INVALID_TRANSACTION_STATE = "invalid_transaction_state"
    """The payment cannot be settled now: its payer, token account or client is cooling down
    after a settlement of theirs failed on chain."""
    UNEXPECTED_SETTLE_ERROR = "unexpected_settle_error"


_UNKNOWN_TRAILING = (
    Reason.UNKNOWN_FOURTH,
    Reason.UNKNOWN_FIFTH,
    Reason.UNKNOWN_SIXTH,
    Reason.UNKNOWN_SEVENTH,
)


DEFAULT_MAX_COMPUTE_UNIT_LIMIT = 50_000
"""Room for the reference clients' 20,000 and a wallet's extra assertion instructions."""
DEFAULT_MAX_COMPUTE_UNIT_PRICE = 20_000
"""Micro-lamports per compute unit: at most 1,000 lamports of priority fee at the default limit."""


class ExactPolicy(msgspec.Struct, frozen=True):
    """Caps that bound what one payment can cost the fee payer (operator settings
    ``X402_MAX_COMPUTE_UNIT_LIMIT`` and ``X402_MAX_COMPUTE_UNIT_PRICE``)."""

    max_compute_unit_limit: int = DEFAULT_MAX_COMPUTE_UNIT_LIMIT
    max_compute_unit_price: int = DEFAULT_MAX_COMPUTE_UNIT_PRICE
    """Micro-lamports per compute unit."""


class ExactCheck(msgspec.Struct, frozen=True):
    """Outcome of the structural checks. ``reason`` None means every rule held."""

    reason: Reason | None = None
    message: str | None = None
    payer: str | None = None
    """The TransferChecked authority (the client), once the transfer could be read."""
    transaction: VersionedTransaction | None = None
    """The decoded transaction, once it could be decoded (even when a later rule failed)."""
    fee_lamports: int = 0
    """What landing it costs the fee payer (every rule held): each signature's base fee plus the
    priority fee its compute budget asks for."""

    @property
    def ok(self) -> bool:
        return self.reason is None

    def verify_response(self) -> VerifyResponse:
        if self.reason is None:
            return VerifyResponse(isValid=True, payer=self.payer)
        return self.refused(self.reason, self.message)

    def refused(self, reason: Reason, message: str | None) -> VerifyResponse:
        """The verify answer refusing this payment for ``reason``: a check made after the rules
        (the store, a simulation) refuses it as a rule would, naming the same payer."""
        return VerifyResponse(
            isValid=False, invalidReason=reason.value, invalidMessage=message, payer=self.payer
        )


# --- small helpers ------------------------------------------------------------------------


def normalize_network(network: str | None) -> str | None:
    """CAIP-2 id for a v2 id or a v1 name (``solana``, ``solana-devnet``); None if unknown."""
    if network is None:
        return None
    if network in SUPPORTED_NETWORKS:
        return network
    return V1_NETWORKS.get(network)


def associated_token_address(owner: Pubkey, mint: Pubkey, token_program: Pubkey = TOKEN_PROGRAM) -> Pubkey:
    """The associated token account of ``owner`` for ``mint`` under ``token_program``."""
    return get_associated_token_address(owner, mint, token_program)


def decode_transaction(encoded: str) -> VersionedTransaction:
    """base64 wire bytes -> a sanitized transaction; ValueError with a safe message otherwise."""
    if len(encoded) > 2 * MAX_TRANSACTION_BYTES:
        raise ValueError("transaction is larger than a Solana packet")
    try:
        raw = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("transaction is not valid base64") from None
    if len(raw) > MAX_TRANSACTION_BYTES:
        raise ValueError("transaction is larger than a Solana packet")
    try:
        tx = VersionedTransaction.from_bytes(raw)
        tx.sanitize()
    except Exception:  # solders raises its own error types for every kind of bad input
        raise ValueError("bytes are not a valid Solana transaction") from None
    return tx


def encode_transaction(tx: VersionedTransaction) -> str:
    """Wire bytes, base64 (standard alphabet, padded), as sent to ``sendTransaction``."""
    return base64.b64encode(bytes(tx)).decode("ascii")


def payment_key(tx: VersionedTransaction) -> str:
    """Duplicate-settlement key: hex SHA-256 of the versioned message bytes every signer commits to."""
    return hashlib.sha256(to_bytes_versioned(tx.message)).hexdigest()


def transfer_source(tx: VersionedTransaction) -> str | None:
    """The token account instruction 2 (the TransferChecked) debits, or None when absent."""
    instructions = tx.message.instructions
    if len(instructions) < MIN_INSTRUCTIONS or not bytes(instructions[2].accounts):
        return None
    return str(tx.message.account_keys[bytes(instructions[2].accounts)[0]])


def transaction_signature(tx: VersionedTransaction) -> str:
    """The transaction id: the fee payer's signature (slot 0), base58."""
    return str(tx.signatures[0])


def sign_as_fee_payer(tx: VersionedTransaction, fee_payer: Keypair) -> VersionedTransaction:
    """Put ``fee_payer``'s signature in slot 0, keeping the client's signatures as they are."""
    message = tx.message
    if not message.account_keys or message.account_keys[0] != fee_payer.pubkey():
        raise ValueError("the transaction's fee payer is not this wallet")
    signatures = list(tx.signatures)
    if not signatures:
        raise ValueError("the transaction has no signature slots")
    signatures[0] = fee_payer.sign_message(to_bytes_versioned(message))
    return VersionedTransaction.populate(message, signatures)


def parse_wallet(value: str) -> Keypair:
    """Parse ``FACILITATOR_WALLET_BASE58``: base58 of the raw 64-byte secret key (seed + public key).

    Raises ValueError whose message never contains the key or any part of it.
    """
    text = value.strip()
    name = "FACILITATOR_WALLET_BASE58"
    if not text:
        raise ValueError(f"{name} is empty")
    if text.startswith("["):
        raise ValueError(
            f"{name} looks like a JSON array of numbers; give the base58 encoding of the raw "
            "64-byte secret key instead"
        )
    try:
        raw = base58.b58decode(text)
    except ValueError:
        raise ValueError(f"{name} is not valid base58") from None
    if len(raw) != 64:
        raise ValueError(
            f"{name} decodes to {len(raw)} bytes; expected the 64-byte secret key (32-byte seed "
            "followed by the 32-byte public key)"
        )
    try:
        keypair = Keypair.from_seed(raw[:32])
    except Exception:
        raise ValueError(f"{name} does not hold a valid ed25519 seed") from None
    if bytes(keypair.pubkey()) != raw[32:]:
        raise ValueError(f"{name}: the public half of the key does not match its secret half")
    return keypair


def _pubkey(value: object) -> Pubkey | None:
    if not isinstance(value, str):
        return None
    try:
        return Pubkey.from_string(value)
    except Exception:  # solders' ParsePubkeyError and ValueError
        return None


def _u64(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 8], "little")


# --- the rules ----------------------------------------------------------------------------


def check_exact_payment(
    payload: PaymentPayload,
    requirements: PaymentRequirements,
    fee_payers: Collection[str],
    policy: ExactPolicy | None = None,
) -> ExactCheck:
    """Apply every structural rule of an exact SVM payment; never raises on bad input.

    ``fee_payers`` are the addresses this facilitator signs for. Network support and
    simulation are the caller's (they need configuration and RPC).
    """
    policy = policy or ExactPolicy()

    def fail(
        reason: Reason, message: str, payer: str | None = None, tx: VersionedTransaction | None = None
    ) -> ExactCheck:
        return ExactCheck(reason=reason, message=message, payer=payer, transaction=tx)

    # 1. Versions, scheme, network.
    if payload.x402Version not in (1, 2):
        return fail(Reason.INVALID_X402_VERSION, f"x402Version {payload.x402Version} is not supported")
    accepted = payload.accepted
    scheme = accepted.scheme if accepted is not None else payload.scheme
    network = accepted.network if accepted is not None else payload.network
    if scheme != SCHEME_EXACT or requirements.scheme != SCHEME_EXACT:
        return fail(Reason.UNSUPPORTED_SCHEME, "only the exact scheme is supported")
    required_network = normalize_network(requirements.network)
    if required_network is None:
        return fail(Reason.INVALID_NETWORK, f"network {requirements.network!r} is not a Solana network")
    if normalize_network(network) != required_network:
        return fail(Reason.INVALID_NETWORK, "the payment's network differs from the requirements' network")

    # 2. Requirements must be usable.
    mint = _pubkey(requirements.asset)
    pay_to = _pubkey(requirements.payTo)
    if mint is None or pay_to is None:
        return fail(Reason.INVALID_PAYMENT_REQUIREMENTS, "asset and payTo must be Solana addresses")
    amount_text = requirements.amount
    # At most 20 digits (u64) before int(): longer digit strings can exceed int()'s own limit.
    if (
        not (amount_text.isascii() and amount_text.isdigit())
        or len(amount_text) > 20
        or not 0 < int(amount_text) < 2**64
    ):
        return fail(Reason.INVALID_PAYMENT_REQUIREMENTS, "amount must be a positive integer string (u64)")
    required_amount = int(amount_text)
    extra: dict[str, Any] = requirements.extra or {}

    # 3. The fee payer must be named and be ours.
    fee_payer_str = extra.get("feePayer")
    if not isinstance(fee_payer_str, str) or not fee_payer_str:
        return fail(Reason.MISSING_FEE_PAYER, "extra.feePayer is required")
    if fee_payer_str not in fee_payers:
        return fail(Reason.FEE_PAYER_NOT_MANAGED, "extra.feePayer is not a signer of this facilitator")
    fee_payer = _pubkey(fee_payer_str)
    if fee_payer is None:
        return fail(Reason.MISSING_FEE_PAYER, "extra.feePayer is not a Solana address")

    # 4. Decode: v0, no lookup tables, fee payer first.
    try:
        exact = msgspec.convert(payload.payload, ExactSvmPayload)
    except msgspec.ValidationError as exc:
        return fail(Reason.INVALID_PAYLOAD, f"payload must be {{transaction: base64}}: {exc}")
    try:
        tx = decode_transaction(exact.transaction)
    except ValueError as exc:
        return fail(Reason.COULD_NOT_BE_DECODED, str(exc))
    message = tx.message
    if not isinstance(message, MessageV0):
        return fail(Reason.COULD_NOT_BE_DECODED, "the transaction must be a v0 transaction", tx=tx)
    if message.address_table_lookups:
        return fail(Reason.TRANSACTION, "address lookup tables are not accepted", tx=tx)
    keys = list(message.account_keys)
    if keys[0] != fee_payer:
        return fail(
            Reason.MISSING_FEE_PAYER, "the transaction's fee payer (account 0) is not extra.feePayer", tx=tx
        )

    # 5. Instruction count, then fee-payer isolation in every instruction.
    instructions = list(message.instructions)
    if not MIN_INSTRUCTIONS <= len(instructions) <= MAX_INSTRUCTIONS:
        return fail(
            Reason.INSTRUCTIONS_LENGTH,
            f"{len(instructions)} instructions; expected {MIN_INSTRUCTIONS} to {MAX_INSTRUCTIONS}",
            tx=tx,
        )
    for index, ix in enumerate(instructions):
        accounts = bytes(ix.accounts)
        if ix.program_id_index == 0:
            return fail(
                Reason.FEE_PAYER_IN_ACCOUNTS, f"instruction {index} is a call to the fee payer", tx=tx
            )
        if 0 in accounts:
            if index == 2 and 0 in accounts[0:1] + accounts[3:4]:
                return fail(
                    Reason.FEE_PAYER_TRANSFERRING,
                    "the fee payer would be the transfer's source or authority",
                    tx=tx,
                )
            return fail(
                Reason.FEE_PAYER_IN_ACCOUNTS, f"the fee payer is an account of instruction {index}", tx=tx
            )

    # 6. Signers: exactly the fee payer and the client; the client's signature is valid.
    header = message.header
    if header.num_required_signatures != 2 or len(tx.signatures) != 2:
        return fail(Reason.TRANSACTION, "exactly two signers are allowed: the fee payer and the payer", tx=tx)
    if not tx.verify_with_results()[1]:
        return fail(Reason.TRANSACTION, "the payer's signature is missing or invalid", tx=tx)

    # 7. Compute budget: limit then price, both under the caps.
    limit_ix, price_ix, transfer_ix = instructions[0], instructions[1], instructions[2]
    limit_data = bytes(limit_ix.data)
    if (
        keys[limit_ix.program_id_index] != COMPUTE_BUDGET_PROGRAM
        or len(limit_data) != 5
        or limit_data[0] != SET_COMPUTE_UNIT_LIMIT
    ):
        return fail(Reason.COMPUTE_LIMIT, "instruction 0 must be SetComputeUnitLimit", tx=tx)
    units = int.from_bytes(limit_data[1:5], "little")
    if units > policy.max_compute_unit_limit:
        return fail(
            Reason.COMPUTE_LIMIT,
            f"compute unit limit {units} is above {policy.max_compute_unit_limit}",
            tx=tx,
        )
    price_data = bytes(price_ix.data)
    if (
        keys[price_ix.program_id_index] != COMPUTE_BUDGET_PROGRAM
        or len(price_data) != 9
        or price_data[0] != SET_COMPUTE_UNIT_PRICE
    ):
        return fail(Reason.COMPUTE_PRICE, "instruction 1 must be SetComputeUnitPrice", tx=tx)
    price = _u64(price_data, 1)
    if price > policy.max_compute_unit_price:
        return fail(
            Reason.COMPUTE_PRICE_TOO_HIGH,
            f"compute unit price {price} is above {policy.max_compute_unit_price} micro-lamports",
            tx=tx,
        )

    # 8. The transfer: TransferChecked of exactly the amount, of the asset, to payTo's ATA.
    token_program = keys[transfer_ix.program_id_index]
    transfer_data = bytes(transfer_ix.data)
    transfer_accounts = bytes(transfer_ix.accounts)
    if (
        token_program not in TOKEN_PROGRAMS
        or len(transfer_data) != 10
        or transfer_data[0] != TRANSFER_CHECKED
        or len(transfer_accounts) != 4
    ):
        return fail(Reason.NO_TRANSFER, "instruction 2 must be a Token or Token-2022 TransferChecked", tx=tx)
    authority = keys[transfer_accounts[3]]
    payer = str(authority)
    if keys[transfer_accounts[1]] != mint:
        return fail(Reason.MINT_MISMATCH, "the transfer's mint is not the required asset", payer, tx)
    expected_destination = associated_token_address(pay_to, mint, token_program)
    if keys[transfer_accounts[2]] != expected_destination:
        return fail(
            Reason.RECIPIENT_MISMATCH,
            "the destination is not payTo's associated token account for this asset",
            payer,
            tx,
        )
    amount = _u64(transfer_data, 1)
    if amount != required_amount:
        return fail(
            Reason.AMOUNT_MISMATCH, f"transfer of {amount}, required exactly {required_amount}", payer, tx
        )
    if authority != keys[1]:
        return fail(
            Reason.TRANSACTION, "the transfer authority must be the transaction's payer signer", payer, tx
        )

    # 9. After the transfer only Memo or Lighthouse; extra.memo means exactly one equal memo.
    memos: list[bytes] = []
    for offset, ix in enumerate(instructions[3:]):
        program = keys[ix.program_id_index]
        if program not in TRAILING_PROGRAMS:
            return fail(
                _UNKNOWN_TRAILING[offset],
                f"instruction {offset + 3} may only be Memo or Lighthouse",
                payer,
                tx,
            )
        if program == MEMO_PROGRAM:
            memos.append(bytes(ix.data))
    expected_memo = extra.get("memo")
    if isinstance(expected_memo, str) and expected_memo:
        if len(memos) != 1:
            return fail(
                Reason.MEMO_COUNT,
                f"{len(memos)} memo instructions; extra.memo requires exactly one",
                payer,
                tx,
            )
        if memos[0] != expected_memo.encode("utf-8"):
            return fail(Reason.MEMO_MISMATCH, "the memo differs from extra.memo", payer, tx)

    signatures = tx.message.header.num_required_signatures
    fee = LAMPORTS_PER_SIGNATURE * signatures + priority_fee_lamports(units, price)
    return ExactCheck(payer=payer, transaction=tx, fee_lamports=fee)


def priority_fee_lamports(compute_unit_limit: int, compute_unit_price_micro_lamports: int) -> int:
    """The priority fee Solana charges for a transaction with this compute budget."""
    return -(-compute_unit_limit * compute_unit_price_micro_lamports // MICRO_LAMPORTS_PER_LAMPORT)


def payment_client(tx: VersionedTransaction) -> tuple[str, str] | None:
    """(client address, client signature) of a partially signed payment, read before verifying.

    The client is the second required signer (slot 1); verification insists that it is the
    transfer authority, so the gateway can refuse a self-transfer before it spends a facilitator
    call. Replay protection is keyed on the message, never on this signature, which an ed25519
    signer can vary at will. None when there is no such signer.
    """
    keys = tx.message.account_keys
    if len(keys) < 2 or len(tx.signatures) < 2 or tx.message.header.num_required_signatures < 2:
        return None
    return str(keys[1]), str(tx.signatures[1])
