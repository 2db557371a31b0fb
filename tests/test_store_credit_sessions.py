"""Credit sessions in the store, on every backend (memory, Redis, Upstash REST over Redis).

A session call spends one store round trip before its provider: the session live and the
wallet's, its signed cap less what it spent covering the price, the wallet's free credit
covering it, the route's buckets allowing it, and only then the session's spent total grown and
the price held. What it refuses, it refuses whole; concurrent calls on one session never spend
more than its cap; a revoked or expired session spends nothing; a session never spends another
wallet's credit.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.store import (
    Bucket,
    CreditHoldOrder,
    CreditSessionSpend,
    CreditSessionState,
    SessionSpent,
    Store,
    StoreUnavailable,
)
from gateway.store.credit import (
    credit_state,
    open_credit_session,
    refund_credit_session,
    revoke_credit_session,
    session_lookup_from_reply,
    session_state_from_reply,
    spend_credit_session,
    take_credit,
)
from tests import test_store_contract as contract
from tests.test_store_contract import SPEND, account, top_up

make_store, store, upstash_started = contract.make_store, contract.store, contract._upstash_server_started

SESSION = "{t}session:1"
OTHER = account("other")


def spend(
    amount: int, token: str = "call", session: str = SESSION, wallet: str = "spend"
) -> CreditSessionSpend:
    return CreditSessionSpend(session, CreditHoldOrder(account(wallet), amount, token, 60_000))


async def test_a_call_on_a_session_holds_its_price_and_counts_it_against_the_cap(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 50, 60_000)

    found = await spend_credit_session(store, spend(30), [Bucket("{t}b", 5, 60_000)])

    assert found.outcome is SessionSpent.SPENT
    assert (found.spent, found.cap) == (30, 50)
    assert [d.allowed for d in found.decisions] == [True]
    assert found.held is not None and (found.held.balance, found.held.held) == (100, 30)
    assert (await credit_state(store, SPEND)).held == 30
    refused = await spend_credit_session(store, spend(21, "next"), [])
    assert (refused.outcome, refused.spent, refused.cap) == (SessionSpent.CAP, 30, 50)
    assert (await credit_state(store, SPEND)).held == 30


async def test_every_refusal_spends_nothing(store: Store) -> None:
    await top_up(store, 10)
    await open_credit_session(store, SESSION, "spend", 1_000, 60_000)
    bucket = Bucket("{t}one", 1, 60_000)

    unknown = await spend_credit_session(store, spend(5, session="{t}never-opened"), [bucket])
    uncovered = await spend_credit_session(store, spend(11), [bucket])
    first = await spend_credit_session(store, spend(5, "a"), [bucket])
    limited = await spend_credit_session(store, spend(5, "b"), [bucket])

    assert unknown.outcome is SessionSpent.UNKNOWN and unknown.decisions == []
    assert uncovered.outcome is SessionSpent.UNCOVERED and uncovered.decisions == []
    assert first.outcome is SessionSpent.SPENT
    assert limited.outcome is SessionSpent.LIMITED and not limited.decisions[-1].allowed
    assert limited.decisions[-1].retry_after_ms > 0
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (10, 5)
    revoked = await revoke_credit_session(store, SESSION)
    assert revoked == CreditSessionState("spend", 1_000, 5)


async def test_concurrent_calls_on_one_session_never_spend_more_than_its_cap(store: Store) -> None:
    await top_up(store, 1_000)
    await open_credit_session(store, SESSION, "spend", 47, 60_000)

    results = await asyncio.gather(*(spend_credit_session(store, spend(5, f"t{n}"), []) for n in range(50)))

    won = [found for found in results if found.outcome is SessionSpent.SPENT]
    assert len(won) == 9
    assert sorted(found.spent for found in won) == list(range(5, 46, 5))
    assert all(found.outcome is SessionSpent.CAP for found in results if found not in won)
    assert (await credit_state(store, SPEND)).held == 45


async def test_concurrent_calls_never_hold_more_than_the_balance_whatever_the_cap(store: Store) -> None:
    await top_up(store, 20)
    await open_credit_session(store, SESSION, "spend", 1_000, 60_000)

    results = await asyncio.gather(*(spend_credit_session(store, spend(5, f"t{n}"), []) for n in range(30)))

    assert sum(found.outcome is SessionSpent.SPENT for found in results) == 4
    assert (await revoke_credit_session(store, SESSION)) == CreditSessionState("spend", 1_000, 20)


async def test_a_revoked_session_spends_nothing_and_its_revocation_says_what_it_spent(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 50, 60_000)
    assert (await spend_credit_session(store, spend(7), [])).outcome is SessionSpent.SPENT

    revoked = await revoke_credit_session(store, SESSION)
    after = await spend_credit_session(store, spend(7, "after"), [])

    assert revoked == CreditSessionState("spend", 50, 7)
    assert after.outcome is SessionSpent.UNKNOWN
    assert await revoke_credit_session(store, SESSION) is None
    assert (await credit_state(store, SPEND)).held == 7


async def test_an_expired_session_spends_nothing(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 50, 200)
    opened = time.monotonic()
    assert (await spend_credit_session(store, spend(5), [])).outcome is SessionSpent.SPENT

    await asyncio.sleep(max(0.0, opened + 0.3 - time.monotonic()))

    assert (await spend_credit_session(store, spend(5, "late"), [])).outcome is SessionSpent.UNKNOWN
    assert await revoke_credit_session(store, SESSION) is None


async def test_a_session_of_one_wallet_never_spends_anothers_credit(store: Store) -> None:
    await top_up(store, 100, "other")
    await open_credit_session(store, SESSION, "spend", 50, 60_000)

    found = await spend_credit_session(store, spend(5, wallet="other"), [])

    assert found.outcome is SessionSpent.UNKNOWN
    state = await credit_state(store, OTHER)
    assert (state.balance, state.held) == (100, 0)


async def test_a_refund_drops_the_hold_and_gives_the_cap_back(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 10, 60_000)
    assert (await spend_credit_session(store, spend(10, "failed"), [])).outcome is SessionSpent.SPENT
    assert (await spend_credit_session(store, spend(1, "next"), [])).outcome is SessionSpent.CAP

    await refund_credit_session(store, SESSION, SPEND.holds, "failed", 10)

    assert (await credit_state(store, SPEND)).held == 0
    again = await spend_credit_session(store, spend(10, "again"), [])
    assert (again.outcome, again.spent) == (SessionSpent.SPENT, 10)


async def test_a_refund_after_the_revocation_drops_the_hold_and_revives_nothing(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 10, 60_000)
    assert (await spend_credit_session(store, spend(10, "in-flight"), [])).outcome is SessionSpent.SPENT
    assert await revoke_credit_session(store, SESSION) == CreditSessionState("spend", 10, 10)

    await refund_credit_session(store, SESSION, SPEND.holds, "in-flight", 10)

    assert (await credit_state(store, SPEND)).held == 0
    assert (await spend_credit_session(store, spend(1, "after"), [])).outcome is SessionSpent.UNKNOWN
    assert await revoke_credit_session(store, SESSION) is None


async def test_a_held_session_call_is_taken_like_any_credit_hold(store: Store) -> None:
    await top_up(store, 100)
    await open_credit_session(store, SESSION, "spend", 50, 60_000)
    assert (await spend_credit_session(store, spend(30, "served"), [])).outcome is SessionSpent.SPENT

    taken = await take_credit(store, SPEND, "served", 30)

    assert taken is not None and (taken.balance, taken.held) == (70, 0)
    assert await revoke_credit_session(store, SESSION) == CreditSessionState("spend", 50, 30)


async def test_a_lapsed_balance_covers_no_session_call(store: Store) -> None:
    await top_up(store, 100, lapse_ms=150)
    await open_credit_session(store, SESSION, "spend", 50, 60_000)
    await asyncio.sleep(0.3)

    found = await spend_credit_session(store, spend(5), [])

    assert found.outcome is SessionSpent.UNCOVERED


@pytest.mark.parametrize(
    "reply",
    [None, [], ["spent"], ["cap", "x", "1"], ["limited", "0"], [1], ["spent", [], [1, 2], 3, "4"], "unknown"],
)
def test_a_spend_reply_of_the_wrong_shape_is_an_outage(reply: object) -> None:
    with pytest.raises(StoreUnavailable):
        session_lookup_from_reply(reply)


def test_a_revoke_reply_of_the_wrong_shape_is_an_outage() -> None:
    assert session_state_from_reply(None) is None
    for reply in ([], ["w", "1"], ["w", "x", "1"], 7):
        with pytest.raises(StoreUnavailable):
            session_state_from_reply(reply)
