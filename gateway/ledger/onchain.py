"""What the chain says was paid into payTo: the USDC transfers into its token account.

The account's history comes from the node (``getSignaturesForAddress``, a page at a time, newest
first) and each transaction from ``getTransaction`` (base64, decoded by solders). A transfer is
a top-level SPL Token or Token-2022 ``TransferChecked`` or ``Transfer`` whose destination is the
token account: its amount and its authority (the payer, as the exact scheme requires the client
to sign the transfer) are what the journal is compared with. A transaction that failed on chain
moved nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import msgspec
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction
from solders.transaction_status import EncodedConfirmedTransactionWithStatusMeta, UiTransactionStatusMeta

from gateway.outbound.solana_rpc import MAX_SIGNATURES_PAGE, SolanaRpc
from gateway.x402.svm import TOKEN_PROGRAMS, TRANSFER_CHECKED

TRANSFER = 3
"""SPL Token ``Transfer``: ``[3, u64 amount LE]``, accounts source, destination, authority."""
LOOKUPS_AT_ONCE = 16
"""``getTransaction`` calls in flight at once while a page of history is read."""


class ChainPayment(msgspec.Struct, frozen=True):
    """One landed transaction touching payTo's token account, as the chain tells it."""

    signature: str
    slot: int
    block_time: int | None
    amount_micro: int
    """The sum of its transfers into the token account (0: none, or it failed)."""
    payers: tuple[str, ...]
    """The authorities of those transfers, in instruction order, each once."""
    failed: bool


def _u64(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 8], "little")


def _account_keys(tx: VersionedTransaction, meta: UiTransactionStatusMeta | None) -> list[Pubkey]:
    """The static keys, then (v0) the addresses loaded from lookup tables, writable first."""
    keys = list(tx.message.account_keys)
    loaded = meta.loaded_addresses if meta is not None else None
    if loaded is not None:
        keys += [*loaded.writable, *loaded.readonly]
    return keys


def transfers_into(
    tx: VersionedTransaction, token_account: Pubkey, meta: UiTransactionStatusMeta | None = None
) -> list[tuple[str, int]]:
    """(authority, amount) of every top-level token transfer into ``token_account``."""
    keys = _account_keys(tx, meta)
    found: list[tuple[str, int]] = []
    for ix in tx.message.instructions:
        accounts = bytes(ix.accounts)
        data = bytes(ix.data)
        if ix.program_id_index >= len(keys) or keys[ix.program_id_index] not in TOKEN_PROGRAMS:
            continue
        if data[:1] == bytes([TRANSFER_CHECKED]) and len(data) == 10 and len(accounts) >= 4:
            destination, authority = accounts[2], accounts[3]
        elif data[:1] == bytes([TRANSFER]) and len(data) == 9 and len(accounts) >= 3:
            destination, authority = accounts[1], accounts[2]
        else:
            continue
        if max(destination, authority) < len(keys) and keys[destination] == token_account:
            found.append((str(keys[authority]), _u64(data, 1)))
    return found


def payment_of(
    signature: str, landed: EncodedConfirmedTransactionWithStatusMeta, token_account: Pubkey
) -> ChainPayment:
    """What the landed transaction paid into ``token_account``."""
    carried = landed.transaction
    meta = carried.meta
    failed = meta is not None and meta.err is not None
    tx = carried.transaction
    transfers = (
        [] if failed or not isinstance(tx, VersionedTransaction) else transfers_into(tx, token_account, meta)
    )
    return ChainPayment(
        signature=signature,
        slot=landed.slot,
        block_time=landed.block_time,
        amount_micro=sum(amount for _, amount in transfers),
        payers=tuple(dict.fromkeys(payer for payer, _ in transfers)),
        failed=failed,
    )


async def payment(rpc: SolanaRpc, signature: str, token_account: Pubkey) -> ChainPayment | None:
    """The transaction ``signature`` as a payment into ``token_account``; None when not on chain."""
    landed = await rpc.get_transaction(signature)
    return None if landed is None else payment_of(signature, landed, token_account)


async def payments_into(
    rpc: SolanaRpc, token_account: Pubkey, *, since_s: int | None = None, page: int = MAX_SIGNATURES_PAGE
) -> AsyncIterator[ChainPayment]:
    """Every transaction that touched ``token_account``, newest first, back to ``since_s`` (Unix
    seconds; a node that reports no block time lists the whole history)."""
    before: str | None = None
    while True:
        listed = await rpc.get_signatures_for_address(str(token_account), before=before, limit=page)
        recent = [s for s in listed if since_s is None or s.blockTime is None or s.blockTime >= since_s]
        for chunk in _chunks([s.signature for s in recent], LOOKUPS_AT_ONCE):
            found = await asyncio.gather(*(payment(rpc, signature, token_account) for signature in chunk))
            for paid in found:
                if paid is not None:  # listed but not served back (pruned): looked up again by entry
                    yield paid
        if len(listed) < page or len(recent) < len(listed) or listed[-1].signature == before:
            return  # the end, the window's start, or a node that ignored ``before``
        before = listed[-1].signature


def _chunks(items: Sequence[str], size: int) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
