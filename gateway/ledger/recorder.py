"""Where the gateway tells the ledger that money moved: one call per kind of movement.

A top-up is written before its credit is booked in the store (:meth:`MoneyRecorder.top_up`
waits for the journal and raises ``LedgerUnavailable``), so credit the store holds is always in
the ledger first; everything else (sales, spends, lapses) is queued for the background writer,
off the hot path. Without a ledger configured the recorder records nothing.
"""

from __future__ import annotations

import secrets
import time

from gateway.ledger import entries
from gateway.ledger.entries import SettledPayment
from gateway.ledger.journal import Journal
from gateway.ledger.writer import JournalWriter


def _now_ms() -> int:
    return int(time.time() * 1000)


class MoneyRecorder:
    """The ledger as the payment paths see it."""

    def __init__(self, journal: Journal | None = None, writer: JournalWriter | None = None) -> None:
        self.journal = journal
        self.writer = writer

    async def top_up(self, payment: SettledPayment) -> int | None:
        """Write a settled top-up now and answer its journal id (None without a ledger);
        ``LedgerUnavailable`` if it could not be (book nothing then)."""
        if self.journal is None:
            return None
        return await self.journal.record_one(entries.top_up(payment))

    def sale(self, payment: SettledPayment) -> None:
        if self.writer is not None:
            self.writer.record_soon(entries.sale(payment))

    def credit_spent(self, *, hold: str, route: str, wallet: str, amount_micro: int) -> None:
        if self.writer is not None:
            self.writer.record_soon(
                entries.credit_spent(
                    ref=hold, route=route, wallet=wallet, amount_micro=amount_micro, at_ms=_now_ms()
                )
            )

    def credit_released(self, *, hold: str, route: str, wallet: str, amount_micro: int) -> None:
        if self.writer is not None:
            self.writer.record_soon(
                entries.credit_released(
                    ref=hold, route=route, wallet=wallet, amount_micro=amount_micro, at_ms=_now_ms()
                )
            )

    def credit_lapsed(self, *, wallet: str, amount_micro: int) -> None:
        if self.writer is not None and amount_micro > 0:
            at_ms = _now_ms()
            ref = f"{wallet}:{at_ms}:{secrets.token_hex(4)}"  # the store lapses each balance once
            self.writer.record_soon(
                entries.credit_lapsed(ref=ref, wallet=wallet, amount_micro=amount_micro, at_ms=at_ms)
            )
