"""The ``exact`` scheme on Solana, client side: build and partially sign a payment.

One builder for the tests, ``x402-gateway pay`` and the sandbox. The layout is the reference
client's: SetComputeUnitLimit, SetComputeUnitPrice, TransferChecked, Memo. The fee payer
(``extra.feePayer``) is account 0 and its signature slot is left empty for the facilitator.

Everything but :func:`fetch_mint_info`, :func:`fetch_token_balance`, :func:`fetch_blockhash` and
:func:`create_exact_payment` is pure; the instruction helpers are public so tests can assemble
deliberately broken payments.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.null_signer import NullSigner
from solders.pubkey import Pubkey
from solders.token.state import TokenAccount
from solders.transaction import VersionedTransaction

from gateway.outbound.solana_rpc import SolanaRpc
from gateway.x402.svm import (
    COMPUTE_BUDGET_PROGRAM,
    MEMO_PROGRAM,
    SET_COMPUTE_UNIT_LIMIT,
    SET_COMPUTE_UNIT_PRICE,
    TOKEN_2022_PROGRAM,
    TOKEN_PROGRAM,
    TRANSFER_CHECKED,
    associated_token_address,
    encode_transaction,
)
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo

DEFAULT_COMPUTE_UNIT_LIMIT = 20_000
"""The reference client's limit; the hosted CDP facilitator is reported to refuse about 100k."""
DEFAULT_COMPUTE_UNIT_PRICE = 1
MAX_MEMO_BYTES = 256
U64_MAX = 2**64 - 1
"""The largest amount a TransferChecked instruction carries."""
MINT_SIZE = 82
TOKEN_ACCOUNT_SIZE = 165
_DECIMALS_OFFSET = 44


class MintInfo(msgspec.Struct, frozen=True):
    """What a payer must know about the asset: its decimals and owning token program."""

    address: str
    decimals: int
    token_program: str = str(TOKEN_PROGRAM)


# --- instructions ---------------------------------------------------------------------------


def compute_unit_limit_instruction(units: int) -> Instruction:
    return Instruction(
        COMPUTE_BUDGET_PROGRAM, bytes([SET_COMPUTE_UNIT_LIMIT]) + units.to_bytes(4, "little"), []
    )


def compute_unit_price_instruction(micro_lamports: int) -> Instruction:
    return Instruction(
        COMPUTE_BUDGET_PROGRAM, bytes([SET_COMPUTE_UNIT_PRICE]) + micro_lamports.to_bytes(8, "little"), []
    )


def transfer_checked_instruction(
    *,
    source: Pubkey,
    mint: Pubkey,
    destination: Pubkey,
    authority: Pubkey,
    amount: int,
    decimals: int,
    token_program: Pubkey = TOKEN_PROGRAM,
) -> Instruction:
    """SPL Token / Token-2022 TransferChecked: ``[12, u64 amount LE, u8 decimals]``."""
    data = bytes([TRANSFER_CHECKED]) + amount.to_bytes(8, "little") + bytes([decimals])
    accounts = [
        AccountMeta(source, is_signer=False, is_writable=True),
        AccountMeta(mint, is_signer=False, is_writable=False),
        AccountMeta(destination, is_signer=False, is_writable=True),
        AccountMeta(authority, is_signer=True, is_writable=False),
    ]
    return Instruction(token_program, data, accounts)


def memo_instruction(data: bytes, signers: Sequence[Pubkey] = ()) -> Instruction:
    return Instruction(
        MEMO_PROGRAM, data, [AccountMeta(s, is_signer=True, is_writable=False) for s in signers]
    )


def random_memo() -> bytes:
    """The reference clients' nonce memo: 16 random bytes, hex-encoded (keeps payments unique)."""
    return os.urandom(16).hex().encode("ascii")


def memo_for(requirements: PaymentRequirements) -> bytes:
    """``extra.memo`` (UTF-8) when the seller set one, else a random nonce."""
    memo = (requirements.extra or {}).get("memo")
    if isinstance(memo, str) and memo:
        data = memo.encode("utf-8")
        if len(data) > MAX_MEMO_BYTES:
            raise ValueError(f"extra.memo is longer than {MAX_MEMO_BYTES} bytes")
        return data
    return random_memo()


# --- transactions ---------------------------------------------------------------------------


def fee_payer_of(requirements: PaymentRequirements) -> Pubkey:
    """``extra.feePayer`` as a key; ValueError when absent or malformed."""
    value = (requirements.extra or {}).get("feePayer")
    if not isinstance(value, str) or not value:
        raise ValueError("requirements.extra.feePayer is required for Solana payments")
    try:
        return Pubkey.from_string(value)
    except Exception:
        raise ValueError("requirements.extra.feePayer is not a Solana address") from None


def exact_instructions(
    requirements: PaymentRequirements,
    payer: Pubkey,
    mint: MintInfo,
    *,
    memo: bytes | None = None,
    compute_unit_limit: int = DEFAULT_COMPUTE_UNIT_LIMIT,
    compute_unit_price: int = DEFAULT_COMPUTE_UNIT_PRICE,
    source: Pubkey | None = None,
) -> list[Instruction]:
    """The four instructions of an exact payment of ``requirements`` by ``payer``, from
    ``source`` (a token account of the payer's; default: its associated one)."""
    mint_key = Pubkey.from_string(mint.address)
    program = Pubkey.from_string(mint.token_program)
    if program not in (TOKEN_PROGRAM, TOKEN_2022_PROGRAM):
        raise ValueError("the mint is not owned by the Token or Token-2022 program")
    if mint.address != requirements.asset:
        raise ValueError("mint info is for another asset than requirements.asset")
    amount = int(requirements.amount)
    if not 0 <= amount <= U64_MAX:
        raise ValueError("requirements.amount does not fit a u64")
    pay_to = Pubkey.from_string(requirements.payTo)
    transfer = transfer_checked_instruction(
        source=source or associated_token_address(payer, mint_key, program),
        mint=mint_key,
        destination=associated_token_address(pay_to, mint_key, program),
        authority=payer,
        amount=amount,
        decimals=mint.decimals,
        token_program=program,
    )
    return [
        compute_unit_limit_instruction(compute_unit_limit),
        compute_unit_price_instruction(compute_unit_price),
        transfer,
        memo_instruction(memo if memo is not None else memo_for(requirements)),
    ]


def partially_signed_transaction(
    instructions: Sequence[Instruction],
    *,
    fee_payer: Pubkey,
    signers: Sequence[Keypair],
    blockhash: Hash | str,
) -> VersionedTransaction:
    """A v0 transaction with ``fee_payer`` as account 0, its slot empty, signed by ``signers``."""
    recent = blockhash if isinstance(blockhash, Hash) else Hash.from_string(blockhash)
    message = MessageV0.try_compile(fee_payer, list(instructions), [], recent)
    return VersionedTransaction(message, [NullSigner(fee_payer), *signers])


def build_exact_transaction(
    requirements: PaymentRequirements,
    payer: Keypair,
    mint: MintInfo,
    blockhash: Hash | str,
    *,
    memo: bytes | None = None,
    compute_unit_limit: int = DEFAULT_COMPUTE_UNIT_LIMIT,
    compute_unit_price: int = DEFAULT_COMPUTE_UNIT_PRICE,
    source: Pubkey | None = None,
) -> VersionedTransaction:
    """The partially signed payment transaction for ``requirements`` (fee payer slot empty)."""
    instructions = exact_instructions(
        requirements,
        payer.pubkey(),
        mint,
        memo=memo,
        compute_unit_limit=compute_unit_limit,
        compute_unit_price=compute_unit_price,
        source=source,
    )
    return partially_signed_transaction(
        instructions, fee_payer=fee_payer_of(requirements), signers=[payer], blockhash=blockhash
    )


def build_payment_payload(
    requirements: PaymentRequirements,
    transaction: VersionedTransaction,
    *,
    resource: ResourceInfo | None = None,
    extensions: dict[str, Any] | None = None,
) -> PaymentPayload:
    """The v2 PaymentPayload carrying ``transaction`` for ``requirements``."""
    return PaymentPayload(
        x402Version=2,
        payload={"transaction": encode_transaction(transaction)},
        accepted=requirements,
        resource=resource,
        extensions=extensions,
    )


# --- RPC look-ups ---------------------------------------------------------------------------


async def fetch_mint_info(rpc: SolanaRpc, mint: str) -> MintInfo:
    """Read the mint's decimals and token program; ValueError when it is not an SPL mint."""
    account = await rpc.get_account_info(mint)
    if account is None:
        raise ValueError("the asset's mint account does not exist")
    if account.owner not in (str(TOKEN_PROGRAM), str(TOKEN_2022_PROGRAM)):
        raise ValueError("the asset is not owned by the Token or Token-2022 program")
    if len(account.data) < MINT_SIZE:
        raise ValueError("the asset's account is not a mint")
    return MintInfo(address=mint, decimals=account.data[_DECIMALS_OFFSET], token_program=account.owner)


async def fetch_token_balance(rpc: SolanaRpc, owner: Pubkey, mint: MintInfo) -> int:
    """What ``owner`` holds of ``mint`` in its associated token account (0 when it has none),
    the account a payment spends from."""
    address = associated_token_address(
        owner, Pubkey.from_string(mint.address), Pubkey.from_string(mint.token_program)
    )
    account = await rpc.get_account_info(str(address))
    if account is None or account.owner != mint.token_program or len(account.data) < TOKEN_ACCOUNT_SIZE:
        return 0
    return int(TokenAccount.from_bytes(bytes(account.data[:TOKEN_ACCOUNT_SIZE])).amount)


async def fetch_blockhash(rpc: SolanaRpc, requirements: PaymentRequirements) -> Hash:
    """``extra.recentBlockhash`` when it is a valid hash, else the node's latest blockhash."""
    given = (requirements.extra or {}).get("recentBlockhash")
    if isinstance(given, str) and given:
        try:
            return Hash.from_string(given)
        except Exception:
            pass
    latest = await rpc.get_latest_blockhash()
    return Hash.from_string(latest.blockhash)


async def create_exact_payment(
    rpc: SolanaRpc,
    requirements: PaymentRequirements,
    payer: Keypair,
    *,
    resource: ResourceInfo | None = None,
    extensions: dict[str, Any] | None = None,
    mint: MintInfo | None = None,
    memo: bytes | None = None,
    compute_unit_limit: int = DEFAULT_COMPUTE_UNIT_LIMIT,
    compute_unit_price: int = DEFAULT_COMPUTE_UNIT_PRICE,
) -> PaymentPayload:
    """Look up the mint (unless given) and a blockhash over RPC, then build and sign the v2
    payment payload."""
    mint = mint or await fetch_mint_info(rpc, requirements.asset)
    blockhash = await fetch_blockhash(rpc, requirements)
    tx = build_exact_transaction(
        requirements,
        payer,
        mint,
        blockhash,
        memo=memo,
        compute_unit_limit=compute_unit_limit,
        compute_unit_price=compute_unit_price,
    )
    return build_payment_payload(requirements, tx, resource=resource, extensions=extensions)
