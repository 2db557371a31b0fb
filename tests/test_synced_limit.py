"""The locally decided, store-synchronised challenge limit: exact in one process, within the
stated overshoot across replicas sharing one Redis, and still a limit when the store is down.

Time is a controlled clock (windows are wall-clock aligned); the store is real.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.limits.synced import SyncedWindowLimit
from gateway.store import Store, StoreUnavailable, keys
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from tests.support.ports import refusing_port

PERIOD_MS = 60_000


class Clock:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds


def window_start(index: int = 1000) -> float:
    return index * PERIOD_MS / 1000


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    opened: Store = (
        MemoryStore() if request.param == "memory" else RedisStore(request.getfixturevalue("clean_redis_url"))
    )
    yield opened
    await opened.close()


def limit_on(store: Store, clock: Clock, limit: int = 5) -> SyncedWindowLimit:
    return SyncedWindowLimit(store, "challenge:ip", limit, PERIOD_MS, clock=clock)


def admitted(limit: SyncedWindowLimit, subject: str, n: int) -> int:
    return sum(limit.acquire(subject).allowed for _ in range(n))


async def test_one_process_admits_exactly_the_limit_then_says_when_to_retry(store: Store) -> None:
    clock = Clock(window_start() + 30)
    limit = limit_on(store, clock)

    assert admitted(limit, "198.51.100.1", 8) == 5
    refused = limit.acquire("198.51.100.1")
    await limit.sync()

    assert not refused.allowed
    # The window is half gone and full: wait for it to end (30 s), then for a fifth of the next
    # one, when the full window's weight has fallen to 4 of 5.
    assert refused.retry_after_ms == 30_000 + 12_000
    assert limit.acquire("198.51.100.1").allowed is False
    assert admitted(limit, "198.51.100.2", 5) == 5  # subjects are independent


async def test_the_previous_window_fades_as_the_sliding_window_moves_on(store: Store) -> None:
    clock = Clock(window_start() + 54)
    limit = limit_on(store, clock)
    assert admitted(limit, "ip", 5) == 5

    clock.seconds = window_start(1001) + 6  # 10 % into the next window: 5 * 0.9 + 1 > 5
    refused = limit.acquire("ip")
    clock.seconds = window_start(1001) + 12  # 20 %: 5 * 0.8 + 1 <= 5, exactly one more
    later = admitted(limit, "ip", 3)

    assert not refused.allowed and refused.retry_after_ms == 6_000
    assert later == 1


async def test_replicas_sharing_one_store_stay_within_the_stated_overshoot(store: Store) -> None:
    """Three replicas, each admitting ``rate`` of one client's requests per sync interval: the
    total admitted in the window is the limit plus at most (N - 1) * min(limit, rate * 2)."""
    clock = Clock(window_start() + 1)
    replicas = [limit_on(store, clock, limit=120) for _ in range(3)]
    rate = 4

    total = 0
    for _interval in range(100):
        for replica in replicas:
            total += admitted(replica, "203.0.113.7", rate)
        for replica in replicas:
            await replica.sync()
        clock.seconds += 0.1

    bound = 120 + (len(replicas) - 1) * min(120, rate * 2)
    assert 120 <= total <= bound, total
    counted = await store.add_counts({keys.limit_window("challenge:ip", "203.0.113.7", 1000): 0}, PERIOD_MS)
    assert list(counted.values()) == [total]  # every admission reached the shared count


async def test_a_replica_that_never_saw_the_client_learns_the_shared_count_at_its_first_sync(
    store: Store,
) -> None:
    clock = Clock(window_start() + 1)
    busy, idle = limit_on(store, clock, limit=10), limit_on(store, clock, limit=10)
    assert admitted(busy, "ip", 10) == 10
    await busy.sync()

    first = admitted(idle, "ip", 3)  # before its first sync it only knows its own admissions
    await idle.sync()

    assert first == 3
    assert admitted(idle, "ip", 5) == 0


async def test_a_store_outage_leaves_each_process_a_limit_of_its_own_and_loses_no_count() -> None:
    clock = Clock(window_start() + 1)
    down = RedisStore(f"redis://127.0.0.1:{refusing_port()}/0", timeout_s=0.2)
    limit = limit_on(down, clock)
    try:
        assert admitted(limit, "ip", 3) == 3
        with pytest.raises(StoreUnavailable):
            await limit.sync()
        assert admitted(limit, "ip", 5) == 2  # still five in the window, not unlimited

        up = MemoryStore()
        limit.store = up  # the store comes back (here: another one that answers)
        await limit.sync()
    finally:
        await down.close()

    window = keys.limit_window("challenge:ip", "ip", 1000)
    assert await up.add_counts({window: 0}, PERIOD_MS) == {window: 5}


async def test_sync_forgets_windows_the_estimate_no_longer_reads(store: Store) -> None:
    clock = Clock(window_start() + 1)
    limit = limit_on(store, clock)
    for i in range(50):
        limit.acquire(f"198.51.100.{i}")
    await limit.sync()

    clock.seconds = window_start(1002) + 1
    await limit.sync()

    assert limit.acquire("198.51.100.1").allowed
    assert limit.size() == 1


def shared_count(subject: str, window: int = 1000) -> dict[str, int]:
    """A read of the shared counter (adding 0), keyed as the store keeps it."""
    return {keys.limit_window("challenge:ip", subject, window): 0}


async def test_a_count_handed_back_is_room_again_here_and_in_the_store(store: Store) -> None:
    """Each 402 answered with an admitted credential is handed back: a client that answers all
    of them is never refused, and the store holds only what stayed unanswered."""
    clock = Clock(window_start() + 1)
    limit = limit_on(store, clock)

    answered = 0
    for _ in range(50):
        answered += limit.acquire("ip").allowed
        limit.release("ip")
    unanswered = admitted(limit, "ip", 8)
    await limit.sync()

    assert (answered, unanswered) == (50, 5)
    assert await store.add_counts(shared_count("ip"), PERIOD_MS) == {next(iter(shared_count("ip"))): 5}


async def test_hand_backs_cannot_be_banked_ahead_of_the_402s(store: Store) -> None:
    """Credentials admitted without a 402 counted before them hand nothing back: the window never
    goes below zero, so the limit still bounds the 402s that follow."""
    clock = Clock(window_start() + 1)
    limit = limit_on(store, clock)
    for _ in range(20):
        limit.release("ip")  # owed: this process knows of no count to take

    assert admitted(limit, "ip", 8) == 5
    await limit.sync()  # the owed hand-backs never take this process's own later counts
    await limit.sync()
    assert limit.acquire("ip").allowed is False
    assert await store.add_counts(shared_count("ip"), PERIOD_MS) == {next(iter(shared_count("ip"))): 5}


async def test_a_hand_back_never_exceeds_what_was_counted(store: Store) -> None:
    clock = Clock(window_start() + 1)
    limit = limit_on(store, clock)
    assert admitted(limit, "ip", 2) == 2
    for _ in range(5):
        limit.release("ip")  # two take the counts; three are owed, with nothing to take
    await limit.sync()
    await limit.sync()

    assert admitted(limit, "ip", 8) == 5
    await limit.sync()
    assert await store.add_counts(shared_count("ip"), PERIOD_MS) == {next(iter(shared_count("ip"))): 5}


async def test_a_402_of_one_replica_answered_on_another_is_handed_back_at_its_next_sync(
    store: Store,
) -> None:
    """The 402 is counted on one replica and its payment admitted on another, before either
    synced: the hand-back waits for the count to arrive (at most two syncs), then takes it."""
    clock = Clock(window_start() + 1)
    challenging, admitting = limit_on(store, clock), limit_on(store, clock)

    for _ in range(30):
        assert challenging.acquire("ip").allowed
        admitting.release("ip")
        await admitting.sync()  # hears of nothing yet: owed
        await challenging.sync()
        clock.seconds += 0.1
    await admitting.sync()  # takes the last count it heard of
    await admitting.sync()  # and sends it
    assert await store.add_counts(shared_count("ip"), PERIOD_MS) == {next(iter(shared_count("ip"))): 0}

    # The challenging replica last read the count before the last hand-backs: it refuses early
    # once, then reads the shared count again at its next sync.
    first = admitted(challenging, "ip", 8)
    await challenging.sync()
    assert first + admitted(challenging, "ip", 8) == 5


async def test_a_402_at_the_end_of_a_window_is_handed_back_from_that_window(store: Store) -> None:
    clock = Clock(window_start() + 59.9)
    limit = limit_on(store, clock)
    assert admitted(limit, "ip", 5) == 5

    clock.seconds = window_start(1001) + 0.1
    limit.release("ip")
    await limit.sync()

    counted = {**shared_count("ip"), **shared_count("ip", 1001)}
    assert await store.add_counts(counted, PERIOD_MS) == dict(zip(counted, [4, 0], strict=True))


async def test_a_probe_is_handed_back_with_the_admission_that_follows_it_and_only_then(store: Store) -> None:
    """A sign-in that found no credit (a probe), then a payment: the payment's admission hands
    back its 402 and the probe. Probes no payment follows stay counted, and one admission hands
    back at most one probe."""
    clock = Clock(window_start() + 1)
    limit = limit_on(store, clock)

    for _ in range(30):  # the 402, the probe, the payment admitted
        assert limit.acquire("ip").allowed
        assert limit.acquire("ip", probe=True).allowed
        limit.release("ip")
    assert admitted(limit, "ip", 8) == 5

    clock.seconds = window_start(1002) + 1
    assert all(limit.acquire("other", probe=True).allowed for _ in range(4))
    limit.release("other")  # one admission hands back two counts at most, whatever was counted
    assert admitted(limit, "other", 8) == 3
    await limit.sync()
    await limit.sync()
    assert await store.add_counts(shared_count("other", 1002), PERIOD_MS) == {
        next(iter(shared_count("other", 1002))): 5
    }
