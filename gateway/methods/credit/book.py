"""Prepaid credit: micro-USDC a wallet bought with a top-up, spent by signing in.

Credit is the operator's liability, so every change to it is one atomic store operation:

* **top-up**: the payer's balance grows by the top-up's amount in the same round trip that
  claims the payment's one delivery (:meth:`CreditBook.credits` gives what that round trip
  adds), so a replay, a retry, a reconciled pending settlement or a crash credits exactly once;
  each top-up renews the balance's lifetime (it lapses ``lapse_days`` after the last one);
* **lapse**: each top-up records when the balance lapses, beside it (after registering the
  wallet in the store's lapse index, the sweeper's hint); past that time it spends as nothing,
  and ``gateway.methods.credit.lapse`` takes it out of the books, counted;
* **spend**: a call's credit price is *held* against the balance before the provider is called
  (held amounts never exceed the balance, however many calls race), *taken* only once the
  provider answered, and *released* when it did not; a hold left by a dead process lapses by
  itself shortly after the call's upstream timeout.

Balances live at ``keys.credit_balance(wallet)``, holds at ``keys.credit_holds(wallet)``, lapse
times at ``keys.credit_lapse(wallet)``, credit a top-up found lapsed at ``keys.credit_lapsed(wallet)``
(:func:`credit_account` names them all: one wallet's keys), the lapse index at
``keys.credit_lapses()``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.methods.credit.metrics import CREDIT_SOLD
from gateway.store import (
    Credit,
    CreditAccount,
    CreditHoldOrder,
    CreditState,
    Entry,
    LedgerPosition,
    Store,
    keys,
)
from gateway.store.credit import credit_state, hold_credit, take_credit
from gateway.store.holds import unhold
from gateway.telemetry.logs import log_event

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.methods.credit.calls import CreditCall

HOLD_MARGIN_MS = 30_000
"""How much longer than the upstream timeout a hold lives: nothing renews it, so it must outlast
the call it pays for, and no more (a dead process's hold frees the credit soon after)."""
TAKE_WINDOW_SHARE = 3
"""A take may still land during the first third of the time its store client waits for it (on
the store's clock, counted from its hold's); the other two thirds are for the answer to travel.
Past that a take that waited out a stalled store takes nothing, so the client never gives up on a
take that may still land."""
IN_PROCESS_TAKE_WINDOW_US = 500_000
DAY_MS = 86_400_000
LAPSE_GRACE_MS = 30 * DAY_MS
"""How much longer than the lapse a balance's counter lives in the store: a backstop that deletes
credit no sweeper lapsed (silently, uncounted), so it outlasts any sweeper outage by far."""


def credit_account(wallet: str) -> CreditAccount:
    """The store keys of ``wallet``'s credit."""
    return CreditAccount(
        wallet=wallet,
        balance=keys.credit_balance(wallet),
        holds=keys.credit_holds(wallet),
        lapse=keys.credit_lapse(wallet),
        lapsed=keys.credit_lapsed(wallet),
    )


@dataclass(frozen=True, slots=True)
class CreditHold:
    """A call's price, held against its wallet's balance while the provider answers."""

    wallet: str
    token: str
    amount: int
    store_clock_us: int = 0
    """The store's clock when the hold was made."""
    local_clock_s: float = 0.0
    """This process's monotonic clock when it heard of the hold (at or after the store made it)."""
    call: CreditCall | None = None
    """The call it pays for, when the call has an id: its answer is kept with the take."""
    session: str = ""
    """The store key of the credit session it was spent under (``gateway.methods.credit.sessions``), if any:
    a call that takes nothing gives its amount back to that session's cap too."""


@dataclass(frozen=True, slots=True)
class Balance:
    """A wallet's credit as a client sees it: what it owns, what of that is held by calls in
    flight, and when it lapses (Unix seconds; 0 when it has none)."""

    wallet: str
    balance: int
    held: int
    expires_at: int


class CreditBook:
    """Reads and moves prepaid credit in the shared store; every call may raise ``StoreUnavailable``."""

    def __init__(
        self,
        store: Store,
        *,
        lapse_days: int,
        upstream_timeout_s: float,
        lapse_ms: int | None = None,
        grace_ms: int = LAPSE_GRACE_MS,
    ) -> None:
        self.store = store
        self.lapse_ms = lapse_ms if lapse_ms is not None else lapse_days * DAY_MS
        """``lapse_days`` in ms, unless ``lapse_ms`` says otherwise (tests wait out a lapse)."""
        self.grace_ms = grace_ms
        self.hold_ttl_ms = int(upstream_timeout_s * 1000) + HOLD_MARGIN_MS

    def credits(self, wallet: str, amount: int, ledger_entry: int | None = None) -> list[Credit]:
        """What the delivery of a top-up of ``amount`` by ``wallet`` adds, in the same round trip
        (raising the wallet's ledger mark to ``ledger_entry``, the top-up's journal id), once the
        wallet is registered in the lapse index (a step before, ``claim_then_put``)."""
        position = None if ledger_entry is None else LedgerPosition(keys.ledger_mark(wallet), ledger_entry)
        account = credit_account(wallet)
        return [Credit(account, amount, self.lapse_ms, self.grace_ms, keys.credit_lapses(), position)]

    def order(self, wallet: str, amount: int) -> CreditHoldOrder:
        """A hold of ``amount`` of ``wallet``'s credit under a fresh token, for the store to make
        (alone, :meth:`hold`, or with a sign-in's other checks, ``SignInGate.admit``)."""
        return CreditHoldOrder(credit_account(wallet), amount, secrets.token_hex(8), self.hold_ttl_ms)

    @staticmethod
    def held(order: CreditHoldOrder, state: CreditState, call: CreditCall | None = None) -> CreditHold:
        """The hold ``order`` became, as the store answered it with ``state`` (for ``call``)."""
        return CreditHold(
            order.account.wallet, order.token, order.amount, state.at_us, time.monotonic(), call
        )

    async def hold(self, wallet: str, amount: int) -> CreditHold | None:
        """Hold ``amount`` of ``wallet``'s credit; None when its free credit does not cover it."""
        order = self.order(wallet, amount)
        state = await hold_credit(self.store, order.account, order.amount, order.token, order.ttl_ms)
        return None if state is None else self.held(order, state)

    async def take(self, hold: CreditHold, keep: Sequence[Entry] = ()) -> Balance | None:
        """Take the held amount (the provider answered), writing ``keep`` (the call's answer) in
        the same step; None when nothing could be taken (the hold lapsed and the rest of the
        credit is spent or held, or the credit itself lapsed), and then nothing was kept.

        ``StoreUnavailable`` means nothing was taken, for certain: the take carries a deadline on
        the store's clock (the hold's time plus the time since, plus a share of the store
        client's timeout, :data:`TAKE_WINDOW_SHARE`), so a take queued behind a stalled store
        cannot land once this call gave up on it; the answer is then withheld, and the hold
        lapses by itself. The hold's time was read before this process heard of it, so the
        deadline errs early: a take that is merely slow is refused, never one that is lost."""
        limit = self.store.timeout_s
        window_us = IN_PROCESS_TAKE_WINDOW_US
        if limit is not None:
            window_us = int(limit * 1_000_000) // TAKE_WINDOW_SHARE
        elapsed_us = int((time.monotonic() - hold.local_clock_s) * 1_000_000)
        not_after = hold.store_clock_us + elapsed_us + window_us
        account = credit_account(hold.wallet)
        state = await take_credit(self.store, account, hold.token, hold.amount, not_after, keep)
        return self._balance(hold.wallet, state) if state is not None else None

    async def release(self, hold: CreditHold) -> None:
        """Give the held amount back (the provider failed): nothing is taken."""
        await unhold(self.store, [keys.credit_holds(hold.wallet)], hold.token)

    async def balance(self, wallet: str) -> Balance:
        state = await credit_state(self.store, credit_account(wallet))
        return self._balance(wallet, state)

    def _balance(self, wallet: str, state: CreditState) -> Balance:
        expires = int(time.time() + state.ttl_ms / 1000) if state.balance > 0 and state.ttl_ms > 0 else 0
        return Balance(wallet, state.balance, state.held, expires)


def credit_book(store: Store, settings: Settings) -> CreditBook:
    """The app's credit book, on its store, with its lapse and its upstream timeout."""
    return CreditBook(
        store,
        lapse_days=settings.credit_lapse_days,
        lapse_ms=settings.credit_lapse_ms or None,
        upstream_timeout_s=settings.upstream_timeout_s,
    )


@dataclass(frozen=True, slots=True)
class TopUp:
    """What a top-up route sells: ``amount`` micro-USDC of credit to the payer."""

    book: CreditBook
    amount: int
    route: str

    def credits(self, wallet: str, ledger_entry: int | None = None) -> list[Credit]:
        return self.book.credits(wallet, self.amount, ledger_entry)

    def sold(self, wallet: str, settlement: str) -> None:
        """The credit is booked: one log line and the counter of credit sold."""
        CREDIT_SOLD.inc(self.amount)
        log_event(
            "credit sold", route=self.route, wallet=wallet, amount=str(self.amount), settlement=settlement
        )
