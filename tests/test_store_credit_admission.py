"""A credit hold made in the same atomic step as a check-then-limit, on every backend.

A call paid from prepaid credit spends one store round trip before its provider: the sign-in's
nonce unused, the wallet's free credit covering the price, the route's buckets allowing it, and
only then the nonce used and the price held. What it refuses, it refuses whole: a replayed
nonce holds nothing, credit that does not cover the price charges no bucket and uses no nonce,
and a refusing bucket leaves no hold behind.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import Bucket, CreditHoldOrder, Entry, Store, StoreUnavailable
from gateway.store.credit import credit_state, take_credit
from gateway.store.holds import unhold
from gateway.store.limits import check_then_limit, check_then_limit_call, lookup_from_reply
from tests import test_store_contract as contract
from tests.support.polling import Stopwatch
from tests.test_store_contract import SPEND, top_up

# Every backend, opened as the store contract opens it.
make_store, store, upstash_started = contract.make_store, contract.store, contract._upstash_server_started

NONCE = "{t}nonce:1"


def order(amount: int, token: str = "call", ttl_ms: int = 60_000) -> CreditHoldOrder:
    return CreditHoldOrder(SPEND, amount, token, ttl_ms)


def claim(key: str = NONCE) -> list[Entry]:
    return [Entry(key, "wallet", 60_000)]


async def test_the_hold_is_made_with_the_puts_when_every_check_passes(store: Store) -> None:
    await top_up(store, 100)
    watch = Stopwatch()

    found = await check_then_limit(store, [NONCE], [Bucket("{t}b", 5, 60_000)], claim(), order(30))

    assert found.written and found.values == [None]
    assert found.held is not None and (found.held.balance, found.held.held) == (100, 30)
    assert await store.get(NONCE) == "wallet"
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (100, 30)
    assert found.held.at_us > 0 and 60_000 - watch.margin_ms() < found.held.ttl_ms <= 60_000


async def test_a_used_key_holds_nothing_and_charges_nothing(store: Store) -> None:
    await top_up(store, 100)
    await store.put(NONCE, "used", 60_000)
    tight = Bucket("{t}tight", 1, 60_000)

    found = await check_then_limit(store, [NONCE], [tight], claim(), order(30))

    assert (found.values, found.decisions, found.written, found.held) == (["used"], [], False, None)
    assert (await credit_state(store, SPEND)).held == 0
    assert (await check_then_limit(store, [], [tight])).refused is None  # its one request unspent


async def test_credit_that_does_not_cover_the_hold_charges_no_bucket_and_uses_no_key(store: Store) -> None:
    await top_up(store, 10)
    tight = Bucket("{t}tight", 1, 60_000)

    short = [await check_then_limit(store, [NONCE], [tight], claim(), order(11)) for _ in range(5)]

    assert all((s.written, s.decisions, s.held) == (False, [], None) for s in short)
    assert await store.get(NONCE) is None
    assert (await credit_state(store, SPEND)).held == 0
    covered = await check_then_limit(store, [NONCE], [tight], claim(), order(10))
    assert covered.written and covered.held is not None and covered.held.held == 10


async def test_a_refusing_bucket_leaves_no_hold_and_keeps_the_key_unused(store: Store) -> None:
    await top_up(store, 100)
    tight = Bucket("{t}tight", 1, 60_000)
    assert (await check_then_limit(store, [], [tight])).refused is None  # spent by someone else

    limited = await check_then_limit(store, [NONCE], [tight], claim(), order(30))

    assert not limited.written and limited.held is None and limited.refused is not None
    assert await store.get(NONCE) is None
    assert (await credit_state(store, SPEND)).held == 0


async def test_exactly_the_balance_of_many_concurrent_admissions_is_held(store: Store) -> None:
    await top_up(store, 100)

    found = await asyncio.gather(
        *(
            check_then_limit(store, [f"{{t}}nonce:{n}"], [], claim(f"{{t}}nonce:{n}"), order(10, f"t{n}"))
            for n in range(100)
        )
    )

    won = [f for f in found if f.written]
    assert len(won) == 10 and all(f.held is not None for f in won)
    assert sorted(f.held.held for f in won if f.held is not None) == list(range(10, 101, 10))
    used = [await store.get(f"{{t}}nonce:{n}") for n in range(100)]
    assert sum(value is not None for value in used) == 10
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (100, 100)


async def test_a_hold_made_with_a_check_is_taken_and_released_like_any_other(store: Store) -> None:
    await top_up(store, 100)
    first = await check_then_limit(store, [NONCE], [], claim(), order(30, "first"))
    second = await check_then_limit(store, ["{t}nonce:2"], [], claim("{t}nonce:2"), order(50, "second"))
    assert first.held is not None and second.held is not None

    taken = await take_credit(store, SPEND, "first", 30)
    await unhold(store, [SPEND.holds], "second")

    assert taken is not None and (taken.balance, taken.held) == (70, 50)
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (70, 0)


def test_a_reply_without_the_credit_state_of_an_ordered_hold_is_garbage() -> None:
    made = [[], [], 1, ["100", 30, 60_000, 1]]

    assert lookup_from_reply([], made, hold_ordered=True).held is not None
    with pytest.raises(StoreUnavailable):
        lookup_from_reply([], made[:3], hold_ordered=True)  # written, but no state: no hold known
    with pytest.raises(StoreUnavailable):
        lookup_from_reply([], made)  # a state nobody ordered
    assert lookup_from_reply([], [[], [], 0], hold_ordered=True).held is None


def test_the_hold_goes_last_in_the_script_call() -> None:
    hold = order(7, "tok", 5_000)
    keys, args = check_then_limit_call(["k"], [Bucket("b", 2, 1_000)], claim("k"), hold=hold)

    assert keys == ["k", "b", "k", SPEND.balance, SPEND.holds, SPEND.lapse]
    assert args == ["1", "1", "", "1", "2", "1000", "0", "wallet", "60000", "tok", "7", "5000"]
