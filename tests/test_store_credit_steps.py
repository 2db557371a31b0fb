"""Prepaid credit in steps that each touch one slot: the lapse index (shared by every wallet) in
steps of its own, everything else on one wallet's keys, and what each lost step leaves.

On the real stores (memory, Redis, Upstash REST over Redis, the 3-master cluster). The cluster
test gives every wallet a hash tag of its own and the index another, as the sharded layout
will: a step that read two wallets', or a wallet's and the index's, keys would be refused there
(``CROSSSLOT``).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.crc import key_slot

from gateway.store import (
    Credit,
    CreditAccount,
    CreditHoldOrder,
    CreditSessionSpend,
    Entry,
    LedgerPosition,
    SessionSpent,
    Store,
    StoreUnavailable,
    open_store,
)
from gateway.store.claims import CLAIM_THEN_PUT_SCRIPT, claim_then_put, claim_then_put_call
from gateway.store.credit import (
    CREDIT_STEP_WINDOW_MS,
    DueLapses,
    WalletLapse,
    clock_from_reply,
    credit_state,
    due_from_reply,
    due_lapses,
    fix_lapse_index,
    hold_credit,
    lapse_credit,
    open_credit_session,
    refund_credit_session,
    register_credits,
    register_lapses,
    restore_credit,
    restore_credit_call,
    revoke_credit_session,
    spend_credit_session,
    take_credit,
    wallet_lapse_from_reply,
)
from tests import test_store_contract as contract
from tests.support.polling import read_until

INDEX = "{t}credit:lapses"


make_store, store, upstash_started = contract.make_store, contract.store, contract._upstash_server_started


def account(wallet: str) -> CreditAccount:
    base = f"{{t}}credit:{wallet}"
    return CreditAccount(wallet, base, f"{base}:holds", f"{base}:lapse", f"{base}:lapsed")


def credit(wallet: str, amount: int, lapse_ms: int = 60_000) -> Credit:
    return Credit(account(wallet), amount, lapse_ms, 60_000, INDEX)


async def scores(store: Store) -> dict[str, int]:
    """Every wallet the index lists as due now, with its score."""
    return (await due_lapses(store, INDEX, 100)).wallets


async def until_lapsed(store: Store, wallet: str) -> None:
    """Wait until the wallet's own lapse time has passed (its index score may pass a moment
    before: it was written a step before the booking)."""
    await read_until(
        lambda: credit_state(store, account(wallet)), lambda state: state.ttl_ms == 0, time.monotonic() + 0.5
    )


# --- the registration: the index before the credit -----------------------------------------------


async def test_a_registration_scores_the_earlier_time_never_before_now(store: Store) -> None:
    before = await register_lapses(store, INDEX, [("fresh", "in", 60_000)]) - CREDIT_STEP_WINDOW_MS
    await register_lapses(store, INDEX, [("fresh", "in", 120_000)])  # later: the score stays
    await register_lapses(store, INDEX, [("gone", "at", 1)])  # long past: due now, not before
    listed = await due_lapses(store, INDEX, 10)

    assert list(listed.wallets) == ["gone"] and before <= listed.wallets["gone"] <= listed.at_ms
    await register_lapses(store, INDEX, [("fresh", "in", 0)])
    assert set(await scores(store)) == {"gone", "fresh"}  # the earlier time won


async def test_a_due_wallet_registered_again_is_due_now_so_the_sweeper_sees_it_moved(store: Store) -> None:
    await register_lapses(store, INDEX, [("w", "in", 50)])
    listed = await read_until(lambda: scores(store), bool, time.monotonic() + 0.5)
    await asyncio.sleep(0.01)

    await register_lapses(store, INDEX, [("w", "in", 60_000)])

    assert (await scores(store))["w"] > listed["w"]  # still due, at the registration's time
    assert not await fix_lapse_index(store, INDEX, "w", listed["w"], None)  # so nothing drops it
    assert "w" in await scores(store)


def test_a_credit_is_never_booked_unregistered() -> None:
    with pytest.raises(ValueError, match="registered"):
        claim_then_put_call([], [], [credit("w", 5)])
    with pytest.raises(ValueError, match="registered"):
        restore_credit_call(account("w"), 5, 1, 1, None, None)


async def test_a_top_up_registers_its_wallet_no_later_than_its_lapse_time(store: Store) -> None:
    assert await claim_then_put(store, [Entry("{t}pay:1", "me", 60_000)], [], [credit("w", 5)]) == 1

    lapse_at = int(await store.get(account("w").lapse) or 0)
    registered = await register_lapses(store, INDEX, [("w", "in", 10**9)]) - CREDIT_STEP_WINDOW_MS

    assert registered < lapse_at <= registered + 60_000
    assert "w" not in await scores(store)  # indexed, not due


# --- the credit step's deadline ------------------------------------------------------------------


async def test_a_credit_step_past_its_registrations_deadline_books_nothing_and_claims_nothing(
    store: Store,
) -> None:
    """A booking that lands after the sweeper may have dropped its wallet from the index would
    leave credit unindexed: past its deadline it fails closed, as a store outage (the top-up
    stays pending and its retry registers afresh)."""
    late = await register_credits(store, [credit("late", 5)], window_ms=1)
    await asyncio.sleep(0.05)
    script_keys, args = claim_then_put_call([Entry("{t}pay:late", "me", 60_000)], [], late)

    with pytest.raises(StoreUnavailable):
        await store.run(CLAIM_THEN_PUT_SCRIPT, script_keys, args)

    assert await store.get("{t}pay:late") is None
    assert (await credit_state(store, account("late"))).balance == 0
    assert await claim_then_put(store, [Entry("{t}pay:late", "me", 60_000)], [], [credit("late", 5)]) == 1
    assert (await credit_state(store, account("late"))).balance == 5  # the retry books it once


# --- a lost step ---------------------------------------------------------------------------------


async def test_a_registration_whose_credit_step_was_lost_leaves_the_wallet_indexed_with_nothing(
    store: Store,
) -> None:
    """The process died between the steps: the index lists a wallet with no credit; the visit
    finds nothing to count and the index fix drops it (once no credit can still come)."""
    await register_credits(store, [credit("lost", 5, lapse_ms=50)])
    listed = await read_until(lambda: scores(store), bool, time.monotonic() + 0.5)

    visit = await lapse_credit(store, account("lost"))

    assert visit == WalletLapse(None, 0, None)
    assert await fix_lapse_index(store, INDEX, "lost", listed["lost"], None)
    assert await scores(store) == {}


async def test_a_visit_whose_index_fix_was_lost_counts_nothing_the_second_time(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("w", 40, lapse_ms=50)])
    await until_lapsed(store, "w")
    listed = await scores(store)

    first = await lapse_credit(store, account("w"))  # its fix never ran
    again = await lapse_credit(store, account("w"))

    assert (first.counted, again.counted) == (40, 0)
    assert await scores(store) == listed  # still listed: the next sweep visits and fixes it
    assert await fix_lapse_index(store, INDEX, "w", listed["w"], again.lapse_at_ms)
    assert await scores(store) == {}


async def test_a_top_up_that_finds_lapsed_credit_keeps_it_on_the_wallet_and_leaves_it_due(
    store: Store,
) -> None:
    await claim_then_put(store, [], [], [credit("w", 100, lapse_ms=50)])
    await until_lapsed(store, "w")

    await claim_then_put(store, [], [], [credit("w", 7)])

    assert (await credit_state(store, account("w"))).balance == 7
    assert await store.get(account("w").lapsed) == "100"
    assert "w" in await scores(store)  # the next sweep visits it and counts the 100
    visit = await lapse_credit(store, account("w"))
    assert (visit.lapsed, visit.found) == (None, 100) and visit.lapse_at_ms is not None
    assert await store.get(account("w").lapsed) is None


# --- one wallet's keys, each wallet its own tag --------------------------------------------------


def tagged(wallet: str) -> CreditAccount:
    """A wallet's credit keys under a tag of their own, as the sharded layout puts them."""
    base = f"{{w:{wallet}}}credit"
    return CreditAccount(wallet, base, f"{base}:holds", f"{base}:lapse", f"{base}:lapsed")


async def test_on_a_cluster_every_credit_step_runs_on_one_wallets_slot_or_the_index_alone(
    clean_cluster_url: str,
) -> None:
    index = "{lapses}credit"
    wallets = [f"W{n}" for n in range(6)]
    assert len({key_slot(tagged(w).balance.encode()) for w in wallets} | {key_slot(index.encode())}) > 3
    store = open_store(clean_cluster_url, None)
    try:
        for n, wallet in enumerate(wallets):
            mark = LedgerPosition(f"{{w:{wallet}}}mark", n + 1)
            top_up = Credit(tagged(wallet), 100, 60_000, 60_000, index, mark)
            assert await claim_then_put(store, [], [], [top_up]) == 0
        one = tagged("W0")
        held = await hold_credit(store, one, 30, "t1", 60_000)
        taken = await take_credit(store, one, "t1", 30, keep=[Entry("{w:W0}call:1", "answer", 60_000)])
        session = "{w:W0}session"
        await open_credit_session(store, session, "W0", 50, 60_000)
        spent = await spend_credit_session(
            store, CreditSessionSpend(session, CreditHoldOrder(one, 5, "s1", 60_000)), []
        )
        await refund_credit_session(store, session, one.holds, "s1", 5)
        revoked = await revoke_credit_session(store, session)
        await restore_credit(store, tagged("W1"), index, 77, int(time.time() * 1000) + 60_000, 120_000)
        await register_lapses(store, index, [("W2", "at", 1)])
        listed = await due_lapses(store, index, 10)
        visit = await lapse_credit(store, tagged("W2"))
        fixed = await fix_lapse_index(store, index, "W2", listed.wallets["W2"], visit.lapse_at_ms)
        states = [await credit_state(store, tagged(w)) for w in wallets]
    finally:
        await store.close()

    assert held is not None and taken is not None and taken.balance == 70
    assert spent.outcome is SessionSpent.SPENT and revoked is not None and revoked.spent == 0
    assert visit.counted == 0 and visit.lapse_at_ms is not None and fixed
    assert [state.balance for state in states] == [70, 77, 100, 100, 100, 100]


# --- replies of the wrong shape ------------------------------------------------------------------


@pytest.mark.parametrize("reply", [None, "x", ["", "0"], ["", "x", ""], [1, "0", ""], ["", "", ""]])
def test_a_visit_answered_with_garbage_fails_closed(reply: object) -> None:
    with pytest.raises(StoreUnavailable):
        wallet_lapse_from_reply(reply)


@pytest.mark.parametrize("reply", [None, [1], ["1", []], [1, ["w"]], [1, ["w", "soon"]], 7])
def test_a_listing_answered_with_garbage_fails_closed(reply: object) -> None:
    with pytest.raises(StoreUnavailable):
        due_from_reply(reply)


@pytest.mark.parametrize("reply", [None, "1", 0, True, [1]])
def test_a_registration_answered_with_garbage_fails_closed(reply: object) -> None:
    with pytest.raises(StoreUnavailable):
        clock_from_reply(reply)


def test_replies_of_the_right_shape_read_as_what_they_say() -> None:
    assert wallet_lapse_from_reply(["12", "3", ""]) == WalletLapse(12, 3, None)
    assert wallet_lapse_from_reply(["", "0", "1790000000000"]).lapse_at_ms == 1_790_000_000_000
    assert due_from_reply([5, ["a", "3", "b", "4"]]) == DueLapses(5, {"a": 3, "b": 4})
    assert clock_from_reply(1_790_000_000_000) == 1_790_000_000_000
