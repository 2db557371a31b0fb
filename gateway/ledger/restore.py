"""A store that lost data is brought forward from the ledger before credit moves again.

Redis can forget: a failover to a lagging replica, a restore from a backup, a restart without
persistence, an operator's FLUSHALL. The ledger cannot (it is the record of money), so each
replica checks the store against it, at start-up before serving and every ``interval_s`` after.
A store never checked (the ``ledger-checked`` mark, set by the first check or restore, is
missing) is new, flushed or replaced: all of it is restored at once. Otherwise the check goes
wallet by wallet. Each wallet's credit carries its ledger mark, on its own keys: the journal id of
the newest top-up booked for it, raised in the very step that books the credit, so the mark and
the credit are lost together (on a cluster, a failover of one wallet's master loses that wallet's
mark with its credit, whatever other slots kept). A wallet the ledger owes credit to lost it when
a top-up of it journaled after its mark, more than ``settle_margin_ms`` ago, has no pending
settlement in the store (the pending record is written before a top-up is settled, and so
before it is journaled, and closed only by its booking): flushed, replaced, rolled back, restored
from an old backup, or one shard failed over. The check reads the marks of the wallets owed
credit, a batch of independent keys at a time (``Store.counters``: one round trip per node), and
the few top-ups after a mark that is behind: every ``interval_s`` the wallets with a top-up in the
last 15 minutes (what a failover loses: the latest writes), every ``full_interval_s`` and at
start-up every wallet owed (what a master restarted empty or from an old backup loses).

Then one replica (a claim in the store) marks the top-ups of the last 15 minutes (a pending
settlement's life) claimed and delivered, so a pending one cannot be booked again on top of its
restored credit, and restores every wallet the ledger knows to exactly what the ledger says it is
owed, lapsing from its last top-up, with its mark at its newest top-up (``restore_credit``: the
wallet registered in the lapse index, then its keys set in one step). A restore cut short leaves
the wallets it did not reach behind: the next check restores again, setting the same values.
What the ledger does not know yet (spends still queued in a writer) is lost with the store, in
the client's favour. A replay of an older top-up stays refused: its transaction landed on chain
once and cannot be settled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import msgspec

from gateway.background import cancel_and_wait
from gateway.ledger.journal import Journal, LedgerUnavailable
from gateway.methods.credit.book import credit_account
from gateway.methods.exact.ledger import PENDING_TTL_MS, DeliveredRecord
from gateway.store import LedgerPosition, Store, StoreUnavailable, keys
from gateway.store.claims import release
from gateway.store.credit import restore_credit
from gateway.telemetry.logs import log_event

CHECK_INTERVAL_S = 5.0
"""How often each replica checks the store against the ledger: the wallets with a recent top-up."""
FULL_CHECK_INTERVAL_S = 60.0
"""How often the check reads every owed wallet's mark (a scan of the ledger's credit postings),
not only those of the wallets with a top-up in the last ``PENDING_TTL_MS``: a failover loses the
latest writes (recent top-ups), a master restarted empty or from an old backup loses all of its
wallets'."""
SETTLE_MARGIN_MS = 20_000
"""A top-up younger than this may still be between its journal entry and its booking."""
CHECKED_TTL_MS = 10 * 365 * 86_400_000
"""The check's mark lives as long as the store does (ten years: a key needs a lifetime here)."""
MARK_BATCH = 1_000
"""How many wallets' marks one read asks for."""
RESTORE_CLAIM_MS = 60_000
RESTORED_CLAIM = "restored from the ledger"
RESTORED = msgspec.json.encode(DeliveredRecord(fingerprint="restored from the ledger", claimant="")).decode()
"""The delivery a restore writes for a recent top-up: it answers no request, so a retry of the
top-up is refused as already used (its credit is in the restored balance)."""


class StoreRestorer:
    """Checks the store against the ledger and restores it when it lost credit."""

    def __init__(
        self,
        store: Store,
        journal: Journal,
        *,
        lapse_ms: int,
        grace_ms: int,
        interval_s: float | None = None,
        full_interval_s: float | None = None,
        settle_margin_ms: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.journal = journal
        self.lapse_ms = lapse_ms
        self.grace_ms = grace_ms
        self.interval_s = CHECK_INTERVAL_S if interval_s is None else interval_s
        self.full_interval_s = FULL_CHECK_INTERVAL_S if full_interval_s is None else full_interval_s
        self.settle_margin_ms = SETTLE_MARGIN_MS if settle_margin_ms is None else settle_margin_ms
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def lost(self, full: bool = True) -> str | None:
        """Why the store lost credit the ledger knows of; None when it did not. Not ``full``:
        the wallets with a top-up settled in the last ``PENDING_TTL_MS`` only."""
        now = self._now_ms()
        if await self.store.get(keys.ledger_checked()) is None:
            if not await self.journal.newest_top_ups_owed(now + 1):
                await self._mark_checked()
                return None  # a new store and a ledger that owes nothing: nothing to restore
            return "the store was never checked against the ledger (store new, flushed or replaced)"
        before = now - self.settle_margin_ms
        newest = await self.journal.newest_top_ups_owed(before, None if full else now - PENDING_TTL_MS)
        wallets = list(newest)
        for at in range(0, len(wallets), MARK_BATCH):
            batch = wallets[at : at + MARK_BATCH]
            marks = await self.store.counters([keys.ledger_mark(wallet) for wallet in batch])
            for wallet in batch:
                mark = marks[keys.ledger_mark(wallet)]
                if mark >= newest[wallet]:
                    continue
                for entry in await self.journal.top_ups_of(wallet, mark, before):
                    key = entry.payment_key
                    intent = None if key is None else keys.pending_settlement(wallet, key)
                    if intent is not None and await self.store.get(intent) is not None:
                        continue  # settled, its booking still to come
                    return (
                        f"top-up {entry.signature} of {wallet} is in the ledger, not in the store "
                        f"(its credit goes to entry {mark}: store new, flushed, replaced or rolled back)"
                    )
        return None

    async def check(self, full: bool = True) -> bool:
        """Restore the store if it lost credit (``full``: :meth:`lost`); True when this call
        restored it."""
        why = await self.lost(full)
        if why is None:
            return False
        token = secrets.token_hex(8)
        if not await self.store.claim(keys.ledger_restore(), token, RESTORE_CLAIM_MS):
            return False  # another replica is restoring it
        try:
            log_event("store lost credit: restoring it from the ledger", logging.ERROR, reason=why)
            wallets = await self.restore()
            log_event("store restored from the ledger", logging.WARNING, wallets=wallets)
            return True
        finally:
            with contextlib.suppress(StoreUnavailable):
                await release(self.store, keys.ledger_restore(), token)

    async def restore(self) -> int:
        """Recent top-ups marked delivered, then every wallet the ledger knows set to what it is
        owed, with its mark. Answers how many wallets were restored."""
        now = self._now_ms()
        for entry in await self.journal.top_ups(now - PENDING_TTL_MS, now + 1):
            if entry.payment_key is not None:  # claimed and delivered: any retry is refused as used
                payer, key = entry.wallet, entry.payment_key
                await self.store.claim(keys.payment_claim(payer, key), RESTORED_CLAIM, PENDING_TTL_MS)
                await self.store.claim(keys.delivery(payer, key), RESTORED, PENDING_TTL_MS)
        owed = await self.journal.owed_since_top_ups()
        for wallet in owed:
            lapse_at = (wallet.last_top_up_ms or now) + self.lapse_ms
            mark = None
            if wallet.last_top_up_id:
                mark = LedgerPosition(keys.ledger_mark(wallet.wallet), wallet.last_top_up_id)
            await restore_credit(
                self.store,
                credit_account(wallet.wallet),
                keys.credit_lapses(),
                wallet.owed_micro,
                lapse_at,
                max(1, lapse_at + self.grace_ms - now),
                mark,
            )
        await self._mark_checked()
        return len(owed)

    async def _mark_checked(self) -> None:
        """The store holds what the ledger does: from now on a loss shows wallet by wallet."""
        await self.store.put(keys.ledger_checked(), "1", CHECKED_TTL_MS)

    async def run(self) -> None:
        """Check every ``interval_s`` (every wallet owed credit every ``full_interval_s``, the
        recently topped-up ones between) until cancelled; an outage of either side waits for the
        next. The check at start-up (the app's) was a full one."""
        loop = asyncio.get_running_loop()
        full_at = loop.time() + self.full_interval_s
        while True:
            await asyncio.sleep(self.interval_s)
            full = loop.time() >= full_at
            try:
                await self.check(full)
            except (StoreUnavailable, LedgerUnavailable) as failed:
                log_event(f"ledger check skipped: {failed}", logging.WARNING)
                continue
            if full:
                full_at = loop.time() + self.full_interval_s

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="ledger-restorer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
