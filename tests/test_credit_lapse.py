"""Credit lapse, counted: credit past its lapse time is never spent, and the sweeper takes it out
of the books once, with a log line and the Prometheus counter, on one replica at a time.

Over the real stores (memory, Redis, Upstash REST over Redis), with lapses of a few hundred ms
(the book's lapse in ms; ``CREDIT_LAPSE_DAYS`` stays the operator's knob).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from gateway.config import Settings
from gateway.methods.credit.book import CreditBook, credit_account
from gateway.methods.credit.lapse import CreditSweeper
from gateway.services import Services
from gateway.store import Entry, Store, keys
from gateway.store.claims import CLAIM_THEN_PUT_SCRIPT, claim_then_put, claim_then_put_call, release
from gateway.store.credit import credit_state, due_lapses, lapse_credit, register_credits
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.telemetry.logs import LOGGER_NAME
from tests.support.log_capture import captured_log_lines
from tests.support.polling import read_until
from tests.support.redis_fixtures import STORE_KINDS, fresh_store

LAPSE_MS = 300
PAST_THE_LAPSE_S = 0.45


@pytest_asyncio.fixture(params=STORE_KINDS)
async def store(
    request: pytest.FixtureRequest, upstash_url_and_token: tuple[str, str]
) -> AsyncIterator[Store]:
    opened = fresh_store(request, request.param, upstash_url_and_token)
    try:
        yield opened
    finally:
        await opened.close()


LapseLines = Callable[[], list[tuple[str, str]]]


@pytest.fixture
def lapse_lines() -> Iterator[LapseLines]:
    """The (wallet, amount) of each ``credit lapsed`` log line written so far in the test."""
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with captured_log_lines() as raw:
            yield lambda: [
                (line["wallet"], line["amount"])
                for line in map(json.loads, raw)
                if line["msg"] == "credit lapsed"
            ]
    finally:
        logger.setLevel(level)


def _book(store: Store, lapse_ms: int = LAPSE_MS) -> CreditBook:
    return CreditBook(store, lapse_days=365, lapse_ms=lapse_ms, upstream_timeout_s=1.0)


async def _fund(book: CreditBook, wallet: str, amount: int, payment: str) -> None:
    """Credit ``wallet`` the way a top-up's delivery does (the claim-then-put round trip)."""
    claim = Entry(keys.delivery(wallet, payment), "1", 60_000)
    assert await claim_then_put(book.store, [claim], [], book.credits(wallet, amount)) == 1


def _lapsed_total() -> float:
    return REGISTRY.get_sample_value("x402_credit_lapsed_micro_usdc_total") or 0.0


async def _until_due(store: Store, wallets: int) -> None:
    """Wait until ``wallets`` wallets are due to lapse, or ``PAST_THE_LAPSE_S`` has passed: listed
    in the index (a hint, scored at the top-up's first step) and past their own lapse time
    (written by its booking, a moment later)."""
    deadline = time.monotonic() + PAST_THE_LAPSE_S
    due = await read_until(
        lambda: due_lapses(store, keys.credit_lapses(), 100),
        lambda due: len(due.wallets) >= wallets,
        deadline,
    )
    for wallet in due.wallets:
        await read_until(
            lambda w=wallet: credit_state(store, credit_account(w)), lambda state: state.ttl_ms == 0, deadline
        )


async def test_the_sweeper_lapses_due_credit_once_logged_and_counted(
    store: Store, lapse_lines: LapseLines
) -> None:
    book = _book(store)
    await _fund(book, "W-idle", 1_000, "p1")
    await _fund(book, "W-spender", 500, "p2")
    hold = await book.hold("W-spender", 200)
    assert hold is not None and await book.take(hold) is not None
    await _fund(_book(store, lapse_ms=60_000), "W-fresh", 70, "p3")
    counted = _lapsed_total()
    sweeper = CreditSweeper(store)

    early = await sweeper.sweep()
    await _until_due(store, 2)
    swept = await sweeper.sweep()
    again = await sweeper.sweep()

    assert (early, swept, again) == (0, 1_300, 0)
    assert _lapsed_total() - counted == 1_300
    assert sorted(lapse_lines()) == [
        ("W-idle", "1000"),
        ("W-spender", "300"),
    ]
    assert (await book.balance("W-idle")).balance == 0
    assert (await book.balance("W-fresh")).balance == 70
    # Their index entries stay until no credit registered before the visits can still be booked
    # (FORGET_AFTER_MS past their scores); a sweep past that drops them.
    assert set((await due_lapses(store, keys.credit_lapses(), 10)).wallets) == {"W-idle", "W-spender"}
    assert await CreditSweeper(store, forget_after_ms=0).sweep() == 0
    assert (await due_lapses(store, keys.credit_lapses(), 10)).wallets == {}


async def test_credit_past_its_lapse_is_never_spent_even_before_the_sweep(store: Store) -> None:
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    in_flight = await book.hold("W", 100)
    assert in_flight is not None
    await _until_due(store, 1)

    assert await book.hold("W", 1) is None
    assert await book.take(in_flight) is None
    balance = await book.balance("W")
    assert (balance.balance, balance.expires_at) == (0, 0)


async def test_a_top_up_before_the_lapse_moves_it_and_the_sweep_leaves_the_wallet(
    store: Store, lapse_lines: LapseLines
) -> None:
    # The second top-up must land before the first lapse: a second of margin for a loaded runner.
    book = _book(store, lapse_ms=1_000)
    await _fund(book, "W", 1_000, "p1")
    funded_at = time.monotonic()  # the first lapse is at most a second after this
    await _fund(_book(store, lapse_ms=60_000), "W", 10, "p2")
    await asyncio.sleep(max(0.0, funded_at + 1.05 - time.monotonic()))  # past the first lapse

    assert await CreditSweeper(store).sweep() == 0
    assert lapse_lines() == []
    assert (await book.balance("W")).balance == 1_010


async def test_a_top_up_after_the_lapse_but_before_the_sweep_gets_its_credit_and_the_lapse_is_counted(
    store: Store, lapse_lines: LapseLines
) -> None:
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    await _until_due(store, 1)
    await _fund(_book(store, lapse_ms=60_000), "W", 10, "p2")
    counted = _lapsed_total()

    swept = await CreditSweeper(store).sweep()

    assert swept == 1_000 and _lapsed_total() - counted == 1_000
    assert lapse_lines() == [("W", "1000")]
    assert (await book.balance("W")).balance == 10  # the lapsed credit never came back


async def test_a_sweep_lapses_at_most_its_batch_and_the_next_one_the_rest(store: Store) -> None:
    book = _book(store)
    for n in range(5):
        await _fund(book, f"W{n}", 10, f"p{n}")
    await _until_due(store, 5)
    sweeper = CreditSweeper(store, batch=3)

    assert [await sweeper.sweep() for _ in range(3)] == [30, 20, 0]


async def test_no_sweep_while_another_replica_holds_the_sweep(store: Store) -> None:
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    await _until_due(store, 1)
    assert await store.claim(keys.credit_sweep(), "another replica", 60_000)

    blocked = await CreditSweeper(store).sweep()
    assert await release(store, keys.credit_sweep(), "another replica")
    after = await CreditSweeper(store).sweep()

    assert (blocked, after) == (0, 1_000)
    assert await store.get(keys.credit_sweep()) is None  # a sweep frees its claim when done


async def test_replicas_racing_to_sweep_lapse_each_balance_once(
    clean_redis_url: str, lapse_lines: LapseLines
) -> None:
    """Many sweepers on one Redis, each with its own connections, as replicas have."""
    stores = [RedisStore(clean_redis_url) for _ in range(8)]
    try:
        book = _book(stores[0])
        for n in range(20):
            await _fund(book, f"W{n}", n + 1, f"p{n}")
        await _until_due(stores[0], 20)

        swept = await asyncio.gather(*(CreditSweeper(s).sweep() for s in stores))
        # A late sweep, or two sweeps that still overlapped, find nothing left to lapse.
        swept += await asyncio.gather(*(CreditSweeper(s).sweep() for s in stores))
    finally:
        for opened in stores:
            await opened.close()

    assert sum(swept) == sum(range(1, 21))
    assert sorted(lapse_lines()) == sorted((f"W{n}", str(n + 1)) for n in range(20))


async def test_the_apps_lifespan_runs_the_sweeper_only_while_credit_is_sold(clean_redis_url: str) -> None:
    settings = Settings(base_url="https://gw.example", credits_enabled=True, credit_lapse_ms=LAPSE_MS)
    store = RedisStore(clean_redis_url)
    services = Services(settings, [], store)
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    await _until_due(store, 1)
    checker = RedisStore(clean_redis_url)
    try:
        async with services.lifespan(object()):
            # The first sweep runs at start-up; a loaded runner may take seconds over it.
            lapse = await read_until(
                lambda: checker.get(keys.credit_lapse("W")),
                lambda lapse: lapse is None,
                time.monotonic() + 10,
            )
        assert lapse is None
        state = await credit_state(checker, credit_account("W"))
        assert (state.balance, state.held) == (0, 0)
        assert Services(Settings(base_url="https://gw.example"), [], MemoryStore()).credit_sweeper is None
    finally:
        await checker.close()


async def test_a_credit_registered_before_a_sweep_and_booked_after_its_visit_stays_indexed(
    store: Store, lapse_lines: LapseLines
) -> None:
    """The race between the index's steps and the wallet's: a top-up registers its wallet (due
    already: its old credit lapsed), the sweep visits and finds no credit left, then the top-up's
    booking lands. The sweep must not have dropped the wallet: its score is younger than any
    booking's deadline, so the new credit is still indexed, and counted when it lapses."""
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    await _until_due(store, 1)
    registered = await register_credits(store, book.credits("W", 10))  # the top-up's first step

    swept = await CreditSweeper(store).sweep()  # visits before the booking
    script_keys, args = claim_then_put_call([], [], registered)
    assert await store.run(CLAIM_THEN_PUT_SCRIPT, script_keys, args) == 0  # the booking, late
    indexed = (await due_lapses(store, keys.credit_lapses(), 10)).wallets

    assert swept == 1_000 and list(indexed) == ["W"]
    assert await CreditSweeper(store).sweep() == 0  # visits again: scores it at its lapse time
    await _until_due(store, 1)
    assert await CreditSweeper(store).sweep() == 10
    assert lapse_lines() == [("W", "1000"), ("W", "10")]


async def test_a_sweep_whose_index_fix_was_lost_is_redone_and_counts_nothing_twice(
    store: Store, lapse_lines: LapseLines
) -> None:
    book = _book(store)
    await _fund(book, "W", 1_000, "p1")
    await _until_due(store, 1)
    visit = await lapse_credit(store, credit_account("W"))  # a sweep that died before its fix
    counted = _lapsed_total()

    again = await CreditSweeper(store, forget_after_ms=0).sweep()

    assert visit.counted == 1_000 and again == 0 and _lapsed_total() == counted
    assert lapse_lines() == []
    assert (await due_lapses(store, keys.credit_lapses(), 10)).wallets == {}  # fixed: dropped
