"""The store contract, run against every backend: in-process memory, Redis, Upstash REST over Redis.

Payments fail closed on these semantics (one claim wins, limits are exact across processes, an
unreachable store raises StoreUnavailable), so each backend must behave the same.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.store import (
    Bucket,
    Credit,
    CreditAccount,
    CreditState,
    Entry,
    Hold,
    LedgerPosition,
    RateDecision,
    Share,
    Store,
    StoreUnavailable,
    TakeTooLate,
    keys,
    open_store,
)
from gateway.store.base import taken_mark
from gateway.store.claims import CLAIM_THEN_PUT_SCRIPT, claim_then_put, claim_then_put_call, release
from gateway.store.cluster import RedisClusterStore
from gateway.store.credit import (
    WalletLapse,
    credit_state,
    due_lapses,
    fix_lapse_index,
    hold_credit,
    lapse_credit,
    register_lapses,
    restore_credit,
    take_credit,
)
from gateway.store.holds import hold, unhold
from gateway.store.limits import CHECK_THEN_LIMIT_SCRIPT, check_then_limit, check_then_limit_call, undo_claim
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.store.upstash import UpstashStore
from tests.support.polling import Stopwatch, read_until
from tests.support.ports import refusing_port
from tests.support.redis_cluster import move_slot, start_redis_cluster

StoreFactory = Callable[[], Store]

LOADED_TIMEOUT_S = 10.0
"""The backends' timeout in the tests of what they decide (not of how they time out): a call
that waits on 40 others in a loaded machine's event loop may take longer than the 2 s default."""


@pytest.fixture(autouse=True)
def _upstash_server_started(upstash_url_and_token: tuple[str, str]) -> None:
    """Start the session's Upstash REST server as an ordinary fixture dependency: pulled lazily
    (getfixturevalue) by the first upstash-parametrized test a worker runs, its async set-up could
    land inside the running event loop, depending on how tests are handed out."""


@pytest.fixture(params=["memory", "redis", "upstash", "cluster"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    """How to open the backend under test, on an empty database (sync, so it can pull fixtures)."""
    if request.param == "memory":
        return MemoryStore
    if request.param == "cluster":
        cluster_url: str = request.getfixturevalue("clean_cluster_url")
        return lambda: RedisClusterStore(cluster_url, timeout_s=LOADED_TIMEOUT_S)
    redis_url: str = request.getfixturevalue("clean_redis_url")
    if request.param == "redis":
        return lambda: RedisStore(redis_url, timeout_s=LOADED_TIMEOUT_S)
    url, token = request.getfixturevalue("upstash_url_and_token")
    return lambda: UpstashStore(url, token, timeout_s=LOADED_TIMEOUT_S)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[Store]:
    opened = make_store()
    # Connected (a cluster client has learnt the slots) before a test times anything: a first
    # command that also connects can take longer than a timed test's margin on a loaded machine.
    assert await opened.ping()
    yield opened
    await opened.close()


@pytest.fixture
async def raw_redis(clean_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client on the same server, to look at what the backends stored."""
    client = aioredis.Redis.from_url(clean_redis_url, decode_responses=True)
    yield client
    await client.aclose()


# --- claim ---------------------------------------------------------------------------------------


async def test_exactly_one_of_many_concurrent_claims_wins(store: Store) -> None:
    results = await asyncio.gather(*(store.claim("{t}claim:tx", f"caller-{i}", 10_000) for i in range(25)))

    assert results.count(True) == 1
    winner = results.index(True)
    assert await store.get("{t}claim:tx") == f"caller-{winner}"


async def test_claim_can_be_taken_again_after_its_ttl(store: Store) -> None:
    assert await store.claim("{t}claim:ttl", "first", 150)
    assert not await store.claim("{t}claim:ttl", "second", 150)

    third = await read_until(lambda: store.claim("{t}claim:ttl", "third", 150), bool, time.monotonic() + 0.25)

    assert third
    assert await store.get("{t}claim:ttl") == "third"


async def test_release_by_the_holder_frees_the_lock(store: Store) -> None:
    assert await store.claim("{t}lock:a", "holder", 10_000)

    assert await release(store, "{t}lock:a", "holder")

    assert await store.get("{t}lock:a") is None
    assert await store.claim("{t}lock:a", "next", 10_000)


async def test_release_by_a_former_holder_leaves_the_new_holders_lock(store: Store) -> None:
    """The first holder's lock expired and another settlement took it: the late release of the
    first must not let a third one in beside the second."""
    assert await store.claim("{t}lock:b", "first", 100)
    assert await read_until(lambda: store.claim("{t}lock:b", "second", 10_000), bool, time.monotonic() + 0.15)

    assert not await release(store, "{t}lock:b", "first")

    assert await store.get("{t}lock:b") == "second"
    assert not await store.claim("{t}lock:b", "third", 10_000)


async def test_release_of_an_absent_lock_changes_nothing(store: Store) -> None:
    assert not await release(store, "{t}lock:none", "anyone")

    assert await store.get("{t}lock:none") is None


# --- get / put -----------------------------------------------------------------------------------


async def test_get_of_an_absent_key_is_none(store: Store) -> None:
    assert await store.get("{t}value:absent") is None


async def test_put_overwrites_and_expires_after_its_ttl(store: Store) -> None:
    await store.put("{t}value:k", "one", 10_000)
    await store.put("{t}value:k", "two", 150)
    assert await store.get("{t}value:k") == "two"

    expired = await read_until(
        lambda: store.get("{t}value:k"), lambda value: value is None, time.monotonic() + 0.25
    )

    assert expired is None


# --- counters ------------------------------------------------------------------------------------


async def test_incr_adds_every_delta_and_counters_read_absent_ones_as_zero(store: Store) -> None:
    assert await store.incr({"count:paid": 1}) == {"count:paid": 1}
    assert await store.incr({"count:paid": 5, "count:failed": 1}) == {"count:paid": 6, "count:failed": 1}
    assert await store.incr({}) == {}

    assert await store.counters(["count:paid", "count:failed", "count:unpaid"]) == {
        "count:paid": 6,
        "count:failed": 1,
        "count:unpaid": 0,
    }
    assert await store.counters([]) == {}


async def test_concurrent_increments_are_all_counted(store: Store) -> None:
    await asyncio.gather(*(store.incr({"count:concurrent": 1, "count:other": 2}) for _ in range(50)))

    totals = await store.counters(["count:concurrent", "count:other"])
    assert totals == {"count:concurrent": 50, "count:other": 100}


# --- rate limit ----------------------------------------------------------------------------------


async def limit_once(store: Store, key: str, limit: int, period_ms: int) -> RateDecision:
    """One GCRA decision on one bucket, as the rate limiter asks for it (nothing checked first)."""
    (decision,) = (await check_then_limit(store, [], [Bucket(key, limit, period_ms)])).decisions
    return decision


async def test_rate_limit_allows_exactly_limit_in_a_burst_then_refuses(store: Store) -> None:
    watch = Stopwatch()
    decisions = [await limit_once(store, "{t}rl:burst", 5, 60_000) for _ in range(7)]

    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    # The next slot opens one emission interval (60 s / 5) after the first request, give or take
    # the time the burst took.
    for refused in decisions[5:]:
        assert 12_000 - watch.margin_ms() < refused.retry_after_ms <= 12_000


async def test_rate_limit_allows_exactly_limit_of_a_concurrent_burst(store: Store) -> None:
    decisions = await asyncio.gather(*(limit_once(store, "{t}rl:gather", 8, 60_000) for _ in range(40)))

    assert sum(d.allowed for d in decisions) == 8


REFILL_PERIODS_MS = (1_000, 6_000)
"""Periods of a bucket of 2, shortest first, for the refill test: it takes the next only when a
step that had to fall within one emission interval (500 ms, then 3 s) did not, on a runner
stalled for longer than that (as :data:`LIVE_FOR_MS` does for lifetimes)."""


@pytest.mark.slow
async def test_rate_limit_refills_one_slot_per_interval_and_all_after_the_period(store: Store) -> None:
    limit = 2
    for period_ms in REFILL_PERIODS_MS:
        key, interval_ms = f"{{t}}rl:refill:{period_ms}", period_ms // limit
        watch = Stopwatch()
        burst = [await limit_once(store, key, limit, period_ms) for _ in range(limit)]
        refused_at = Stopwatch()
        burst.append(await limit_once(store, key, limit, period_ms))
        on_time = [watch.margin_ms(0) < interval_ms]  # no slot came back during the burst

        await asyncio.sleep(burst[-1].retry_after_ms / 1000 + 0.03)
        refilled = [await limit_once(store, key, limit, period_ms) for _ in range(2)]
        # ... and only the one slot by the end of these two: less than an interval after it
        on_time.append(refused_at.margin_ms(0) < burst[-1].retry_after_ms + interval_ms)

        await asyncio.sleep(period_ms / 1000 + 0.03)
        watch = Stopwatch()
        after = [await limit_once(store, key, limit, period_ms) for _ in range(limit + 1)]
        on_time.append(watch.margin_ms(0) < interval_ms)
        if all(on_time):
            break

    assert [d.allowed for d in burst] == [True] * limit + [False]
    assert 0 < burst[-1].retry_after_ms <= interval_ms
    assert [d.allowed for d in refilled] == [True, False]  # one slot back after one interval
    assert [d.allowed for d in after] == [True] * limit + [False]  # all of them after the period


async def test_rate_limit_keys_are_independent(store: Store) -> None:
    assert (await limit_once(store, "{t}rl:wallet-a", 1, 60_000)).allowed
    assert not (await limit_once(store, "{t}rl:wallet-a", 1, 60_000)).allowed

    assert (await limit_once(store, "{t}rl:wallet-b", 1, 60_000)).allowed


# --- shares: a subject's part of a budget, binding only while others wait for it ------------------

SHARE_MARK = "{t}rl-contended:share"


async def ask_shared(
    store: Store, subject: str, budget: Bucket, share_limit: int, share_period_ms: int = 60_000
) -> tuple[int | None, RateDecision]:
    """One request of ``subject``: its share of ``budget``, then ``budget``. The index of the
    bucket that refused it (0: its share, 1: the budget; None: allowed) and that decision."""
    share = Bucket(
        f"{{t}}rl:share:{subject}", share_limit, share_period_ms, share=Share(budget.key, SHARE_MARK)
    )
    decisions = (await check_then_limit(store, [], [share, budget])).decisions
    for at, decision in enumerate(decisions):
        if not decision.allowed:
            return at, decision
    assert len(decisions) == 2
    return None, decisions[-1]


async def test_a_lone_subject_may_use_all_of_the_budget_its_share_is_part_of(store: Store) -> None:
    budget = Bucket("{t}rl:key", 4, 60_000)
    watch = Stopwatch()

    asks = [await ask_shared(store, "alone", budget, 1) for _ in range(6)]

    assert [at for at, _ in asks] == [None] * 4 + [1, 1]  # its own refusals never bind its share
    assert all(15_000 - watch.margin_ms() < d.retry_after_ms <= 15_000 for _, d in asks[4:])


async def test_once_another_subject_waits_for_the_budget_the_shares_bind(store: Store) -> None:
    # A slot every second (wide: the asks below must fall within one slot on a loaded
    # machine too); each share 1 a minute.
    budget = Bucket("{t}rl:key", 4, 4_000)
    for _ in range(4):
        assert (await ask_shared(store, "busy", budget, 1))[0] is None

    waiting, refused = await ask_shared(store, "waiting", budget, 1)
    watch = Stopwatch()
    busy, bound = await ask_shared(store, "busy", budget, 1)
    assert waiting == 1 and 0 < refused.retry_after_ms <= 1_000
    assert busy == 0 and 60_000 - watch.margin_ms() < bound.retry_after_ms <= 60_000  # its share is used up

    # The waiting subject's refusals spent none of its share: it is served at the next slot,
    # which its busy rival, bound by its share, cannot take.
    served = await read_until(
        lambda: ask_shared(store, "waiting", budget, 1),
        lambda r: r[0] is None,
        time.monotonic() + refused.retry_after_ms / 1000 + 0.05,
    )
    assert served[0] is None
    assert (await ask_shared(store, "busy", budget, 1))[0] == 0
    # Only the waiting subject itself was refused by the budget: its own share does not bind.
    assert (await ask_shared(store, "waiting", budget, 1))[0] == 1


@pytest.mark.slow
async def test_the_contention_mark_expires_after_the_budgets_period(store: Store) -> None:
    budget = Bucket("{t}rl:key", 2, 2_000)  # a slot a second: wide enough for a loaded machine
    for _ in range(2):
        assert (await ask_shared(store, "busy", budget, 1))[0] is None
    assert (await ask_shared(store, "waiting", budget, 1))[0] == 1
    marked = time.monotonic()
    assert (await ask_shared(store, "busy", budget, 1))[0] == 0

    # Nobody else refused for a period of the budget: the busy subject is alone again and may
    # use all of it, though its share (1 a minute) is long used up.
    unbound = await read_until(
        lambda: ask_shared(store, "busy", budget, 1), lambda r: r[0] is None, marked + 2.05
    )
    assert unbound[0] is None
    assert (await ask_shared(store, "busy", budget, 1))[0] is None
    assert (await ask_shared(store, "busy", budget, 1))[0] == 1


async def test_a_subjects_own_refusals_never_lift_the_binding_another_put_on_it(store: Store) -> None:
    """The mark keeps the latest two distinct subjects refused, so a flooder that gets itself
    refused over and over cannot push out the client that waits."""
    budget = Bucket("{t}rl:key", 2, 3_000)  # a slot every 1.5 s
    for _ in range(2):
        assert (await ask_shared(store, "third", budget, 1))[0] is None
    assert (await ask_shared(store, "waiting", budget, 1))[0] == 1
    marked = time.monotonic()
    for _ in range(3):  # within its share, so the budget refuses it: the mark names it too
        assert (await ask_shared(store, "flooder", budget, 1))[0] == 1

    served = await read_until(
        lambda: ask_shared(store, "flooder", budget, 1), lambda r: r[0] is None, marked + 1.6
    )
    assert served[0] is None and time.monotonic() - marked < 3.0
    assert (await ask_shared(store, "flooder", budget, 1))[0] == 0  # bound: its share is used


async def test_a_share_whose_budget_is_not_a_later_bucket_is_refused(store: Store) -> None:
    budget = Bucket("{t}rl:key", 2, 60_000)
    share = Bucket("{t}rl:share:x", 1, 60_000, share=Share(budget.key, SHARE_MARK))
    with pytest.raises(ValueError, match="budget"):
        await check_then_limit(store, [], [budget, share])
    with pytest.raises(ValueError, match="budget"):
        await check_then_limit(store, [], [share])


# --- guards, refunds and debts: what a refused payment spends ---------------------------------------


async def test_a_guard_bucket_refuses_when_exhausted_but_never_charges(store: Store) -> None:
    guard = Bucket("{t}rl:guard", 2, 60_000, guard=True)
    watch = Stopwatch()
    for _ in range(5):  # checked five times, charged never
        assert (await check_then_limit(store, [], [guard])).decisions == [RateDecision(allowed=True)]
    await undo_claim(store, [], debts=[Bucket("{t}rl:guard", 2, 60_000)] * 2)

    refused = (await check_then_limit(store, [], [guard])).decisions[0]

    assert not refused.allowed and 30_000 - watch.margin_ms() < refused.retry_after_ms <= 30_000


async def test_a_refused_guard_stops_the_buckets_after_it(store: Store) -> None:
    await undo_claim(store, [], debts=[Bucket("{t}rl:refusals", 1, 60_000)])
    shared = Bucket("{t}rl:shared-after-guard", 1, 60_000)

    found = await check_then_limit(
        store,
        [],
        [Bucket("{t}rl:refusals", 1, 60_000, guard=True), shared],
        [Entry("{t}claim:g", "me", 60_000)],
    )

    assert [d.allowed for d in found.decisions] == [False] and not found.written
    assert (await limit_once(store, shared.key, 1, 60_000)).allowed  # nothing shared was spent


async def test_a_debt_is_charged_past_the_limit_and_waits_it_out(store: Store) -> None:
    watch = Stopwatch()
    await undo_claim(store, [], debts=[Bucket("{t}rl:debt", 2, 10_000)] * 5)  # 5 charges, 2 per 10 s

    refused = await limit_once(store, "{t}rl:debt", 2, 10_000)

    # Five intervals of 5 s are owed; one more charge fits once 6 intervals less the period
    # (10 s) have passed: 20 s, less the time the steps took.
    assert not refused.allowed and 20_000 - watch.margin_ms() < refused.retry_after_ms <= 20_000


async def test_a_refund_hands_back_one_request_and_never_goes_below_idle(store: Store) -> None:
    bucket = Bucket("{t}rl:refund", 2, 60_000)
    assert (await limit_once(store, bucket.key, 2, 60_000)).allowed
    assert (await limit_once(store, bucket.key, 2, 60_000)).allowed
    assert not (await limit_once(store, bucket.key, 2, 60_000)).allowed

    await undo_claim(store, [], refunds=[bucket])
    assert (await limit_once(store, bucket.key, 2, 60_000)).allowed
    assert not (await limit_once(store, bucket.key, 2, 60_000)).allowed

    await undo_claim(store, [], refunds=[bucket] * 5)  # more refunds than charges: idle, no credit
    decisions = [await limit_once(store, bucket.key, 2, 60_000) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]


async def test_undo_claim_deletes_only_what_still_holds_its_value(store: Store) -> None:
    mine, taken = Entry("{t}claim:mine", "me", 60_000), Entry("{t}claim:taken", "me", 60_000)
    await store.put(mine.key, "me", 60_000)
    await store.put(taken.key, "someone else", 60_000)

    await undo_claim(store, [mine, taken])

    assert await store.get(mine.key) is None
    assert await store.get(taken.key) == "someone else"


# --- holds: what is in flight against a cap -----------------------------------------------------

LIVE_FOR_MS = (250, 1_000, 4_000)
"""Lifetimes, shortest first, of a hold a test reads live and then waits out. The test takes the
next only when its live read found the hold gone and came too late to tell (``read_late``): a
loaded runner took more than 150 ms between two steps in CI. So a quick runner waits out a
quarter of a second, and a slow one still reads the hold live."""


def read_late(started: float, lifetime_ms: int) -> bool:
    """Whether a lifetime that began after ``started`` (``time.monotonic()``) may be over by now,
    give or take the store clock's millisecond."""
    return time.monotonic() - started >= lifetime_ms / 1000 - 0.005


async def test_holds_fit_their_cap_and_a_refused_hold_changes_nothing(store: Store) -> None:
    balance = Hold("{t}held:account", 40, 100)
    assert await hold(store, [balance], "first", 60_000)
    assert await hold(store, [balance], "second", 60_000)
    assert not await hold(store, [balance], "third", 60_000)  # 40 + 40 + 40 > 100
    assert await hold(store, [Hold("{t}held:account", 20, 100)], "small", 60_000)

    await unhold(store, ["{t}held:account"], "first")

    assert await hold(store, [balance], "third", 60_000)


async def test_a_hold_on_several_keys_is_all_or_nothing(store: Store) -> None:
    assert await hold(store, [Hold("{t}held:owner", 1, 1)], "busy", 60_000)
    both = [Hold("{t}held:ip", 1, 5), Hold("{t}held:owner", 1, 1)]

    assert not await hold(store, both, "next", 60_000)

    assert await hold(store, [Hold("{t}held:ip", 5, 5)], "probe", 60_000)  # nothing was held at held:ip


async def test_holding_again_under_the_same_token_replaces_the_hold(store: Store) -> None:
    assert await hold(store, [Hold("{t}held:again", 3, 3)], "me", 60_000)
    assert await hold(store, [Hold("{t}held:again", 3, 3)], "me", 60_000)
    assert not await hold(store, [Hold("{t}held:again", 1, 3)], "other", 60_000)


async def test_a_hold_lapses_by_itself(store: Store) -> None:
    for lifetime_ms in LIVE_FOR_MS:
        key = f"held:lapse:{lifetime_ms}"
        held_at = time.monotonic()
        assert await hold(store, [Hold(key, 1, 1)], "dead-process", lifetime_ms)
        made_by = time.monotonic()  # it lapses a lifetime after this at the latest
        refused = not await hold(store, [Hold(key, 1, 1)], "next", 60_000)
        if refused or not read_late(held_at, lifetime_ms):
            break
    assert refused

    lapsed_by = made_by + lifetime_ms / 1000 + 0.1
    assert await read_until(lambda: hold(store, [Hold(key, 1, 1)], "next", 60_000), bool, lapsed_by)


async def test_exactly_the_cap_of_many_concurrent_holds_win(store: Store) -> None:
    results = await asyncio.gather(
        *(hold(store, [Hold("{t}held:race", 1, 7)], f"t{n}", 60_000) for n in range(30))
    )
    assert sum(results) == 7


async def test_ping_answers_true(store: Store) -> None:
    assert await store.ping()


# --- one bucket, many connections ----------------------------------------------------------------


async def test_rate_limit_is_exact_across_many_independent_connections(clean_redis_url: str) -> None:
    stores = [RedisStore(clean_redis_url, timeout_s=LOADED_TIMEOUT_S) for _ in range(6)]
    try:
        decisions = await asyncio.gather(
            *(limit_once(s, "rl:shared", 25, 60_000) for s in stores for _ in range(40))
        )
    finally:
        await asyncio.gather(*(s.close() for s in stores))

    assert sum(d.allowed for d in decisions) == 25


async def test_a_burst_larger_than_the_connection_pool_waits_for_connections(clean_redis_url: str) -> None:
    """More concurrent commands than connections: they take turns, none fails."""
    store = RedisStore(clean_redis_url, max_connections=2, timeout_s=LOADED_TIMEOUT_S)
    try:
        claims = await asyncio.gather(*(store.claim(f"{{t}}burst:{i}", "1", 60_000) for i in range(50)))
    finally:
        await store.close()

    assert claims == [True] * 50


async def test_redis_and_upstash_backends_share_claims_and_buckets(
    clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    redis_store = RedisStore(clean_redis_url, timeout_s=LOADED_TIMEOUT_S)
    upstash_store = UpstashStore(*upstash_url_and_token, timeout_s=LOADED_TIMEOUT_S)
    try:
        assert await redis_store.claim("{t}claim:both", "redis", 10_000)
        assert not await upstash_store.claim("{t}claim:both", "upstash", 10_000)

        decisions = await asyncio.gather(
            *(limit_once(s, "rl:both", 10, 60_000) for s in (redis_store, upstash_store) for _ in range(15))
        )
        assert sum(d.allowed for d in decisions) == 10
    finally:
        await redis_store.close()
        await upstash_store.close()


# --- the script is GCRA --------------------------------------------------------------------------


def gcra(tat_us: int | None, now_us: int, limit: int, period_ms: int) -> tuple[RateDecision, int | None]:
    """The reference model of one GCRA step, in microseconds: the decision and the new theoretical
    arrival time (None: unchanged). The stores run it only as Lua; this is what it must decide."""
    period_us = period_ms * 1_000
    interval = max(period_ms * 1_000 // max(limit, 1), 1)
    tat = max(tat_us if tat_us is not None else now_us, now_us)
    new_tat = tat + interval
    allow_at = new_tat - period_us
    if allow_at > now_us:
        return RateDecision(allowed=False, retry_after_ms=-(-(allow_at - now_us) // 1_000)), None
    return RateDecision(allowed=True), new_tat


async def test_gcra_script_decides_exactly_as_the_reference_gcra(raw_redis: aioredis.Redis) -> None:
    """Drive the script with explicit clocks and compare every decision and stored TAT."""
    script = raw_redis.register_script(CHECK_THEN_LIMIT_SCRIPT.source)
    rng = random.Random(402)
    for case in range(20):
        key, limit, period_ms = f"rl:diff:{case}", rng.randint(1, 20), rng.randint(10_000, 100_000)
        now, tat = 1_700_000_000_000_000, None  # microseconds
        for _ in range(30):
            step = rng.choice([0, 0, 1, rng.randint(1, period_ms // limit), rng.randint(1, period_ms)])
            now += step * 1_000 + rng.choice([0, 0, rng.randint(1, 999)])
            expected, new_tat = gcra(tat, now, limit, period_ms)
            keys, args = check_then_limit_call([], [Bucket(key, limit, period_ms)], now_us=now)
            reply = await script(keys=keys, args=args)  # nothing checked first, nothing to put
            assert reply == [[], [expected.retry_after_ms], int(expected.allowed)]
            tat = new_tat if new_tat is not None else tat
            if tat is not None and tat > now:
                assert await raw_redis.get(key) == str(tat)


async def test_rate_limit_key_expires_when_its_tat_passes(
    clean_redis_url: str, raw_redis: aioredis.Redis
) -> None:
    store = RedisStore(clean_redis_url)
    try:
        await limit_once(store, "{t}rl:ttl", 4, 40_000)  # TAT = now + 10 s
        await limit_once(store, "{t}rl:ttl", 4, 40_000)  # TAT = now + 20 s
    finally:
        await store.close()

    assert 19_000 < await raw_redis.pttl("{t}rl:ttl") <= 20_000  # a second of margin: a loaded machine


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_scripts_load_on_a_server_that_lacks_them(
    backend: str, clean_redis_url: str, raw_redis: aioredis.Redis, request: pytest.FixtureRequest
) -> None:
    await raw_redis.script_flush()
    store: Store = (
        RedisStore(clean_redis_url)
        if backend == "redis"
        else UpstashStore(*request.getfixturevalue("upstash_url_and_token"))
    )
    try:
        assert (await limit_once(store, "{t}rl:noscript", 1, 60_000)).allowed
        assert not (await limit_once(store, "{t}rl:noscript", 1, 60_000)).allowed
        assert await store.claim("{t}lock:noscript", "holder", 60_000)
        assert await release(store, "{t}lock:noscript", "holder")
        assert _fields(await credit_state(store, account("noscript"))) == (0, 0, 0)
        assert await hold_credit(store, account("noscript"), 1, "t", 60_000) is None
        assert await take_credit(store, account("noscript"), "t", 1) is None
        assert await due(store) == []
        assert await lapse_credit(store, account("noscript")) == WalletLapse(None, 0, None)
        assert await fix_lapse_index(store, LAPSES, "noscript", 1, None) is False
        assert await register_lapses(store, LAPSES, [("noscript", "in", 0)]) > 0
    finally:
        await store.close()


# --- add_counts: the batched exchange of locally decided limits ----------------------------------


async def test_add_counts_adds_every_delta_and_returns_the_totals(store: Store) -> None:
    first = await store.add_counts({"w:a": 3, "w:b": 1}, 60_000)
    second = await store.add_counts({"w:a": 2, "w:c": 0}, 60_000)

    assert first == {"w:a": 3, "w:b": 1}
    assert second == {"w:a": 5, "w:c": 0}
    assert await store.add_counts({}, 60_000) == {}


async def test_add_counts_from_many_callers_at_once_are_all_counted(store: Store) -> None:
    batches = [{"w:shared": 1, f"w:own{i % 4}": 1} for i in range(100)]

    await asyncio.gather(*(store.add_counts(batch, 60_000) for batch in batches))

    assert await store.add_counts({"w:shared": 0, "w:own3": 0}, 60_000) == {"w:shared": 100, "w:own3": 25}


async def test_add_counts_counters_expire_after_their_ttl(store: Store) -> None:
    await store.add_counts({"w:short": 7}, 50)
    await asyncio.sleep(0.15)

    assert await store.add_counts({"w:short": 1}, 60_000) == {"w:short": 1}


# --- the payment's one-round-trip steps ----------------------------------------------------------


async def test_check_then_limit_reads_the_keys_and_charges_the_buckets_only_when_all_are_absent(
    store: Store,
) -> None:
    await store.put("{t}used", "route-a", 60_000)
    buckets = [Bucket("{t}b:scope", 10, 60_000), Bucket("{t}b:wallet", 10, 60_000)]

    found = await check_then_limit(store, ["{t}fresh", "{t}used"], buckets)
    fresh = await check_then_limit(store, ["{t}fresh", "{t}other"], buckets)

    assert found.values == [None, "route-a"] and found.decisions == [] and found.refused is None
    assert fresh.values == [None, None] and [d.allowed for d in fresh.decisions] == [True, True]
    # The used lookup charged nothing: each bucket has 9 of 10 left, not 8.
    for _ in range(9):
        assert (await check_then_limit(store, [], buckets)).refused is None
    assert (await check_then_limit(store, [], buckets)).refused is not None


async def test_check_then_limit_stops_at_the_first_refusing_bucket(store: Store) -> None:
    tight, loose = Bucket("{t}b:tight", 1, 60_000), Bucket("{t}b:loose", 2, 60_000)

    first = await check_then_limit(store, ["{t}k"], [tight, loose])
    second = await check_then_limit(store, ["{t}k"], [tight, loose])

    assert [d.allowed for d in first.decisions] == [True, True]
    assert len(second.decisions) == 1 and second.refused is not None
    assert 0 < second.refused.retry_after_ms <= 60_000
    # The refused request did not spend the loose bucket's second slot.
    assert (await limit_once(store, "{t}b:loose", 2, 60_000)).allowed


async def test_check_then_limit_with_no_buckets_is_a_multi_get(store: Store) -> None:
    await store.put("{t}a", "1", 60_000)

    lookup = await check_then_limit(store, ["{t}a", "{t}b", "{t}c"], [])

    assert lookup.values == ["1", None, None] and lookup.decisions == []


async def test_check_then_limit_writes_its_puts_only_when_every_key_is_absent_and_every_bucket_allows(
    store: Store,
) -> None:
    await store.put("{t}used", "x", 60_000)
    tight = Bucket("{t}b:puts", 1, 60_000)
    claim = [Entry("{t}claim", "mine", 60_000), Entry("{t}record", "fp", 60_000)]

    found = await check_then_limit(store, ["{t}claim", "{t}used"], [tight], claim)
    first = await check_then_limit(store, ["{t}claim"], [tight], claim)
    limited = await check_then_limit(store, ["{t}other"], [tight], [Entry("{t}other", "no", 60_000)])
    again = await check_then_limit(store, ["{t}claim"], [], [Entry("{t}claim", "theirs", 60_000)])

    assert (found.written, first.written, limited.written, again.written) == (False, True, False, False)
    assert found.decisions == [] and limited.refused is not None
    assert again.values == ["mine"]
    assert await store.get("{t}claim") == "mine" and await store.get("{t}record") == "fp"
    assert await store.get("{t}other") is None


async def test_exactly_one_of_many_concurrent_check_then_limit_claims_wins(store: Store) -> None:
    bucket = Bucket("{t}b:race", 100, 60_000)
    results = await asyncio.gather(
        *(
            check_then_limit(store, ["{t}race"], [bucket], [Entry("{t}race", str(i), 60_000)])
            for i in range(30)
        )
    )

    winners = [i for i, found in enumerate(results) if found.written]
    assert len(winners) == 1 and await store.get("{t}race") == str(winners[0])
    losers = [found for found in results if not found.written]
    assert all(found.values == [str(winners[0])] and found.decisions == [] for found in losers)


async def test_check_then_limit_puts_expire_after_their_ttl(store: Store) -> None:
    assert (await check_then_limit(store, ["{t}short"], [], [Entry("{t}short", "1", 50)])).written
    expired = await read_until(
        lambda: store.get("{t}short"), lambda value: value is None, time.monotonic() + 0.15
    )

    assert expired is None


async def test_claim_then_put_sets_claims_in_order_and_puts_only_when_all_were_set(store: Store) -> None:
    await store.put("{t}taken", "x", 60_000)
    put = [Entry("{t}record", "written", 60_000)]

    partly = await claim_then_put(
        store, [Entry("{t}first", "1", 60_000), Entry("{t}taken", "2", 60_000)], put
    )
    whole = await claim_then_put(store, [Entry("{t}second", "1", 60_000)], put)
    none = await claim_then_put(store, [], [Entry("{t}only", "put", 60_000)])

    assert (partly, whole, none) == (1, 1, 0)
    assert await store.get("{t}first") == "1"  # set before the taken one stopped the claims
    assert await store.get("{t}taken") == "x"
    assert await store.get("{t}record") == "written" and await store.get("{t}only") == "put"


async def test_claim_then_put_does_not_write_when_a_claim_is_taken(store: Store) -> None:
    await store.put("{t}taken", "x", 60_000)

    assert (
        await claim_then_put(store, [Entry("{t}taken", "y", 60_000)], [Entry("{t}record", "z", 60_000)]) == 0
    )
    assert await store.get("{t}record") is None


async def test_exactly_one_of_many_concurrent_claim_then_puts_wins(store: Store) -> None:
    results = await asyncio.gather(
        *(
            claim_then_put(store, [Entry("{t}race", str(i), 60_000)], [Entry("{t}winner", str(i), 60_000)])
            for i in range(30)
        )
    )

    assert sorted(results) == [0] * 29 + [1]
    assert await store.get("{t}winner") == await store.get("{t}race")


async def test_claim_then_put_entries_expire_after_their_ttl(store: Store) -> None:
    await claim_then_put(store, [Entry("{t}short", "1", 50)], [Entry("{t}resolved", "", 1)])

    async def both() -> tuple[str | None, str | None]:
        return await store.get("{t}short"), await store.get("{t}resolved")

    expired = await read_until(both, lambda values: values == (None, None), time.monotonic() + 0.15)

    assert expired == (None, None)


# --- prepaid credit: top-ups ---------------------------------------------------------------------

LAPSES = "{t}credit:lapses"
GRACE_MS = 60_000
"""How long a counter outlives its lapse in these tests: never what ends a balance, unless a test
says so."""


def account(name: str) -> CreditAccount:
    """A wallet's credit keys here, all of them under one hash tag with the lapse index and the
    tests' other keys: the keys of one store call share a slot, as on a cluster they must (the
    steps on a wallet's keys alone, each wallet on its own tag: see the cluster tests below)."""
    base = f"{{t}}credit:{name}"
    return CreditAccount(name, base, f"{base}:holds", f"{base}:lapse", f"{base}:lapsed")


def credit(name: str, amount: int, lapse_ms: int = 60_000, grace_ms: int = GRACE_MS) -> Credit:
    return Credit(account(name), amount, lapse_ms, grace_ms, LAPSES)


async def due(store: Store, limit: int = 10) -> list[str]:
    """The wallets the lapse index lists as due, longest due first."""
    return list((await due_lapses(store, LAPSES, limit)).wallets)


async def until_lapsed(store: Store, *names: str, within_s: float = 0.5) -> None:
    """Wait until each wallet's own lapse time has passed (its index score, a hint written a step
    before its booking, may pass a moment earlier)."""
    deadline = time.monotonic() + within_s
    for name in names:
        await read_until(
            lambda n=name: credit_state(store, account(n)), lambda state: state.ttl_ms == 0, deadline
        )


async def sweep_index(store: Store) -> None:
    """What a sweep does to the index after its visits: each due wallet scored at its lapse time,
    or dropped when it has none left (at once: no credit is on its way in these tests)."""
    listed = await due_lapses(store, LAPSES, 100)
    for wallet, score in listed.wallets.items():
        visit = await lapse_credit(store, account(wallet))
        assert visit.counted == 0, "sweep_index only fixes the index of wallets counted already"
        await fix_lapse_index(store, LAPSES, wallet, score, visit.lapse_at_ms)


async def test_claim_then_put_adds_the_credits_only_when_every_claim_was_set(store: Store) -> None:
    top_up = [credit("w", 50)]
    await store.put("{t}taken", "x", 60_000)

    won = await claim_then_put(store, [Entry("{t}pay:1", "me", 60_000)], [Entry("{t}r", "1", 60_000)], top_up)
    replayed = await claim_then_put(store, [Entry("{t}pay:1", "again", 60_000)], [], top_up)
    partly = await claim_then_put(
        store, [Entry("{t}pay:2", "me", 60_000), Entry("{t}taken", "me", 60_000)], [], top_up
    )
    second = await claim_then_put(store, [Entry("{t}pay:3", "me", 60_000)], [], [*top_up, credit("v", 7)])

    assert (won, replayed, partly, second) == (1, 0, 1, 1)
    assert (await credit_state(store, account("w"))).balance == 100
    assert (await credit_state(store, account("v"))).balance == 7


async def test_concurrent_replays_of_one_top_up_credit_it_once(store: Store) -> None:
    results = await asyncio.gather(
        *(
            claim_then_put(store, [Entry("{t}pay:race", str(i), 60_000)], [], [credit("race", 25)])
            for i in range(30)
        )
    )

    assert sorted(results) == [0] * 29 + [1]
    assert (await credit_state(store, account("race"))).balance == 25


async def test_a_credit_sets_the_balances_ttl_and_each_top_up_renews_it(store: Store) -> None:
    first_watch = Stopwatch()
    await claim_then_put(store, [], [], [credit("ttl", 10, 30_000)])
    first = await credit_state(store, account("ttl"))
    watch = Stopwatch()
    await claim_then_put(store, [], [], [credit("ttl", 5)])
    renewed = await credit_state(store, account("ttl"))

    # A loaded machine may take seconds between the write and the read.
    assert first.balance == 10 and 30_000 - first_watch.margin_ms() < first.ttl_ms <= 30_000
    assert renewed.balance == 15 and 60_000 - watch.margin_ms() < renewed.ttl_ms <= 60_000


async def test_a_balance_lapses_after_its_ttl(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("lapse", 10, 100)])
    lapsed = await read_until(
        lambda: credit_state(store, account("lapse")),
        lambda state: state.balance == 0,
        time.monotonic() + 0.2,
    )

    assert _fields(lapsed) == (0, 0, 0)
    await claim_then_put(store, [], [], [credit("lapse", 3)])
    assert (await credit_state(store, account("lapse"))).balance == 3


async def test_credit_state_sums_only_the_live_holds(store: Store) -> None:
    for lifetime_ms in LIVE_FOR_MS:  # a fresh wallet for each lifetime
        wallet = account(f"s{lifetime_ms}")
        watch = Stopwatch()
        await claim_then_put(store, [], [], [credit(wallet.wallet, 100)])
        held_at = time.monotonic()
        assert await hold(store, [Hold(wallet.holds, 10, 100)], "short", lifetime_ms)
        made_by = time.monotonic()  # it lapses a lifetime after this at the latest
        assert await hold(store, [Hold(wallet.holds, 20, 100)], "long", 60_000)
        live = await credit_state(store, wallet)
        if live.held == 30 or not read_late(held_at, lifetime_ms):
            break

    lapsed_by = made_by + lifetime_ms / 1000 + 0.1
    lapsed = await read_until(lambda: credit_state(store, wallet), lambda state: state.held < 30, lapsed_by)

    assert (live.balance, live.held) == (100, 30) and 60_000 - watch.margin_ms() < live.ttl_ms <= 60_000
    assert (lapsed.balance, lapsed.held) == (100, 20)
    assert _fields(await credit_state(store, account("none"))) == (0, 0, 0)


def test_a_credit_refuses_a_negative_or_imprecise_amount_and_a_lapse_that_would_delete_it() -> None:
    for amount, lapse_ms, grace_ms in ((-1, 1, 0), (2**53 + 1, 1, 0), (1, 0, 0), (1, -5, 0), (1, 1, -1)):
        with pytest.raises(ValueError):
            credit("bad", amount, lapse_ms, grace_ms)
    assert credit("ok", 0, 1, 0).amount == 0  # a zero top-up only renews the balance


async def test_a_credit_to_a_key_that_is_not_a_counter_claims_nothing(
    clean_redis_url: str, raw_redis: aioredis.Redis
) -> None:
    """A script is not rolled back when a command in it fails: the claim must not be set before a
    credit that cannot be added."""
    await raw_redis.set("{t}credit:garbled", "not a number")
    store = RedisStore(clean_redis_url)
    try:
        with pytest.raises(StoreUnavailable):
            await claim_then_put(store, [Entry("{t}pay:g", "me", 60_000)], [], [credit("garbled", 5)])
    finally:
        await store.close()

    assert await raw_redis.get("{t}pay:g") is None


# --- prepaid credit: holds and takes -------------------------------------------------------------

SPEND = account("spend")


async def top_up(store: Store, amount: int, name: str = "spend", lapse_ms: int = 60_000) -> None:
    assert await claim_then_put(store, [], [], [credit(name, amount, lapse_ms)]) == 0


async def test_hold_take_and_release_move_the_balance_exactly(store: Store) -> None:
    watch = Stopwatch()
    await top_up(store, 100)

    first = await hold_credit(store, SPEND, 30, "a", 60_000)
    second = await hold_credit(store, SPEND, 50, "b", 60_000)
    refused = await hold_credit(store, SPEND, 21, "c", 60_000)  # 100 - 80 < 21
    taken = await take_credit(store, SPEND, "a", 30)
    await unhold(store, [SPEND.holds], "b")
    released = await credit_state(store, SPEND)
    whole = await hold_credit(store, SPEND, 70, "c", 60_000)
    less = await take_credit(store, SPEND, "c", 25)  # the call cost less than it held

    assert first is not None and (first.balance, first.held) == (100, 30)
    assert second is not None and (second.balance, second.held) == (100, 80)
    assert refused is None
    assert taken is not None and (taken.balance, taken.held) == (70, 50)
    assert (released.balance, released.held) == (70, 0)
    assert whole is not None and (whole.balance, whole.held) == (70, 70)
    assert less is not None and (less.balance, less.held) == (45, 0)
    assert 60_000 - watch.margin_ms() < less.ttl_ms <= 60_000  # a take keeps the balance's lifetime
    final = await credit_state(store, SPEND)
    assert (final.balance, final.held) == (45, 0)


async def test_holding_again_under_the_same_token_replaces_the_credit_hold(store: Store) -> None:
    await top_up(store, 10)

    assert await hold_credit(store, SPEND, 10, "me", 60_000) is not None
    again = await hold_credit(store, SPEND, 4, "me", 60_000)

    assert again is not None and (again.balance, again.held) == (10, 4)
    assert await hold_credit(store, SPEND, 7, "other", 60_000) is None
    assert await hold_credit(store, SPEND, 6, "other", 60_000) is not None


async def test_nothing_is_held_against_an_absent_or_lapsed_balance(store: Store) -> None:
    assert await hold_credit(store, SPEND, 1, "none", 60_000) is None
    zero = await hold_credit(store, SPEND, 0, "free", 60_000)
    assert _fields(zero) == (0, 0, 0)

    await top_up(store, 10, lapse_ms=100)
    await read_until(
        lambda: credit_state(store, SPEND), lambda state: state.balance == 0, time.monotonic() + 0.2
    )

    assert await hold_credit(store, SPEND, 1, "late", 60_000) is None


async def test_exactly_the_balance_of_many_concurrent_credit_holds_win(store: Store) -> None:
    await top_up(store, 100)

    results = await asyncio.gather(*(hold_credit(store, SPEND, 10, f"t{n}", 60_000) for n in range(100)))

    won = [state for state in results if state is not None]
    assert len(won) == 10
    assert sorted(state.held for state in won) == list(range(10, 101, 10))
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (100, 100)


async def test_a_credit_hold_lapses_by_itself(store: Store) -> None:
    for lifetime_ms in LIVE_FOR_MS:  # a fresh wallet for each lifetime
        wallet = account(f"dead{lifetime_ms}")
        await top_up(store, 10, wallet.wallet)
        held_at = time.monotonic()
        assert await hold_credit(store, wallet, 10, "dead-process", lifetime_ms) is not None
        made_by = time.monotonic()  # it lapses a lifetime after this at the latest
        refused = await hold_credit(store, wallet, 1, "next", 60_000) is None
        if refused or not read_late(held_at, lifetime_ms):
            break
    assert refused

    lapsed_by = made_by + lifetime_ms / 1000 + 0.1
    after = await read_until(
        lambda: hold_credit(store, wallet, 10, "next", 60_000), lambda state: state is not None, lapsed_by
    )
    assert after is not None and (after.balance, after.held) == (10, 10)


async def test_a_take_past_its_deadline_takes_nothing_and_says_so(store: Store) -> None:
    """A take queued behind a stalled store lands late: past its deadline (on the store's own
    clock, counted from the hold's) it changes nothing, and its caller hears an outage."""
    await top_up(store, 100)
    held = await hold_credit(store, SPEND, 30, "late", 60_000)
    assert held is not None and held.at_us > 0

    with pytest.raises(TakeTooLate):
        await take_credit(store, SPEND, "late", 30, not_after_us=held.at_us - 1)
    after_late = await credit_state(store, SPEND)
    in_time = await take_credit(store, SPEND, "late", 30, not_after_us=after_late.at_us + 60_000_000)

    assert (after_late.balance, after_late.held) == (100, 30)  # nothing taken, the hold stands
    assert in_time is not None and (in_time.balance, in_time.held) == (70, 0)
    assert isinstance(TakeTooLate(""), StoreUnavailable)  # an outage to every caller


async def test_a_take_after_its_hold_lapsed_takes_only_what_is_still_free(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 60, "slow", 100) is not None
    other = await read_until(
        lambda: hold_credit(store, SPEND, 80, "other", 60_000),
        lambda state: state is not None,
        time.monotonic() + 0.2,
    )
    assert other is not None

    uncovered = await take_credit(store, SPEND, "slow", 60)  # 100 - 80 held < 60
    covered = await take_credit(store, SPEND, "slow", 20)

    assert uncovered is None
    assert covered is not None and (covered.balance, covered.held) == (80, 80)


async def test_a_take_never_overdraws_the_balance(store: Store) -> None:
    assert await take_credit(store, SPEND, "never-held", 1) is None  # no balance at all
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 40, "held", 60_000) is not None

    too_much = await take_credit(store, SPEND, "held", 101)
    into_others = await take_credit(store, SPEND, "unheld", 61)  # only 60 is free
    past_its_hold = await take_credit(store, SPEND, "held", 101)

    assert (too_much, into_others, past_its_hold) == (None, None, None)
    assert (await credit_state(store, SPEND)).balance == 100
    results = await asyncio.gather(
        *(take_credit(store, SPEND, f"free{n}", 7) for n in range(20))
    )  # 60 free: 8 takes of 7 fit
    assert sum(state is not None for state in results) == 8
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (44, 40)
    taken = await take_credit(store, SPEND, "held", 40)
    assert taken is not None and (taken.balance, taken.held) == (4, 0)


async def test_a_take_of_a_held_token_is_refused_when_the_balance_lapsed(store: Store) -> None:
    await top_up(store, 10, lapse_ms=150)
    assert await hold_credit(store, SPEND, 10, "held", 60_000) is not None
    await read_until(
        lambda: credit_state(store, SPEND), lambda state: state.balance == 0, time.monotonic() + 0.25
    )

    assert await take_credit(store, SPEND, "held", 10) is None
    assert _fields(await credit_state(store, SPEND)) == (0, 10, 0)


async def test_concurrent_takes_of_one_token_take_once(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 30, "once", 60_000) is not None

    results = await asyncio.gather(*(take_credit(store, SPEND, "once", 30) for _ in range(20)))

    assert sum(state is not None for state in results) == 1
    assert await take_credit(store, SPEND, "once", 30) is None  # nor later
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (70, 0)


async def test_a_take_keeps_its_entries_exactly_when_it_takes(store: Store) -> None:
    """A call's answer is kept in the take's own step: kept by the take that took, never by one
    that took nothing (no credit, a repeated take, past its deadline)."""
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 30, "kept", 60_000) is not None
    answer = Entry("{t}answer:kept", "the answer", 60_000)

    taken = await take_credit(store, SPEND, "kept", 30, keep=[answer])
    repeated = await take_credit(store, SPEND, "kept", 30, keep=[Entry("{t}answer:kept", "another", 60_000)])
    uncovered = await take_credit(
        store, SPEND, "unheld", 71, keep=[Entry("{t}answer:uncovered", "x", 60_000)]
    )
    held = await hold_credit(store, SPEND, 10, "late", 60_000)
    assert held is not None
    with pytest.raises(TakeTooLate):
        await take_credit(
            store, SPEND, "late", 10, not_after_us=held.at_us - 1, keep=[Entry("{t}answer:late", "x", 60_000)]
        )

    assert taken is not None and (taken.balance, taken.held) == (70, 0)
    assert (repeated, uncovered) == (None, None)
    assert await store.get("{t}answer:kept") == "the answer"
    assert await store.get("{t}answer:uncovered") is None
    assert await store.get("{t}answer:late") is None
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (70, 10)


async def test_of_concurrent_takes_of_one_token_one_keeps_its_entry(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 30, "race", 60_000) is not None

    results = await asyncio.gather(
        *(
            take_credit(store, SPEND, "race", 30, keep=[Entry("{t}answer:race", str(n), 60_000)])
            for n in range(20)
        )
    )

    (winner,) = [n for n, state in enumerate(results) if state is not None]
    assert await store.get("{t}answer:race") == str(winner)
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (70, 0)


async def test_a_kept_entry_expires_after_its_ttl(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 1, "brief", 60_000) is not None
    assert await take_credit(store, SPEND, "brief", 1, keep=[Entry("{t}answer:brief", "a", 100)]) is not None
    assert await store.get("{t}answer:brief") == "a"
    gone = await read_until(
        lambda: store.get("{t}answer:brief"), lambda value: value is None, time.monotonic() + 2
    )
    assert gone is None


async def test_a_take_refuses_a_kept_entry_that_would_never_expire(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 1, "bad", 60_000) is not None
    with pytest.raises(ValueError):
        await take_credit(store, SPEND, "bad", 1, keep=[Entry("{t}answer:bad", "a", 0)])
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (100, 1)  # nothing taken


async def test_a_token_held_again_after_its_take_can_be_taken_again(store: Store) -> None:
    await top_up(store, 100)
    assert await hold_credit(store, SPEND, 10, "reused", 60_000) is not None
    assert await take_credit(store, SPEND, "reused", 10) is not None
    assert await hold_credit(store, SPEND, 10, "reused", 60_000) is not None

    again = await take_credit(store, SPEND, "reused", 10)

    assert again is not None and (again.balance, again.held) == (80, 0)


async def test_credit_state_sums_only_the_live_credit_holds(store: Store) -> None:
    """The short hold is read live four steps after it was made: when a loaded runner took longer
    than its lifetime (100 ms was not enough over Upstash REST in CI), a longer one is tried."""
    for lifetime_ms in LIVE_FOR_MS:  # a fresh wallet for each lifetime
        wallet = account(f"sum{lifetime_ms}")
        await top_up(store, 100, wallet.wallet)
        held_at = time.monotonic()
        assert await hold_credit(store, wallet, 10, "short", lifetime_ms) is not None
        made_by = time.monotonic()  # it lapses a lifetime after this at the latest
        assert await hold_credit(store, wallet, 20, "long", 60_000) is not None
        assert await take_credit(store, wallet, "long", 5) is not None
        assert await hold_credit(store, wallet, 30, "open", 60_000) is not None
        live = await credit_state(store, wallet)
        if live.held == 40 or not read_late(held_at, lifetime_ms):
            break

    lapsed_by = made_by + lifetime_ms / 1000 + 0.1
    lapsed = await read_until(lambda: credit_state(store, wallet), lambda state: state.held < 40, lapsed_by)

    assert (live.balance, live.held) == (95, 40)
    assert (lapsed.balance, lapsed.held) == (95, 30)


async def test_credit_amounts_the_scripts_cannot_keep_are_refused(store: Store) -> None:
    for amount in (-1, 2**53 + 1):
        with pytest.raises(ValueError):
            await hold_credit(store, SPEND, amount, "bad", 60_000)
        with pytest.raises(ValueError):
            await take_credit(store, SPEND, "bad", amount)
    with pytest.raises(ValueError):
        await hold_credit(store, SPEND, 1, "bad", 0)


async def test_a_take_leaves_nothing_without_a_ttl(clean_redis_url: str, raw_redis: aioredis.Redis) -> None:
    """Taking the last hold deletes the hold set; the taken mark is a key of its own, lapsing
    when the hold would have: nothing a take writes outlives it."""
    store = RedisStore(clean_redis_url)
    try:
        await top_up(store, 10)
        assert await hold_credit(store, SPEND, 10, "only", 5_000) is not None
        assert await take_credit(store, SPEND, "only", 10) is not None
    finally:
        await store.close()

    assert await raw_redis.pttl(SPEND.holds) == -2  # gone with its last hold
    assert 0 < await raw_redis.pttl(taken_mark(SPEND, "only")) <= 5_000
    assert 119_000 < await raw_redis.pttl(SPEND.balance) <= 120_000  # the lapse, then the grace


async def test_a_busy_wallets_hold_set_holds_only_its_calls_in_flight(
    clean_redis_url: str, raw_redis: aioredis.Redis
) -> None:
    """Every hold and take reads the whole hold set, so what a served call leaves behind must not
    stay in it: else each busy wallet's calls grow dearer, for every client of the store."""
    store = RedisStore(clean_redis_url)
    try:
        await top_up(store, 1_000)
        for n in range(50):
            assert await hold_credit(store, SPEND, 1, f"call-{n}", 60_000) is not None
            assert await take_credit(store, SPEND, f"call-{n}", 1) is not None
        assert await hold_credit(store, SPEND, 1, "in-flight", 60_000) is not None
    finally:
        await store.close()

    assert await raw_redis.hkeys(SPEND.holds) == ["in-flight"]
    assert await raw_redis.exists(*(taken_mark(SPEND, f"call-{n}") for n in range(50))) == 50


async def test_redis_and_upstash_backends_share_one_balance(
    clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    redis_store, upstash_store = RedisStore(clean_redis_url), UpstashStore(*upstash_url_and_token)
    try:
        await top_up(redis_store, 50)
        results = await asyncio.gather(
            *(
                hold_credit(s, SPEND, 10, f"{n}-{i}", 60_000)
                for i in range(10)
                for n, s in enumerate((redis_store, upstash_store))
            )
        )
        assert sum(state is not None for state in results) == 5
        held = await hold_credit(upstash_store, SPEND, 0, "probe", 60_000)
        assert held is not None and (held.balance, held.held) == (50, 50)
    finally:
        await redis_store.close()
        await upstash_store.close()


# --- prepaid credit: the lapse -------------------------------------------------------------------


async def test_a_top_up_records_its_lapse_and_the_wallet_is_due_only_once_it_passed(store: Store) -> None:
    await top_up(store, 10, "soon", lapse_ms=300)
    await top_up(store, 10, "later", lapse_ms=60_000)

    before = await due(store)
    listed = await read_until(lambda: due(store), bool, time.monotonic() + 0.4)

    assert before == []
    assert listed == ["soon"]
    assert await store.get(account("soon").lapse) is not None  # the truth, beside the balance


async def test_due_lapses_answers_the_longest_due_first_and_at_most_the_limit(store: Store) -> None:
    for name, lapse_ms in (("third", 600), ("first", 100), ("second", 350)):
        await top_up(store, 1, name, lapse_ms=lapse_ms)
    listed = await read_until(lambda: due(store), lambda wallets: len(wallets) == 3, time.monotonic() + 0.8)

    assert listed == ["first", "second", "third"]
    assert await due(store, 2) == ["first", "second"]
    found = await due_lapses(store, LAPSES, 10)
    assert all(score <= found.at_ms for score in found.wallets.values())


async def test_a_balance_past_its_lapse_spends_as_nothing_before_any_sweep(store: Store) -> None:
    await top_up(store, 100, lapse_ms=300)
    assert await hold_credit(store, SPEND, 40, "early", 60_000) is not None
    await read_until(
        lambda: credit_state(store, SPEND), lambda state: state.balance == 0, time.monotonic() + 0.4
    )

    assert await hold_credit(store, SPEND, 1, "late", 60_000) is None
    assert await take_credit(store, SPEND, "early", 40) is None
    assert await take_credit(store, SPEND, "unheld", 1) is None
    assert _fields(await credit_state(store, SPEND)) == (0, 40, 0)
    assert await lapse_credit(store, SPEND) == WalletLapse(100, 0, None)  # nothing spent: all lapses


async def test_the_state_counts_down_to_the_lapse_not_to_the_counters_backstop(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("countdown", 10, 30_000, grace_ms=600_000)])

    state = await credit_state(store, account("countdown"))

    # Wide margin (a loaded machine may stall seconds here); the backstop is 630 s away.
    assert state.balance == 10 and 20_000 < state.ttl_ms <= 30_000


async def test_lapse_credit_lapses_a_due_balance_once_with_its_holds(store: Store) -> None:
    await top_up(store, 100, lapse_ms=400)
    assert await hold_credit(store, SPEND, 30, "held", 60_000) is not None
    assert await take_credit(store, SPEND, "spent", 20) is not None

    early = await lapse_credit(store, SPEND)
    await until_lapsed(store, "spend")
    visits = await asyncio.gather(*(lapse_credit(store, SPEND) for _ in range(10)))

    assert early.lapsed is None and early.found == 0 and early.lapse_at_ms is not None  # not due
    assert sorted(visit.counted for visit in visits) == [0] * 9 + [80]
    assert all(visit.lapse_at_ms is None for visit in visits)  # nothing is left to lapse
    assert _fields(await credit_state(store, SPEND)) == (0, 0, 0)
    assert await store.get(SPEND.lapse) is None
    assert await due(store) == ["spend"]  # the visit touches the wallet's keys alone
    await top_up(store, 5)  # a wallet whose credit lapsed starts again from its next top-up
    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (5, 0)


async def test_a_top_up_before_the_lapse_moves_it_and_the_sweep_only_rescores_the_wallet(
    store: Store,
) -> None:
    # The second top-up must come before the first lapse: a second of margin for a loaded machine.
    await top_up(store, 100, lapse_ms=1_000)
    written = time.monotonic()  # the first lapse time is at most a second after this
    await asyncio.sleep(0.05)
    await top_up(store, 1, lapse_ms=60_000)
    await asyncio.sleep(max(0.0, written + 1.05 - time.monotonic()))  # past the first lapse time

    listed = await due_lapses(store, LAPSES, 10)  # the index kept the earlier score: a hint
    visit = await lapse_credit(store, SPEND)
    assert list(listed.wallets) == ["spend"]
    assert visit.counted == 0 and visit.lapse_at_ms is not None
    assert await fix_lapse_index(store, LAPSES, "spend", listed.wallets["spend"], visit.lapse_at_ms)
    assert await due(store) == []
    state = await credit_state(store, SPEND)
    assert state.balance == 101 and 50_000 < state.ttl_ms <= 60_000  # the second top-up's lifetime


async def test_a_top_up_after_the_lapse_starts_afresh_and_keeps_the_lapsed_credit_to_count(
    store: Store,
) -> None:
    await top_up(store, 100, lapse_ms=300)
    assert await hold_credit(store, SPEND, 30, "held", 60_000) is not None
    # lapsed, not swept
    await read_until(
        lambda: credit_state(store, SPEND), lambda state: state.balance == 0, time.monotonic() + 0.4
    )

    await top_up(store, 7)
    await top_up(store, 10, "other", lapse_ms=100)
    await read_until(
        lambda: credit_state(store, account("other")),
        lambda state: state.balance == 0,
        time.monotonic() + 0.2,
    )
    await top_up(store, 1, "other")

    state = await credit_state(store, SPEND)
    assert (state.balance, state.held) == (7, 0)  # the lapsed 100 and its hold are gone
    assert sorted(await due(store)) == ["other", "spend"]  # both still due: the next sweep counts
    spend, other = await lapse_credit(store, SPEND), await lapse_credit(store, account("other"))
    assert (spend.lapsed, spend.found, other.lapsed, other.found) == (None, 100, None, 10)
    assert (await lapse_credit(store, SPEND)).found == 0  # each amount is answered once
    assert spend.lapse_at_ms is not None and other.lapse_at_ms is not None  # the new credit is left
    await sweep_index(store)
    assert await due(store) == []


async def test_a_lapse_that_found_nothing_left_adds_nothing_to_count(store: Store) -> None:
    await top_up(store, 10, lapse_ms=300)
    assert await take_credit(store, SPEND, "all", 10) is not None
    await until_lapsed(store, "spend")

    await top_up(store, 3)

    assert (await lapse_credit(store, SPEND)).found == 0
    assert (await credit_state(store, SPEND)).balance == 3


async def test_the_counter_backstop_ends_a_balance_no_sweeper_lapsed(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("forgotten", 10, 50, grace_ms=100)])
    await asyncio.sleep(0.25)  # past the lapse and the grace

    assert _fields(await credit_state(store, account("forgotten"))) == (0, 0, 0)
    listed = await due_lapses(store, LAPSES, 10)
    assert list(listed.wallets) == ["forgotten"]
    # the backstop took the balance and its lapse time, uncounted: nothing left, so it is dropped
    assert await lapse_credit(store, account("forgotten")) == WalletLapse(None, 0, None)
    assert await fix_lapse_index(store, LAPSES, "forgotten", listed.wallets["forgotten"], None)
    assert await due(store) == []


async def test_a_top_up_keeps_the_balance_and_its_lapse_time_a_grace_period_past_the_lapse(
    clean_redis_url: str, raw_redis: aioredis.Redis
) -> None:
    store = RedisStore(clean_redis_url)
    try:
        before_ms = int(time.time() * 1000)
        await claim_then_put(store, [], [], [credit("keys", 10, 60_000, grace_ms=30_000)])
    finally:
        await store.close()

    assert 89_000 < await raw_redis.pttl(account("keys").balance) <= 90_000
    assert 89_000 < await raw_redis.pttl(account("keys").lapse) <= 90_000
    lapses_at = int(await raw_redis.get(account("keys").lapse) or 0)
    assert before_ms + 59_000 < lapses_at <= int(time.time() * 1000) + 60_000
    indexed = await raw_redis.zscore(LAPSES, "keys")
    assert indexed is not None and before_ms + 59_000 < indexed <= lapses_at  # no later than the truth


async def test_redis_and_upstash_backends_share_one_lapse_index(
    clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    redis_store, upstash_store = RedisStore(clean_redis_url), UpstashStore(*upstash_url_and_token)
    try:
        await top_up(redis_store, 10, "a", lapse_ms=100)
        await top_up(upstash_store, 20, "b", lapse_ms=100)
        await until_lapsed(redis_store, "a", "b")
        await top_up(redis_store, 1, "b")

        assert sorted(await due(upstash_store)) == ["a", "b"]
        assert await lapse_credit(upstash_store, account("a")) == WalletLapse(10, 0, None)
        b = await lapse_credit(redis_store, account("b"))
        assert (b.lapsed, b.found) == (None, 20)
    finally:
        await redis_store.close()
        await upstash_store.close()


# --- failing closed ------------------------------------------------------------------------------

SECRET = "hunter2-s3cret"


def _unreachable_store(backend: str) -> tuple[Store, list[str]]:
    """A store pointed at a port nothing listens on, and the strings that must never leak."""
    port = refusing_port()
    if backend == "redis":
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
        return RedisStore(url), [SECRET, url, str(port)]
    url = f"http://127.0.0.1:{port}/{SECRET}-path"
    return UpstashStore(url, f"{SECRET}-token"), [SECRET, url, str(port)]


OPERATIONS: dict[str, Callable[[Store], Awaitable[object]]] = {
    "claim": lambda s: s.claim("{t}k", "v", 1_000),
    "get": lambda s: s.get("{t}k"),
    "put": lambda s: s.put("{t}k", "v", 1_000),
    "incr": lambda s: s.incr({"k": 1}),
    "counters": lambda s: s.counters(["k"]),
    "add_counts": lambda s: s.add_counts({"k": 1}, 1_000),
    "check_then_limit": lambda s: check_then_limit(s, ["{t}k"], [Bucket("{t}b", 1, 1_000)]),
    "claim_then_put": lambda s: claim_then_put(s, [Entry("{t}k", "v", 1_000)]),
    "claim_then_put_credit": lambda s: claim_then_put(
        s, [Entry("{t}k", "v", 1_000)], [], [credit("c", 1, 1_000)]
    ),
    "release": lambda s: release(s, "{t}k", "token"),
    "undo_claim": lambda s: undo_claim(s, [Entry("{t}k", "v", 1_000)], [Bucket("{t}b", 1, 1_000)]),
    "hold": lambda s: hold(s, [Hold("{t}h", 1, 1)], "token", 1_000),
    "unhold": lambda s: unhold(s, ["{t}h"], "token"),
    "credit_state": lambda s: credit_state(s, account("c")),
    "hold_credit": lambda s: hold_credit(s, account("c"), 1, "token", 1_000),
    "take_credit": lambda s: take_credit(s, account("c"), "token", 1),
    "due_lapses": lambda s: due_lapses(s, LAPSES, 10),
    "register_lapses": lambda s: register_lapses(s, LAPSES, [("c", "in", 1)]),
    "lapse_credit": lambda s: lapse_credit(s, account("c")),
    "fix_lapse_index": lambda s: fix_lapse_index(s, LAPSES, "c", 1, None),
    "restore_credit": lambda s: restore_credit(s, account("c"), LAPSES, 1, 1, 1),
}


@pytest.mark.parametrize("backend", ["redis", "upstash"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_unreachable_store_raises_store_unavailable_naming_no_secret(
    backend: str, operation: str
) -> None:
    store, secrets = _unreachable_store(backend)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await OPERATIONS[operation](store)
    finally:
        await store.close()

    printed = "".join(traceback.format_exception(raised.value))
    for secret in secrets:
        assert secret not in printed


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_unreachable_store_pings_false(backend: str) -> None:
    store, _ = _unreachable_store(backend)
    try:
        assert await store.ping() is False
    finally:
        await store.close()


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_a_server_that_never_answers_is_unavailable_after_the_timeout(backend: str) -> None:
    hung: list[asyncio.StreamWriter] = []

    async def accept_and_stay_silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)

    server = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store: Store = (
        RedisStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
        if backend == "redis"
        else UpstashStore(f"http://127.0.0.1:{port}", "token", timeout_s=0.2)
    )
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(StoreUnavailable):
            await store.claim("{t}claim:hung", "v", 1_000)
    finally:
        await store.close()
        for writer in hung:
            writer.close()
        server.close()
        await server.wait_closed()

    # Within its own 0.2 s, not the 2 s a store waits by default (a loaded machine adds a second).
    assert asyncio.get_running_loop().time() - started < 1.9


async def test_upstash_with_a_wrong_token_is_unavailable_and_names_no_token(
    upstash_url_and_token: tuple[str, str],
) -> None:
    url, _ = upstash_url_and_token
    store = UpstashStore(url, f"{SECRET}-token")
    try:
        with pytest.raises(StoreUnavailable, match="Unauthorized") as raised:
            await store.claim("{t}claim:unauthorized", "v", 1_000)
    finally:
        await store.close()

    assert SECRET not in "".join(traceback.format_exception(raised.value))


# --- choosing a backend --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "backend"),
    [
        (None, MemoryStore),
        ("", MemoryStore),
        ("memory://", MemoryStore),
        ("redis://127.0.0.1:6379/0", RedisStore),
        ("rediss://:pw@cache.example:6380/0", RedisStore),
        ("https://example-123.upstash.io", UpstashStore),
        ("http://127.0.0.1:8079", UpstashStore),
        ("redis+cluster://10.0.0.1:7000,10.0.0.2:7000", RedisClusterStore),
        ("rediss+cluster://:pw@cache.example:6380", RedisClusterStore),
    ],
)
async def test_open_store_picks_the_backend_by_scheme(url: str | None, backend: type) -> None:
    store = open_store(url, "token")
    try:
        assert isinstance(store, backend)
    finally:
        await store.close()


def test_open_store_refuses_an_unknown_scheme_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="STATE_STORE_REST_URL") as raised:
        open_store(f"postgres://user:{SECRET}@db.example/x", None)

    assert SECRET not in str(raised.value)


async def test_memory_store_drops_expired_buckets_and_values() -> None:
    """One bucket per client IP must not grow the in-process store without bound."""
    import asyncio

    # Each bucket's TAT and each value live ``life_ms``: longer than the loop, unless a loaded
    # runner stalled it, and then the loop runs again with a longer life.
    for life_ms in (300, 1_500, 6_000):
        store = MemoryStore()
        started = time.monotonic()
        for i in range(100):
            await limit_once(store, f"{{t}}ip:{i}", 10, life_ms * 10)
            await store.put(f"{{t}}v:{i}", "x", life_ms)
        size = await store.size()
        if not read_late(started, life_ms):
            break
    assert size == 200
    await asyncio.sleep(life_ms / 1000 + 0.1)
    await store.claim("{t}c", "x", 60_000)  # any command sweeps out what has expired
    assert await store.size() == 1
    assert (await limit_once(store, "{t}ip:0", 10, life_ms * 10)).allowed


async def test_rate_limits_above_1000_per_second_keep_their_value() -> None:
    """2000 per 100 ms: a millisecond clock would round the interval up and allow about 100. The
    allowance refills at 20 a millisecond while the loop runs, so a loaded machine (a slower loop)
    is allowed that much more, and no more."""
    store = MemoryStore()
    allowed = 0
    started = time.monotonic()
    for _ in range(2_500):
        allowed += (await limit_once(store, "{t}fast", 2_000, 100)).allowed
    refilled = math.ceil((time.monotonic() - started) * 1_000 * 20)
    assert 2_000 <= allowed <= min(2_500, 2_000 + refilled + 1)


def _fields(state: CreditState) -> tuple[int, int, int]:
    """A state's balance, held amount and time left, without the store clock it was read at."""
    return state.balance, state.held, state.ttl_ms


# --- prepaid credit: restored from the ledger ----------------------------------------------------


async def test_restore_credit_sets_the_balance_exactly_and_drops_the_holds(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("restored", 500)])
    assert await hold_credit(store, account("restored"), 200, "in-flight", 60_000) is not None
    watch = Stopwatch()
    lapse_at_ms = int(time.time() * 1000) + 60_000

    mark = LedgerPosition("{t}credit:restored:mark", 41)

    await restore_credit(store, account("restored"), LAPSES, 1_234, lapse_at_ms, 120_000, mark)

    state = await credit_state(store, account("restored"))
    assert (state.balance, state.held) == (1_234, 0)
    assert 60_000 - watch.margin_ms() < state.ttl_ms <= 60_000  # the restored time, not the key's TTL
    assert await hold_credit(store, account("restored"), 1_234, "all", 60_000) is not None
    assert await store.get(mark.key) == "41"
    indexed = (await due_lapses(store, LAPSES, 10)).wallets  # registered, not due yet
    assert indexed == {} and await store.get(account("restored").lapse) == str(lapse_at_ms)


async def test_restore_credit_drops_the_lapsed_credit_the_ledger_still_owes(store: Store) -> None:
    """What top-ups found lapsed is not in the ledger's books as lapsed until the sweeper counts
    it: the ledger's balance holds it, so a restore gives it back and it is not counted too."""
    await top_up(store, 100, "relapsed", lapse_ms=100)
    await until_lapsed(store, "relapsed")
    await top_up(store, 5, "relapsed")

    await restore_credit(store, account("relapsed"), LAPSES, 105, int(time.time() * 1000) + 60_000, 120_000)

    assert (await lapse_credit(store, account("relapsed"))).counted == 0
    assert (await credit_state(store, account("relapsed"))).balance == 105


async def test_restore_credit_to_nothing_deletes_the_balance_and_its_lapse(store: Store) -> None:
    await claim_then_put(store, [], [], [credit("emptied", 500)])

    mark = LedgerPosition("{t}credit:emptied:mark", 3)
    await store.put(mark.key, "2", 60_000)

    await restore_credit(
        store, account("emptied"), LAPSES, 0, int(time.time() * 1000) + 60_000, 120_000, mark
    )

    assert _fields(await credit_state(store, account("emptied"))) == (0, 0, 0)
    assert await store.get(account("emptied").lapse) is None and await store.get(mark.key) is None


async def test_a_balance_restored_past_its_lapse_spends_as_nothing_and_lapses_once(store: Store) -> None:
    await restore_credit(store, account("late"), LAPSES, 700, int(time.time() * 1000) - 1, 60_000)

    assert (await credit_state(store, account("late"))).balance == 0
    assert await due(store) == ["late"]  # due now: its lapse time has passed
    assert await lapse_credit(store, account("late")) == WalletLapse(700, 0, None)
    assert await lapse_credit(store, account("late")) == WalletLapse(None, 0, None)


async def test_a_top_up_raises_its_wallets_ledger_mark_and_never_lowers_it(store: Store) -> None:
    position = "{t}credit:positioned:mark"

    for entry_id in (7, 5, 9):  # bookings may land out of their journal order
        top_up = Credit(
            account("positioned"), 10, 60_000, GRACE_MS, LAPSES, LedgerPosition(position, entry_id)
        )
        assert await claim_then_put(store, [], [], [top_up]) == 0
    await claim_then_put(store, [], [], [credit("positioned", 1)])  # no position: untouched

    assert await store.get(position) == "9"
    assert (await credit_state(store, account("positioned"))).balance == 31
    assert await store.counters([position]) == {position: 9}  # what the restore check reads


# --- a cluster: what spans slots ------------------------------------------------------------------

SPREAD = ["usage:a", "usage:b", "usage:c", "usage:d"]
"""Keys without a hash tag: on a 3-master cluster they fall on several slots (checked below)."""


async def test_batches_of_independent_keys_span_the_clusters_slots(clean_cluster_url: str) -> None:
    """Counters of several slots are batched (a pipeline per node; the gateway's own share one
    slot, but the backend does not depend on it); each key's own change stays atomic."""
    assert len({key_slot(key.encode()) for key in SPREAD}) > 1
    store = RedisClusterStore(clean_cluster_url, timeout_s=LOADED_TIMEOUT_S)
    try:
        assert await store.incr(dict.fromkeys(SPREAD, 2)) == dict.fromkeys(SPREAD, 2)
        assert await store.incr({SPREAD[0]: 3}) == {SPREAD[0]: 5}
        assert await store.counters([*SPREAD, "usage:none"]) == {
            **dict.fromkeys(SPREAD, 2),
            SPREAD[0]: 5,
            "usage:none": 0,
        }
        assert await store.add_counts(dict.fromkeys(SPREAD, 1), 60_000) == {
            **dict.fromkeys(SPREAD, 3),
            SPREAD[0]: 6,
        }
    finally:
        await store.close()


async def test_a_script_over_keys_of_several_slots_fails_closed(clean_cluster_url: str) -> None:
    """A script whose keys share no slot is refused by the cluster before it runs: StoreUnavailable,
    so the payment fails closed, and nothing was written. The domains never send one: an atomic
    step whose keys are named on several tags is refused before it is sent, on every backend."""
    store = RedisClusterStore(clean_cluster_url, timeout_s=LOADED_TIMEOUT_S)
    claims = [Entry(SPREAD[0], "me", 60_000), Entry(SPREAD[1], "me", 60_000)]
    try:
        with pytest.raises(StoreUnavailable):
            await store.run(CLAIM_THEN_PUT_SCRIPT, *claim_then_put_call(claims, []))
        with pytest.raises(ValueError, match="span several hash tags"):
            await claim_then_put(store, claims)
        assert await store.get(SPREAD[0]) is None and await store.get(SPREAD[1]) is None
    finally:
        await store.close()


async def test_an_unreachable_cluster_is_store_unavailable_naming_no_secret() -> None:
    store = RedisClusterStore(f"redis+cluster://:{SECRET}@127.0.0.1:{refusing_port()}", timeout_s=0.5)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await store.get("k")
        assert not await store.ping()
    finally:
        await store.close()

    assert SECRET not in "".join(traceback.format_exception(raised.value))


@pytest.mark.slow
async def test_the_store_follows_its_slot_when_the_cluster_moves_it() -> None:
    """Resharding moves the gateway's slot to another master while a store is open: the store
    follows the cluster's MOVED answer (and loads its scripts on the new node), and what was
    claimed before the move stays claimed after it."""
    with start_redis_cluster() as cluster:
        store = RedisClusterStore(cluster.url, timeout_s=LOADED_TIMEOUT_S)
        try:
            claim = keys.payment_claim("payer", "ab" * 32)
            bucket = Bucket(keys.rate_bucket("moved", keys.wallet_tag("payer")), 2, 60_000)
            assert await store.claim(claim, "first", 60_000)
            assert (await check_then_limit(store, [], [bucket])).decisions[0].allowed

            move_slot(cluster, key_slot(claim.encode()))

            assert not await store.claim(claim, "second", 60_000)
            assert await store.get(claim) == "first"
            found = await check_then_limit(store, [claim], [], [])
            assert found.values == ["first"]
            assert (await check_then_limit(store, [], [bucket])).decisions[0].allowed
            assert not (await check_then_limit(store, [], [bucket])).decisions[0].allowed
        finally:
            await store.close()


@pytest.mark.slow
async def test_a_cluster_that_asks_a_password_is_opened_with_the_urls() -> None:
    """``redis+cluster://:password@...``: every node (the ones learnt from the first included) is
    asked with the URL's password; a wrong one is StoreUnavailable, naming no secret."""
    with start_redis_cluster(password=SECRET) as cluster:
        store = RedisClusterStore(cluster.url, timeout_s=LOADED_TIMEOUT_S)
        wrong = RedisClusterStore(cluster.url.replace(SECRET, "not-the-password"), timeout_s=0.5)
        try:
            assert await store.claim(keys.payment_claim("P", "cd" * 32), "me", 60_000)
            assert (await check_then_limit(store, [keys.payment_claim("P", "cd" * 32)], [])).values == ["me"]
            with pytest.raises(StoreUnavailable) as raised:
                await wrong.get(keys.payment_claim("P", "cd" * 32))
        finally:
            await store.close()
            await wrong.close()

    assert SECRET not in "".join(traceback.format_exception(raised.value))


async def test_a_burst_past_the_clusters_pool_waits_for_a_connection(clean_cluster_url: str) -> None:
    """The cluster client raises at once when a node's pool is used up; the store waits for a
    free connection instead, as the single-node one does: a burst is served, not refused."""
    store = RedisClusterStore(clean_cluster_url, timeout_s=LOADED_TIMEOUT_S, max_connections=4)
    try:
        results = await asyncio.gather(
            *(store.claim(keys.payment_claim("P", f"{n:064x}"), "me", 60_000) for n in range(60))
        )
    finally:
        await store.close()

    assert results == [True] * 60
