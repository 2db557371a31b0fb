"""Lapsed prepaid credit, taken out of the books and counted.

Credit lapses ``CREDIT_LAPSE_DAYS`` after its wallet's last top-up. From that moment the store
spends it as nothing (the lapse time sits beside the balance, on the wallet's keys); this sweeper
then removes it, so the operator's liability shrinks by a logged, counted amount instead of a key
that silently expired. Every ``interval_s`` each app tries to claim the sweep; the one replica
that wins asks the lapse index (one sorted set for every wallet, the sweeper's hint, scored no
later than each wallet's lapse time) for the wallets due, and for each:

* visits the wallet, in one script on its own keys (``lapse_credit``): the balance lapsed when its
  lapse time (read there: a top-up may have moved it) has passed, and the credit its top-ups
  found lapsed (a top-up that arrives after the lapse but before the sweep lapses the old balance
  itself and keeps the amount beside it; it left the wallet due in the index, so this sweep
  comes) drained, both answered once;
* then fixes the index, a step of its own (``fix_lapse_index``), while no top-up registered the
  wallet since it was listed: a wallet with credit left is scored at its lapse time, one with none
  is dropped once its score is old enough that no credit registered before can still be booked
  (``forget_after_ms``), and until then scored at the listing's time (behind the wallets due
  longer, so a batch never fills with them). A fix that is lost leaves the wallet listed: the
  next sweep visits it again, finds nothing to lapse, and fixes it.

Each lapse of a non-zero amount is one ``credit lapsed`` log line (wallet, amount) and adds to
``x402_credit_lapsed_micro_usdc_total``. The claim only saves work: two sweeps racing still count
each amount once, as the per-wallet script answers it to one caller only. A sweeper that dies
mid-sweep leaves its claim to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from gateway.background import cancel_and_wait
from gateway.ledger.recorder import MoneyRecorder
from gateway.methods.credit.book import credit_account
from gateway.methods.credit.metrics import CREDIT_LAPSED
from gateway.store import Store, StoreUnavailable, keys
from gateway.store.claims import release
from gateway.store.credit import CREDIT_STEP_WINDOW_MS, due_lapses, fix_lapse_index, lapse_credit
from gateway.telemetry.logs import log_event

SWEEP_INTERVAL_S = 60.0
SWEEP_BATCH = 500
"""The most wallets one sweep lapses; more wait for the next (500 a minute is 720,000 a day)."""
FORGET_AFTER_MS = 2 * CREDIT_STEP_WINDOW_MS
"""How long past its score, at the listing, a wallet with no credit left must be before the sweep
drops it from the index: a score is never earlier than the wallet's last registration, so every
credit registered before is booked or past its deadline by then, even on nodes whose clocks
differ by up to a window."""


class CreditSweeper:
    """The app's sweeper of lapsed credit (started and stopped by its lifespan)."""

    def __init__(
        self,
        store: Store,
        recorder: MoneyRecorder | None = None,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        batch: int = SWEEP_BATCH,
        forget_after_ms: int = FORGET_AFTER_MS,
    ) -> None:
        self.store = store
        self.forget_after_ms = forget_after_ms
        self.recorder = recorder or MoneyRecorder()
        self.interval_s = interval_s
        self.batch = batch
        self.claim_ms = max(int(interval_s * 1000), 1)
        """How long a sweep may hold the claim: a sweeper that died frees it by the next round."""
        self._task: asyncio.Task[None] | None = None

    async def sweep(self) -> int:
        """One sweep, if no other replica is sweeping: the credit it lapsed, in micro-USDC."""
        token = secrets.token_hex(8)
        if not await self.store.claim(keys.credit_sweep(), token, self.claim_ms):
            return 0
        try:
            lapsed = 0
            index = keys.credit_lapses()
            due = await due_lapses(self.store, index, self.batch)
            for wallet, listed in due.wallets.items():
                visit = await lapse_credit(self.store, credit_account(wallet))
                lapsed += self._lapsed(wallet, visit.counted)
                if visit.lapse_at_ms is not None:  # credit left: visit it again when it lapses
                    score: int | None = visit.lapse_at_ms
                elif listed <= due.at_ms - self.forget_after_ms:
                    score = None  # no credit, and none registered before can still be booked
                else:
                    score = due.at_ms  # too young to drop: behind the wallets due longer
                await fix_lapse_index(self.store, index, wallet, listed, score)
            return lapsed
        finally:
            with contextlib.suppress(StoreUnavailable):
                await release(self.store, keys.credit_sweep(), token)

    def _lapsed(self, wallet: str, amount: int) -> int:
        """Book one lapse: its log line, its count and its ledger entry (a lapse of nothing is
        none of them)."""
        if amount > 0:
            CREDIT_LAPSED.inc(amount)
            log_event("credit lapsed", wallet=wallet, amount=str(amount))
            self.recorder.credit_lapsed(wallet=wallet, amount_micro=amount)
        return amount

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="credit-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except StoreUnavailable:
                log_event("credit sweep skipped: store unavailable", logging.WARNING)
            await asyncio.sleep(self.interval_s)
