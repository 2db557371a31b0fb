"""What the ledger records: one balanced entry per movement of money, in micro-USDC.

Double entry: every entry's postings add up to zero (debits positive, credits negative), so the
books always balance and any account's balance is the sum of its postings. The accounts:

* ``asset:usdc-received``: USDC settled into the operator's payTo wallet (debited by a sale and
  by a top-up);
* ``income:sales``: what calls earned, paid per call or from credit;
* ``income:lapsed-credit``: credit that lapsed unspent;
* ``liability:credit:{wallet}``: prepaid credit owed to that wallet (credited by its top-ups,
  debited as it is spent or lapses). What the operator owes a wallet is minus this balance.

An entry's ``ref`` names the movement it records (a settlement, a credit hold taken, a lapse)
and is unique in the journal: recording the same movement twice (a retry, a replica racing
another, a batch sent again after a lost answer) records it once.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

USDC_RECEIVED = "asset:usdc-received"
SALES = "income:sales"
LAPSED = "income:lapsed-credit"
CREDIT_PREFIX = "liability:credit:"


def credit_account(wallet: str) -> str:
    """The account of the prepaid credit owed to ``wallet``."""
    return CREDIT_PREFIX + wallet


class EntryKind(StrEnum):
    SALE = "sale"
    """A call paid per call (an exact payment) settled."""
    TOP_UP = "top_up"
    """A top-up settled: the payer's credit grows by what it paid."""
    CREDIT_SPENT = "credit_spent"
    """A call's held credit was taken once its provider answered."""
    CREDIT_LAPSED = "credit_lapsed"
    """A wallet's credit lapsed unspent."""
    CREDIT_RELEASED = "credit_released"
    """A call's held credit was given back (its provider failed): a memo with no postings, since
    a hold and its release move no money; what the call took is its ``credit_spent``."""


class Posting(msgspec.Struct, frozen=True):
    account: str
    amount_micro: int
    """Debit positive, credit negative."""


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One movement of money, as the journal keeps it."""

    ref: str
    kind: EntryKind
    occurred_at_ms: int
    """When it happened (Unix ms): the settlement, the take, the lapse."""
    amount_micro: int
    wallet: str
    """The payer, or the wallet whose credit moved."""
    postings: tuple[Posting, ...]
    route: str | None = None
    facilitator: str | None = None
    signature: str | None = None
    """The settlement's Solana transaction signature (sales and top-ups)."""
    payment_key: str | None = None
    """The payment's key (the SHA-256 of its transaction message, as the store claims it): what
    a store restored from the ledger marks used, so a top-up is never booked twice."""

    def __post_init__(self) -> None:
        if self.amount_micro < 0:
            raise ValueError(f"ledger entry {self.ref}: negative amount")
        if sum(p.amount_micro for p in self.postings) != 0:
            raise ValueError(f"ledger entry {self.ref}: postings do not balance")


class SettledPayment(msgspec.Struct, frozen=True, kw_only=True):
    """A payment a facilitator settled: what a sale's or a top-up's entry records."""

    route: str
    payer: str
    amount_micro: int
    signature: str
    """The settlement's Solana transaction signature."""
    facilitator: str
    at_ms: int
    payment_key: str | None = None


def sale(payment: SettledPayment) -> Entry:
    """A settled per-call payment: USDC received, earned by the route."""
    return _settled(payment, EntryKind.SALE, SALES)


def top_up(payment: SettledPayment) -> Entry:
    """A settled top-up: USDC received, owed back to the payer as credit."""
    return _settled(payment, EntryKind.TOP_UP, credit_account(payment.payer))


def _settled(payment: SettledPayment, kind: EntryKind, credited: str) -> Entry:
    """USDC received for ``payment``, credited to ``credited`` (what it earned or is owed)."""
    amount = payment.amount_micro
    return Entry(
        ref=f"settlement:{payment.signature}",
        kind=kind,
        occurred_at_ms=payment.at_ms,
        amount_micro=amount,
        wallet=payment.payer,
        route=payment.route,
        facilitator=payment.facilitator,
        signature=payment.signature,
        payment_key=payment.payment_key,
        postings=(Posting(USDC_RECEIVED, amount), Posting(credited, -amount)),
    )


def credit_spent(*, ref: str, route: str, wallet: str, amount_micro: int, at_ms: int) -> Entry:
    """A call's credit taken (``ref`` names the hold): no longer owed, earned by the route."""
    return Entry(
        ref=f"credit-take:{ref}",
        kind=EntryKind.CREDIT_SPENT,
        occurred_at_ms=at_ms,
        amount_micro=amount_micro,
        wallet=wallet,
        route=route,
        postings=(Posting(credit_account(wallet), amount_micro), Posting(SALES, -amount_micro)),
    )


def credit_lapsed(*, ref: str, wallet: str, amount_micro: int, at_ms: int) -> Entry:
    """A wallet's credit lapsed unspent (``ref`` names the lapse): no longer owed."""
    return Entry(
        ref=f"credit-lapse:{ref}",
        kind=EntryKind.CREDIT_LAPSED,
        occurred_at_ms=at_ms,
        amount_micro=amount_micro,
        wallet=wallet,
        postings=(Posting(credit_account(wallet), amount_micro), Posting(LAPSED, -amount_micro)),
    )


def credit_released(*, ref: str, route: str, wallet: str, amount_micro: int, at_ms: int) -> Entry:
    """A call's hold released (``ref`` names the hold): recorded, nothing owed changes."""
    return Entry(
        ref=f"credit-release:{ref}",
        kind=EntryKind.CREDIT_RELEASED,
        occurred_at_ms=at_ms,
        amount_micro=amount_micro,
        wallet=wallet,
        route=route,
        postings=(),
    )
