"""Work over several hash tags, on every backend: one step per tag, and what a step that does
not admit the request takes back from the others.

A cluster runs a script only over keys of one slot, so a request whose keys are named on
several tags (a wallet's claim and buckets, its IP's buckets, a route's shared budget) is one
script per tag: the client's own steps at once, then each shared budget. These tests hold the
outcome to the one script's (what is found, refused or held, and what stays charged), and show
that nothing a step did survives a request the others did not admit. Each runs on memory,
Redis, Upstash and the 3-master cluster, whose slots the tags below spread over.
"""

from __future__ import annotations

from typing import cast

import pytest
from redis.crc import key_slot

from bench.store_ops import Counted
from gateway.store import (
    Bucket,
    CreditHoldOrder,
    CreditSessionSpend,
    Entry,
    Hold,
    SessionSpent,
    Store,
    StoreUnavailable,
)
from gateway.store.claims import claim_then_put
from gateway.store.credit import credit_state, open_credit_session, spend_credit_session
from gateway.store.holds import hold, unhold
from gateway.store.limits import check_then_limit, undo_claim
from tests import test_store_contract as contract
from tests.test_store_contract import SPEND, credit, top_up

make_store, store, upstash_started = contract.make_store, contract.store, contract._upstash_server_started

WALLET, CLIENT, BUDGET = "{wallet}", "{client}", "{budget}"
"""Three tags, as a wallet's, an IP's and a budget's keys have: on the cluster, three slots."""


def own(tag: str, name: str, limit: int = 1) -> Bucket:
    return Bucket(f"{tag}rl:{name}", limit, 60_000)


def budget(name: str = "scope", limit: int = 1) -> Bucket:
    return Bucket(f"{BUDGET}rl:{name}", limit, 60_000, shared=True)


def claim(tag: str, name: str = "claim") -> Entry:
    return Entry(f"{tag}{name}", "me", 60_000)


async def allowed(store: Store, bucket: Bucket) -> bool:
    """Charge ``bucket`` once more: whether it still had room."""
    return (await check_then_limit(store, [], [bucket])).decisions[0].allowed


def test_the_tags_here_are_on_different_slots() -> None:
    assert len({key_slot(tag.encode()) for tag in (WALLET, CLIENT, BUDGET)}) == 3


async def test_a_request_over_three_tags_is_admitted_and_charged_like_one_script(store: Store) -> None:
    buckets = [own(WALLET, "w"), own(CLIENT, "ip"), budget()]

    found = await check_then_limit(store, [f"{WALLET}claim"], buckets, [claim(WALLET)])

    assert found.written and found.values == [None]
    assert [d.allowed for d in found.decisions] == [True, True, True]
    assert await store.get(f"{WALLET}claim") == "me"
    assert [await allowed(store, bucket) for bucket in buckets] == [False, False, False]


async def test_a_key_found_on_one_tag_takes_back_the_claims_and_charges_of_the_others(store: Store) -> None:
    await store.put(f"{WALLET}claim", "earlier", 60_000)
    buckets = [own(WALLET, "w"), own(CLIENT, "ip"), budget()]

    found = await check_then_limit(
        store, [f"{WALLET}claim"], buckets, [claim(WALLET), claim(CLIENT, "record")]
    )

    assert not found.written and found.values == ["earlier"] and found.decisions == []
    assert await store.get(f"{CLIENT}record") is None  # written by its step, then taken back
    assert [await allowed(store, bucket) for bucket in buckets] == [True, True, True]  # none kept


async def test_an_own_refusal_keeps_the_charges_before_it_and_hands_back_those_after(store: Store) -> None:
    """The one script stops at the first refusal: what came before it stays charged, nothing
    after it is. The steps ran at once, so the client's IP step charged a later bucket: handed
    back, with the claim it wrote."""
    first, refusing, after = own(WALLET, "first"), own(WALLET, "refusing"), own(CLIENT, "after")
    assert await allowed(store, refusing)

    found = await check_then_limit(store, [], [first, refusing, after], [claim(CLIENT)])

    assert not found.written
    assert [d.allowed for d in found.decisions] == [True, False]
    assert await store.get(f"{CLIENT}claim") is None
    assert not await allowed(store, first)  # kept
    assert await allowed(store, after)  # handed back


async def test_a_shared_budget_is_charged_after_the_own_buckets_only(store: Store) -> None:
    """A client over its own limit never spends what others share: the budget's step is not run."""
    mine, shared = own(WALLET, "w"), budget()
    assert await allowed(store, mine)

    found = await check_then_limit(store, [], [mine, shared], [claim(WALLET)])

    assert [d.allowed for d in found.decisions] == [False]
    assert await allowed(store, shared)  # untouched: it still has its one request


async def test_a_refusal_by_the_budget_takes_back_the_claims_and_keeps_the_own_charges(store: Store) -> None:
    mine, shared = own(WALLET, "w", limit=2), budget()
    assert await allowed(store, shared)

    found = await check_then_limit(store, [f"{WALLET}claim"], [mine, shared], [claim(WALLET)])

    assert not found.written and [d.allowed for d in found.decisions] == [True, False]
    assert found.decisions[1].retry_after_ms > 0
    assert await store.get(f"{WALLET}claim") is None
    assert await allowed(store, mine) and not await allowed(store, mine)  # one of two kept charged


async def test_credit_that_does_not_cover_the_hold_takes_back_every_other_step(store: Store) -> None:
    await top_up(store, 5)
    order = CreditHoldOrder(SPEND, 10, "call", 60_000)
    ip = own(CLIENT, "ip")

    found = await check_then_limit(store, [], [ip], [claim(CLIENT)], hold=order)

    assert not found.written and found.decisions == [] and found.held is None
    assert await store.get(f"{CLIENT}claim") is None and await allowed(store, ip)
    assert (await credit_state(store, SPEND)).held == 0


async def test_a_hold_made_beside_a_refusal_is_dropped_again(store: Store) -> None:
    await top_up(store, 50)
    ip = own(CLIENT, "ip")
    assert await allowed(store, ip)

    found = await check_then_limit(store, [], [ip], hold=CreditHoldOrder(SPEND, 10, "call", 60_000))

    assert not found.written and [d.allowed for d in found.decisions] == [False]
    assert (await credit_state(store, SPEND)).held == 0


async def test_a_step_the_store_fails_takes_back_the_others_and_fails_closed(store: Store) -> None:
    """A bucket key holding something else (a hash) makes its step fail on the server: the request
    fails closed, and the claim the other step wrote is taken back."""
    broken = own(CLIENT, "broken")
    await hold(store, [Hold(broken.key, 1, 5)], "squatter", 60_000)  # a hash where a bucket goes

    with pytest.raises(StoreUnavailable):
        await check_then_limit(store, [], [own(WALLET, "w"), broken], [claim(WALLET)])

    assert await store.get(f"{WALLET}claim") is None
    assert await allowed(store, own(WALLET, "w"))


async def test_holds_over_several_tags_are_all_or_nothing(store: Store) -> None:
    a, b = Hold(f"{WALLET}in-flight", 1, 1), Hold(f"{CLIENT}in-flight", 1, 1)
    assert await hold(store, [b], "other", 60_000)

    assert not await hold(store, [a, b], "mine", 60_000)  # b is full: a's hold is dropped again

    assert await hold(store, [a], "third", 60_000)
    await unhold(store, [a.key, b.key], "third")
    await unhold(store, [b.key], "other")
    assert await hold(store, [a, b], "mine", 60_000)


async def test_puts_on_other_tags_are_written_only_once_the_claim_is_won(store: Store) -> None:
    won = [Entry(f"{CLIENT}cooling", "1", 60_000), Entry(f"{WALLET}record", "0", 60_000)]
    assert await claim_then_put(store, [claim(WALLET, "once")], won) == 1
    assert await store.get(f"{CLIENT}cooling") == "1" and await store.get(f"{WALLET}record") == "0"

    lost = [Entry(f"{CLIENT}again", "1", 60_000), Entry(f"{BUDGET}again", "1", 60_000)]
    assert await claim_then_put(store, [claim(WALLET, "once")], lost) == 0
    assert await store.get(f"{CLIENT}again") is None and await store.get(f"{BUDGET}again") is None


async def test_credit_on_another_tag_than_its_claim_is_refused_before_anything_is_written(
    store: Store,
) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        await claim_then_put(store, [claim(WALLET, "delivery")], [], [credit("spend", 10)])
    assert await store.get(f"{WALLET}delivery") is None
    assert (await credit_state(store, SPEND)).balance == 0


async def test_an_undo_over_several_tags_deletes_refunds_and_charges_each_on_its_own(store: Store) -> None:
    entry, refunded, debt = claim(WALLET), own(CLIENT, "shared"), budget("guard")
    await store.put(entry.key, entry.value, entry.ttl_ms)
    assert await allowed(store, refunded)

    await undo_claim(store, [entry], [refunded], [debt])

    assert await store.get(entry.key) is None
    assert await allowed(store, refunded)  # handed back
    assert not await allowed(store, debt)  # charged


async def test_a_session_spend_refused_on_another_tag_gives_its_hold_and_cap_back(store: Store) -> None:
    """The session, its cap and the credit are the wallet step; a budget refusing after it undoes it."""
    await top_up(store, 100)
    session = "{t}session:steps"  # on the tag of the wallet's credit keys (tests.test_store_contract)
    await open_credit_session(store, session, SPEND.wallet, 50, 60_000)
    shared = budget()
    assert await allowed(store, shared)

    found = await spend_credit_session(
        store, CreditSessionSpend(session, CreditHoldOrder(SPEND, 30, "call", 60_000)), [shared]
    )

    assert found.outcome is SessionSpent.LIMITED
    assert [d.allowed for d in found.decisions] == [False]
    assert (await credit_state(store, SPEND)).held == 0
    again = CreditSessionSpend(session, CreditHoldOrder(SPEND, 50, "next", 60_000))
    whole = await spend_credit_session(store, again, [])
    assert whole.outcome is SessionSpent.SPENT and whole.spent == 50  # the whole cap again


async def test_the_own_steps_go_at_once_and_each_budget_after_them(store: Store) -> None:
    """A request on a wallet, an IP and a budget: two round trips of three commands, the latency
    of one more trip than a single script, not of one per tag."""
    counted = Counted(store)
    buckets = [own(WALLET, "w", 5), own(CLIENT, "ip", 5), budget(limit=5)]

    found = await check_then_limit(cast(Store, counted), [f"{WALLET}claim"], buckets, [claim(WALLET)])

    assert found.written and (counted.trips, counted.commands) == (2, 3)
    again = Counted(store)
    replay = await check_then_limit(cast(Store, again), [f"{WALLET}claim"], buckets, [claim(WALLET)])
    assert not replay.written and replay.values == ["me"]
    # Found by the wallet's step: the IP's charge is handed back, the budget never asked.
    assert (again.trips, again.commands) == (2, 3)
    assert await allowed(store, buckets[2])  # the budget: one of five used, by the first request
