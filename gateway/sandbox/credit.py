"""Prepaid credit in the sandbox: sold on its in-memory store, kept in its state directory.

A gateway sells credit only on a store that outlives it (credit is money owed); the sandbox's
store is the in-memory one, so the sandbox keeps the credit itself: on start it restores every
wallet's balance with the lapse time it had, and it saves them on exit and whenever they changed
(:func:`keep_credit`, beside the chain's autosave) to ``sandbox-credit.json``
(:mod:`gateway.sandbox.state`). Calls in flight at exit hold credit they never took: holds are not
kept, so what they held is the wallet's again.

With a ledger (:mod:`gateway.sandbox.postgres`) the ledger has the last word: the gateway's
:class:`~gateway.ledger.restore.StoreRestorer` finds the fresh store without the ledger's mark
and sets every wallet's balance to what the ledger owes it (a balance set, never added: the
file's credit restored first is replaced, not doubled); the file stays the fallback when the
ledger is off. The file says whether the ledger has all its movements (``journaled``): once
credit moved without the ledger (``--no-ledger``, a server that could not start, a sandbox from
before the ledger), restoring from the ledger would take back credit bought since, or give back
credit spent, so the ledger stays off for that state directory (:func:`unjournaled_credit`).

:class:`CreditKeepingStore` finds the wallets with credit in the lapse index (every top-up and
every restore registers its wallet there before its credit, and only the sweeper drops a wallet
with none left), and reads each one's balance and time to lapse as the gateway does
(``credit_state``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gateway.methods.credit.book import CreditBook, credit_account
from gateway.sandbox.state import (
    CREDIT_VERSION,
    CreditSnapshot,
    KeptCredit,
    read_credit,
    save_credit,
)
from gateway.store import keys
from gateway.store.claims import claim_then_put
from gateway.store.credit import credit_state
from gateway.store.memory import MemoryStore


class CreditKeepingStore(MemoryStore):
    """The memory store, finding every wallet it holds credit for (to save their credit on exit).

    ``journaled``: a ledger records this store's credit movements."""

    def __init__(self, *, journaled: bool = False) -> None:
        super().__init__()
        self.journaled = journaled

    async def credited(self) -> set[str]:
        """Every wallet in the lapse index: credited by a top-up or restored, not lapsed since."""
        wallets: Any = await self._call(self._redis.zrange(keys.credit_lapses(), 0, -1))
        return {str(wallet) for wallet in wallets}


def unjournaled_credit(state_dir: Path, ledger_dir: Path) -> bool:
    """``state_dir``'s credit moved where its ledger (``ledger_dir``) did not see it: the credit
    file says so, and it holds credit or a ledger exists to disagree with it."""
    kept = read_credit(state_dir)
    if kept is None or kept.journaled:
        return False
    return bool(kept.wallets) or (ledger_dir / "PG_VERSION").is_file()


async def snapshot_credit(store: CreditKeepingStore) -> CreditSnapshot:
    """Every credited wallet that still has credit, with when it lapses."""
    now_ms = int(time.time() * 1000)
    kept: dict[str, KeptCredit] = {}
    for wallet in sorted(await store.credited()):
        state = await credit_state(store, credit_account(wallet))
        if state.balance > 0 and state.ttl_ms > 0:
            kept[wallet] = KeptCredit(balance=state.balance, lapses_at_ms=now_ms + state.ttl_ms)
    return CreditSnapshot(version=CREDIT_VERSION, wallets=kept, journaled=store.journaled)


async def restore_credit(
    store: CreditKeepingStore, snapshot: CreditSnapshot, upstream_timeout_s: float
) -> int:
    """Credit each wallet of ``snapshot`` as a top-up would, lapsing when it lapsed before (credit
    whose lapse time passed while the sandbox was stopped is not restored); how many were."""
    now_ms = int(time.time() * 1000)
    restored = 0
    for wallet, kept in snapshot.wallets.items():
        left_ms = kept.lapses_at_ms - now_ms
        if kept.balance <= 0 or left_ms <= 0:
            continue
        book = CreditBook(store, lapse_days=1, lapse_ms=left_ms, upstream_timeout_s=upstream_timeout_s)
        await claim_then_put(store, (), (), book.credits(wallet, kept.balance))
        restored += 1
    return restored


async def load_credit(
    state_dir: Path, store: CreditKeepingStore, upstream_timeout_s: float
) -> CreditSnapshot:
    """Restore the credit ``state_dir`` kept into ``store`` (OSError if its file is unreadable);
    what the store holds now, to compare later saves with."""
    kept = read_credit(state_dir)
    if kept is not None:
        await restore_credit(store, kept, upstream_timeout_s)
    return await keep_credit(state_dir, store, kept)


async def keep_credit(
    state_dir: Path, store: CreditKeepingStore, saved: CreditSnapshot | None
) -> CreditSnapshot:
    """Save the store's credit to ``state_dir`` unless its balances are what was ``saved`` last
    (and, with a ledger, the file already says it is journaled); what the file holds now
    (``saved`` itself when nothing moved). Without a ledger, credit that did not move leaves the
    file's word that the ledger has it all."""
    now = await snapshot_credit(store)
    if saved is not None and _balances(now) == _balances(saved) and saved.journaled >= now.journaled:
        return saved
    save_credit(state_dir, now)
    return now


def _balances(snapshot: CreditSnapshot) -> dict[str, int]:
    """The balances alone: a lapse time read again differs by the milliseconds between reads."""
    return {wallet: kept.balance for wallet, kept in snapshot.wallets.items()}
