"""The ledger's journal on a real PostgreSQL: balanced, append-only, idempotent, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.ledger import Entry, EntryKind, Journal, JournalWriter, LedgerUnavailable, Posting
from gateway.ledger.entries import SettledPayment, credit_lapsed, credit_spent, sale, top_up
from tests.support.ports import refusing_port
from tests.support.postgres_server import create_database

WALLET = str(Keypair().pubkey())
OTHER = str(Keypair().pubkey())
T0 = 1_790_000_000_000


@pytest_asyncio.fixture
async def journal(ledger_url: str) -> AsyncIterator[Journal]:
    opened = await Journal.open(ledger_url, timeout_s=5)
    yield opened
    await opened.close()


def _top_up(wallet: str, amount: int, n: int) -> Entry:
    return top_up(
        SettledPayment(
            route="credits.top-up.1",
            payer=wallet,
            amount_micro=amount,
            signature=f"sig{n}",
            facilitator="internal",
            at_ms=T0 + n,
        )
    )


def _spent(wallet: str, amount: int, n: int) -> Entry:
    return credit_spent(
        ref=f"hold{n}", route="rpc.getBalance", wallet=wallet, amount_micro=amount, at_ms=T0 + n
    )


async def test_what_a_wallet_is_owed_is_its_top_ups_less_its_spends_and_lapses(journal: Journal) -> None:
    recorded = await journal.record(
        [
            _top_up(WALLET, 1_000_000, 1),
            _spent(WALLET, 5, 2),
            _spent(WALLET, 5, 3),
            _top_up(OTHER, 2_000_000, 4),
        ]
    )
    await journal.record([credit_lapsed(ref="lapse1", wallet=OTHER, amount_micro=2_000_000, at_ms=T0 + 5)])

    assert recorded == 4
    assert await journal.owed_to(WALLET) == 999_990
    assert await journal.owed_to(OTHER) == 0
    assert await journal.owed() == {WALLET: 999_990}


async def test_every_entry_balances_and_the_books_sum_to_zero(journal: Journal, ledger_url: str) -> None:
    await journal.record(
        [
            _top_up(WALLET, 1_000_000, 1),
            _spent(WALLET, 7, 2),
            sale(
                SettledPayment(
                    route="rpc.getBalance",
                    payer=OTHER,
                    amount_micro=2205,
                    signature="sig9",
                    facilitator="cdp",
                    at_ms=T0 + 9,
                )
            ),
        ]
    )
    connection = await asyncpg.connect(ledger_url)
    try:
        accounts = dict(
            await connection.fetch("SELECT account, sum(amount_micro) FROM ledger_postings GROUP BY account")
        )
    finally:
        await connection.close()

    assert accounts == {
        "asset:usdc-received": 1_002_205,
        f"liability:credit:{WALLET}": -999_993,
        "income:sales": -2_212,
    }
    assert sum(accounts.values()) == 0


async def test_a_movement_recorded_again_is_recorded_once(journal: Journal) -> None:
    batch = [_top_up(WALLET, 1_000_000, 1), _spent(WALLET, 5, 2)]

    assert await journal.record(batch) == 2
    assert await journal.record(batch) == 0
    assert await journal.record([batch[1], _spent(WALLET, 5, 3)]) == 1
    assert await journal.owed_to(WALLET) == 999_990


async def test_ten_replicas_recording_one_batch_at_once_record_it_once(journal: Journal) -> None:
    batch = [_top_up(WALLET, 1_000_000, 1), *(_spent(WALLET, 1, n) for n in range(2, 50))]

    counts = await asyncio.gather(*(journal.record(batch) for _ in range(10)), return_exceptions=True)

    # Concurrent inserts of one ref wait for each other; the losers skip it. None may record it twice.
    assert sum(c for c in counts if isinstance(c, int)) == 49
    assert await journal.owed_to(WALLET) == 1_000_000 - 48


async def test_entries_keep_the_order_they_were_recorded_in(journal: Journal) -> None:
    batch = [_top_up(WALLET, 1_000_000, 1), *(_spent(WALLET, 1, n) for n in range(2, 30))]
    await journal.record(batch)

    listed = [entry async for entry in journal.entries(page=7)]

    assert [e.ref for e in listed] == [e.ref for e in batch]
    assert [e.id for e in listed] == sorted(e.id for e in listed)
    assert listed[0].kind is EntryKind.TOP_UP and listed[0].signature == "sig1"
    assert listed[0].occurred_at_ms == T0 + 1


async def test_entries_are_listed_by_when_they_occurred(journal: Journal) -> None:
    await journal.record([_top_up(WALLET, 1_000_000, 1), *(_spent(WALLET, 1, n) for n in range(2, 10))])

    listed = [e.ref async for e in journal.entries(since_ms=T0 + 3, until_ms=T0 + 6)]

    assert listed == ["credit-take:hold3", "credit-take:hold4", "credit-take:hold5"]


async def test_a_wallets_movements_are_its_own_newest_first(journal: Journal) -> None:
    await journal.record([_top_up(WALLET, 1_000_000, 1), _top_up(OTHER, 10, 2), _spent(WALLET, 5, 3)])

    movements = await journal.movements(WALLET, limit=5)

    assert [(m.kind, m.amount_micro) for m in movements] == [
        (EntryKind.CREDIT_SPENT, 5),
        (EntryKind.TOP_UP, 1_000_000),
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entries SET amount_micro = 1",
        "DELETE FROM ledger_entries",
        "TRUNCATE ledger_entries CASCADE",
        "UPDATE ledger_postings SET amount_micro = 0",
        "DELETE FROM ledger_postings",
    ],
)
async def test_the_journal_refuses_to_be_edited(journal: Journal, ledger_url: str, statement: str) -> None:
    await journal.record([_top_up(WALLET, 1_000_000, 1)])
    connection = await asyncpg.connect(ledger_url)
    try:
        with pytest.raises(asyncpg.RaiseError, match="the ledger is append-only"):
            await connection.execute(statement)
    finally:
        await connection.close()

    assert await journal.owed_to(WALLET) == 1_000_000


async def test_an_entry_that_does_not_balance_is_refused(journal: Journal, ledger_url: str) -> None:
    with pytest.raises(ValueError, match="do not balance"):
        Entry(
            ref="x",
            kind=EntryKind.SALE,
            occurred_at_ms=T0,
            amount_micro=5,
            wallet=WALLET,
            postings=(Posting("asset:usdc-received", 5), Posting("income:sales", -4)),
        )
    connection = await asyncpg.connect(ledger_url)
    try:
        with pytest.raises(asyncpg.RaiseError, match="does not balance"):
            async with connection.transaction():
                entry = await connection.fetchval(
                    "INSERT INTO ledger_entries (ref, kind, occurred_at, amount_micro, wallet) "
                    "VALUES ('x', 'sale', now(), 5, 'w') RETURNING id"
                )
                await connection.execute(
                    "INSERT INTO ledger_postings VALUES "
                    "($1, 'asset:usdc-received', 5), ($1, 'income:sales', -4)",
                    entry,
                )
    finally:
        await connection.close()
    assert [e async for e in journal.entries()] == []


async def test_opening_twice_keeps_what_was_recorded(journal: Journal, ledger_url: str) -> None:
    await journal.record([_top_up(WALLET, 1_000_000, 1)])

    again = await Journal.open(ledger_url)
    try:
        assert await again.owed_to(WALLET) == 1_000_000
    finally:
        await again.close()


async def test_an_unreachable_database_is_ledger_unavailable() -> None:
    with pytest.raises(LedgerUnavailable, match="ledger database unavailable"):
        await Journal.open(f"postgresql://postgres@127.0.0.1:{refusing_port()}/postgres", timeout_s=1)


# --- the writer ---------------------------------------------------------------------------------


async def _set_connections(ledger_url: str, postgres_url: str, allowed: bool) -> None:
    """Let the journal's database be reached, or cut it off (an outage of the ledger alone)."""
    name = urlsplit(ledger_url).path.lstrip("/")  # a database of its own: create_database
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
            )
    finally:
        await admin.close()


async def test_the_writer_writes_what_it_queued_in_order(journal: Journal) -> None:
    writer = JournalWriter(journal, flush_interval_s=0.01)
    writer.record_soon(_top_up(WALLET, 1_000_000, 1))
    for n in range(2, 12):
        writer.record_soon(_spent(WALLET, 3, n))

    await writer.flush()

    assert writer.backlog == 0
    assert await journal.owed_to(WALLET) == 1_000_000 - 30
    assert [e.ref async for e in journal.entries()][-1] == "credit-take:hold11"


async def test_the_writer_keeps_entries_through_an_outage_and_writes_them_once(postgres_url: str) -> None:
    ledger_url = await create_database(postgres_url)
    journal = await Journal.open(ledger_url, timeout_s=2)
    writer = JournalWriter(journal, flush_interval_s=0.02)
    writer.start()
    try:
        writer.record_soon(_top_up(WALLET, 1_000_000, 1))
        await _wait_for(lambda: writer.backlog == 0)
        await _set_connections(ledger_url, postgres_url, allowed=False)
        for n in range(2, 7):
            writer.record_soon(_spent(WALLET, 2, n))
        await asyncio.sleep(0.2)
        assert writer.backlog == 5 and writer.lag_s() > 0.1
        await _set_connections(ledger_url, postgres_url, allowed=True)
        await _wait_for(lambda: writer.backlog == 0)
    finally:
        await writer.stop()

    assert await journal.owed_to(WALLET) == 1_000_000 - 10
    await journal.close()


async def test_a_full_backlog_drops_its_oldest_entries(journal: Journal) -> None:
    writer = JournalWriter(journal, max_backlog=3)
    for n in range(1, 6):
        writer.record_soon(_spent(WALLET, 1, n))

    await writer.flush()

    assert [e.ref async for e in journal.entries()] == [f"credit-take:hold{n}" for n in (3, 4, 5)]


async def test_stopping_the_writer_writes_what_is_left(journal: Journal) -> None:
    writer = JournalWriter(journal, flush_interval_s=60)
    writer.start()
    writer.record_soon(_top_up(WALLET, 42, 1))

    await writer.stop()

    assert await journal.owed_to(WALLET) == 42


async def _wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
