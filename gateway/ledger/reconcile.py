"""The journal reconciled with the chain: every USDC transfer into payTo against the sales and
top-ups journaled under its signature.

Three kinds of difference: a transfer the journal has no entry for (money received that the
gateway never recorded: a payment made around it, or an entry lost), an entry whose transfer is
not on chain or failed there (money recorded that never arrived), and an entry whose amount or
payer is not what its transfer moved. ``since`` only bounds what is looked at: a transfer is
matched with its entry whenever either was recorded, so nothing at the edge of the window is
called missing.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator

import msgspec
from solders.pubkey import Pubkey

from gateway.ledger.entries import EntryKind
from gateway.ledger.journal import Journal, Recorded
from gateway.ledger.onchain import ChainPayment, payment, payments_into
from gateway.outbound.solana_rpc import MAX_SIGNATURES_PAGE, SolanaRpc

SETTLED = (EntryKind.SALE, EntryKind.TOP_UP)
LOOKUP_BATCH = 500
"""Signatures looked up in the journal per query."""


class Difference(enum.StrEnum):
    UNJOURNALED = "transfer_without_entry"
    MISSING = "entry_without_transfer"
    FAILED = "entry_whose_transfer_failed"
    AMOUNT = "amount_differs"
    PAYER = "payer_differs"


class Finding(msgspec.Struct, frozen=True, omit_defaults=True):
    """One difference between the chain and the journal, about one signature."""

    difference: Difference
    signature: str
    chainAmountMicroUsdc: int | None = None
    chainPayers: list[str] | None = None
    slot: int | None = None
    entryRef: str | None = None
    entryKind: str | None = None
    journalAmountMicroUsdc: int | None = None
    journalWallet: str | None = None
    occurredAtMs: int | None = None


class Reconciliation(msgspec.Struct):
    payTo: str
    tokenAccount: str
    sinceMs: int | None
    transfers: int
    """Transfers into the token account seen on chain."""
    entries: int
    """Sales and top-ups of the journal looked at."""
    matched: int
    findings: list[Finding]

    @property
    def clean(self) -> bool:
        return not self.findings


def _entry_finding(difference: Difference, entry: Recorded) -> Finding:
    return Finding(
        difference,
        signature=entry.signature or "",
        entryRef=entry.ref,
        entryKind=entry.kind.value,
        journalAmountMicroUsdc=entry.amount_micro,
        journalWallet=entry.wallet,
        occurredAtMs=entry.occurred_at_ms,
    )


def _compare(paid: ChainPayment, entry: Recorded) -> list[Finding]:
    """What differs between a transaction and the entry journaled under its signature."""
    if paid.failed:
        return [msgspec.structs.replace(_entry_finding(Difference.FAILED, entry), slot=paid.slot)]
    if not paid.amount_micro:  # landed, but paid nothing into payTo
        return [msgspec.structs.replace(_entry_finding(Difference.MISSING, entry), slot=paid.slot)]
    seen = msgspec.structs.replace(
        _entry_finding(Difference.AMOUNT, entry),
        slot=paid.slot,
        chainAmountMicroUsdc=paid.amount_micro,
        chainPayers=list(paid.payers),
    )
    found: list[Finding] = []
    if paid.amount_micro != entry.amount_micro:
        found.append(seen)
    if paid.amount_micro and paid.payers != (entry.wallet,):
        found.append(msgspec.structs.replace(seen, difference=Difference.PAYER))
    return found


async def reconcile(
    journal: Journal,
    rpc: SolanaRpc,
    *,
    pay_to: Pubkey,
    token_account: Pubkey,
    since_ms: int | None = None,
    page: int = MAX_SIGNATURES_PAGE,
) -> Reconciliation:
    """Match the chain's transfers into ``token_account`` since ``since_ms`` with the journal.

    The journal's settlements of the window are held by signature while the chain's history is
    read (what must be matched); the chain's side is streamed.
    """
    pending = {
        entry.signature: entry
        async for entry in journal.entries(since_ms or 0, kinds=SETTLED)
        if entry.signature is not None
    }
    result = Reconciliation(
        payTo=str(pay_to),
        tokenAccount=str(token_account),
        sinceMs=since_ms,
        transfers=0,
        entries=len(pending),
        matched=0,
        findings=[],
    )
    since_s = since_ms // 1000 if since_ms is not None else None
    unmatched: list[ChainPayment] = []
    async for paid in payments_into(rpc, token_account, since_s=since_s, page=page):
        if not paid.failed and paid.amount_micro:
            result.transfers += 1
        entry = pending.pop(paid.signature, None)
        if entry is not None:
            _record(result, paid, entry)
        elif not paid.failed and paid.amount_micro:
            unmatched.append(paid)  # journaled before the window, perhaps: looked up below
    async for paid, entry in _journaled(journal, unmatched):
        if entry is None:
            result.findings.append(
                Finding(
                    Difference.UNJOURNALED,
                    signature=paid.signature,
                    chainAmountMicroUsdc=paid.amount_micro,
                    chainPayers=list(paid.payers),
                    slot=paid.slot,
                )
            )
        else:
            result.entries += 1
            _record(result, paid, entry)
    for entry in pending.values():  # not in the history read: landed before the window, or never
        landed = await payment(rpc, entry.signature or "", token_account)
        if landed is None:
            result.findings.append(_entry_finding(Difference.MISSING, entry))
            continue
        result.transfers += not landed.failed and landed.amount_micro > 0
        _record(result, landed, entry)
    return result


def _record(result: Reconciliation, paid: ChainPayment, entry: Recorded) -> None:
    found = _compare(paid, entry)
    result.findings.extend(found)
    result.matched += not found


async def _journaled(
    journal: Journal, payments: list[ChainPayment]
) -> AsyncIterator[tuple[ChainPayment, Recorded | None]]:
    for start in range(0, len(payments), LOOKUP_BATCH):
        batch = payments[start : start + LOOKUP_BATCH]
        known = await journal.settled([p.signature for p in batch])
        for paid in batch:
            yield paid, known.get(paid.signature)
