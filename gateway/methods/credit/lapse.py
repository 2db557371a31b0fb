"""Lapsed prepaid credit, taken out of the books and counted.

Credit lapses ``CREDIT_LAPSE_DAYS`` after its wallet's last top-up. From that moment the store
spends it as nothing (the lapse time sits beside the balance); this sweeper then removes it, so
the operator's liability shrinks by a logged, counted amount instead of a key that silently
expired. Every ``interval_s`` each app tries to claim the sweep; the one replica that wins:

* counts the credit top-ups found lapsed (a top-up that arrives after the lapse but before the
  sweep lapses the old balance itself, keeping its amount for this count);
* asks for the wallets whose lapse time has passed and lapses each in one script per wallet,
  which re-reads the lapse time, since a top-up may have moved it meanwhile.

Each lapse of a non-zero amount is one ``credit lapsed`` log line (wallet, amount) and adds to
``x402_credit_lapsed_micro_usdc_total``. The claim only saves work: two sweeps racing still lapse
each balance once, as the per-wallet script answers a lapse to one caller only. A sweeper that
dies mid-sweep leaves its claim to expire.
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
from gateway.store.credit import drain_lapsed, due_lapses, lapse_credit
from gateway.telemetry.logs import log_event

SWEEP_INTERVAL_S = 60.0
SWEEP_BATCH = 500
"""The most wallets one sweep lapses; more wait for the next (500 a minute is 720,000 a day)."""


class CreditSweeper:
    """The app's sweeper of lapsed credit (started and stopped by its lifespan)."""

    def __init__(
        self,
        store: Store,
        recorder: MoneyRecorder | None = None,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        batch: int = SWEEP_BATCH,
    ) -> None:
        self.store = store
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
            for wallet, amount in (await drain_lapsed(self.store, keys.credit_lapsed())).items():
                lapsed += self._lapsed(wallet, amount)
            for wallet in await due_lapses(self.store, keys.credit_lapses(), self.batch):
                swept = await lapse_credit(self.store, credit_account(wallet))
                if swept is not None:  # None: a top-up moved its lapse since it was listed
                    lapsed += self._lapsed(wallet, swept)
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
