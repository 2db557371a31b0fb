"""The restore check, wallet by wallet: each wallet's ledger mark is raised in the very step that
books its credit, so a store that lost one wallet's credit (on a cluster, one shard failed over
to a replica that missed it, whatever the other shards kept) lost its mark with it, and the
check finds that wallet behind the ledger.

A real PostgreSQL journal; the gateway's store on single-node Redis and on the 3-master cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.ledger import Journal
from gateway.ledger.entries import SettledPayment, top_up
from gateway.ledger.restore import StoreRestorer
from gateway.methods.credit.book import CreditBook, credit_account
from gateway.store import Entry, Store, keys, open_store
from gateway.store.claims import claim_then_put
from gateway.store.credit import credit_state

ALICE, BOB = str(Keypair().pubkey()), str(Keypair().pubkey())
DAY_MS = 86_400_000


@pytest_asyncio.fixture
async def journal(ledger_url: str) -> AsyncIterator[Journal]:
    opened = await Journal.open(ledger_url, timeout_s=5)
    yield opened
    await opened.close()


@pytest_asyncio.fixture(params=["redis", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    url = request.getfixturevalue("clean_cluster_url" if request.param == "cluster" else "clean_redis_url")
    opened = open_store(url, None)
    yield opened
    await opened.close()


class Books:
    """Top-ups journaled and booked as the gateway does: the journal first, then the delivery
    with the credit and the wallet's mark."""

    def __init__(self, store: Store, journal: Journal) -> None:
        self.store = store
        self.journal = journal
        self.book = CreditBook(store, lapse_days=365, upstream_timeout_s=15.0)
        self.restorer = StoreRestorer(
            store, journal, lapse_ms=self.book.lapse_ms, grace_ms=self.book.grace_ms, settle_margin_ms=0
        )
        self.n = 0

    async def journaled(self, wallet: str, amount: int, ago_ms: int = 1_000) -> tuple[str, int]:
        """A settled top-up in the journal (``ago_ms`` ago), not booked yet: its payment key and
        journal id."""
        self.n += 1
        key = f"{self.n:064x}"
        payment = SettledPayment(
            route="credits.top-up.1",
            payer=wallet,
            amount_micro=amount,
            signature=f"sig{self.n}-{wallet[:6]}",
            facilitator="internal",
            at_ms=int(time.time() * 1000) - ago_ms,
            payment_key=key,
        )
        return key, await self.journal.record_one(top_up(payment))

    async def top_up(self, wallet: str, amount: int, ago_ms: int = 1_000) -> int:
        key, entry_id = await self.journaled(wallet, amount, ago_ms)
        delivery = Entry(keys.delivery(wallet, key), "delivered", 600_000)
        close = Entry(keys.pending_settlement(wallet, key), "", 1)
        assert (
            await claim_then_put(self.store, [delivery], [close], self.book.credits(wallet, amount, entry_id))
            == 1
        )
        return entry_id

    async def balance(self, wallet: str) -> int:
        return (await credit_state(self.store, credit_account(wallet))).balance

    async def lose(self, wallet: str) -> None:
        """What a failover of the wallet's shard to a replica that missed its writes leaves: none of
        its credit keys, mark included (they are written in one step, on one slot)."""
        account = credit_account(wallet)
        for key in (account.balance, account.holds, account.lapse, keys.ledger_mark(wallet)):
            await self.store.put(key, "", 1)  # expires at once: the store's one way to forget a key
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def books(store: Store, journal: Journal) -> Books:
    return Books(store, journal)


async def test_a_store_that_kept_every_wallets_credit_lost_nothing(books: Books) -> None:
    assert await books.restorer.check() is False  # new store, nothing owed: marked checked
    first = await books.top_up(ALICE, 500)
    await books.top_up(BOB, 300)
    await books.top_up(ALICE, 200)

    assert await books.restorer.lost() is None
    assert await books.store.counters([keys.ledger_mark(ALICE)]) == {keys.ledger_mark(ALICE): first + 2}


async def test_one_wallet_that_lost_its_credit_and_mark_is_found_and_restored(books: Books) -> None:
    await books.restorer.check()
    await books.top_up(ALICE, 500)
    await books.top_up(BOB, 300)
    await books.lose(BOB)

    why = await books.restorer.lost()
    restored = await books.restorer.check()

    assert why is not None and BOB in why
    assert restored is True
    assert (await books.balance(ALICE), await books.balance(BOB)) == (500, 300)
    assert await books.restorer.lost() is None
    assert await books.restorer.check() is False  # once: the restore set each wallet's mark


async def test_a_wallet_behind_its_mark_whose_top_up_is_still_pending_lost_nothing(books: Books) -> None:
    """Journaled, not booked yet: the pending settlement (written before the settle, closed only
    by the booking) says the credit is still on its way."""
    await books.restorer.check()
    await books.top_up(ALICE, 500)
    key, _ = await books.journaled(ALICE, 70)
    await books.store.put(keys.pending_settlement(ALICE, key), "pending", 600_000)

    assert await books.restorer.lost() is None
    await books.store.put(keys.pending_settlement(ALICE, key), "", 1)  # gone with no booking: lost
    await asyncio.sleep(0.02)
    assert ALICE in (await books.restorer.lost() or "")


async def test_a_top_up_younger_than_the_settle_margin_is_not_judged_yet(
    books: Books, journal: Journal
) -> None:
    restorer = StoreRestorer(books.store, journal, lapse_ms=DAY_MS, grace_ms=DAY_MS, settle_margin_ms=60_000)
    await restorer.check()
    await books.journaled(BOB, 40)  # settled a second ago, not booked, no pending record

    assert await restorer.lost() is None
    assert await books.restorer.lost() is not None  # past the margin it would be


async def test_a_flushed_store_is_restored_at_once_whatever_the_margin(
    books: Books, journal: Journal
) -> None:
    restorer = StoreRestorer(books.store, journal, lapse_ms=DAY_MS, grace_ms=DAY_MS, settle_margin_ms=60_000)
    await restorer.check()
    await books.top_up(ALICE, 500)
    await books.lose(ALICE)
    await books.store.put(keys.ledger_checked(), "", 1)  # flushed: the check's own mark went too
    await asyncio.sleep(0.02)

    assert await restorer.check() is True
    assert await books.balance(ALICE) == 500


async def test_a_restore_run_twice_sets_the_same_balances_and_marks(books: Books) -> None:
    await books.restorer.check()
    newest = await books.top_up(ALICE, 500)
    await books.top_up(BOB, 300)

    await books.restorer.restore()
    await books.restorer.restore()

    assert (await books.balance(ALICE), await books.balance(BOB)) == (500, 300)
    assert (await books.store.counters([keys.ledger_mark(ALICE)]))[keys.ledger_mark(ALICE)] == newest
    assert await books.restorer.lost() is None


async def test_the_quick_check_reads_the_recently_topped_up_wallets_the_full_one_every_wallet(
    books: Books,
) -> None:
    """A failover loses the latest writes: the quick check (every few seconds) reads the marks of
    the wallets topped up in the last 15 minutes; a master restarted empty loses older credit
    too, which the full check (every minute, and at start-up) finds."""
    await books.restorer.check()
    await books.top_up(ALICE, 500, ago_ms=3_600_000)  # an hour ago
    await books.top_up(BOB, 300)
    await books.lose(ALICE)

    assert await books.restorer.lost(full=False) is None
    assert ALICE in (await books.restorer.lost() or "")
    await books.lose(BOB)
    assert BOB in (await books.restorer.lost(full=False) or "")


async def test_the_running_check_finds_an_old_wallets_loss_at_its_next_full_check(
    books: Books, journal: Journal
) -> None:
    restorer = StoreRestorer(
        books.store,
        journal,
        lapse_ms=DAY_MS,
        grace_ms=DAY_MS,
        interval_s=0.05,
        full_interval_s=0.3,
        settle_margin_ms=0,
    )
    await restorer.check()
    await books.top_up(ALICE, 500, ago_ms=3_600_000)
    await books.lose(ALICE)
    restorer.start()
    try:
        deadline = time.monotonic() + 10
        while await books.balance(ALICE) != 500:
            assert time.monotonic() < deadline, "the full check never restored the old wallet"
            await asyncio.sleep(0.05)
    finally:
        await restorer.stop()
