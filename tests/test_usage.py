"""Usage counters: counted in process, flushed to the shared store, never lost to an outage."""

from __future__ import annotations

from gateway.metrics import Usage, usage_key
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from tests.support.gateway_server import free_port

ROUTE = "solana.mainnet.provider_a.rpc.getBalance"


async def test_usage_is_added_to_the_store_on_flush_and_snapshot() -> None:
    store = MemoryStore()
    usage = Usage(store)
    for _ in range(3):
        await usage.record(ROUTE, "unpaid")
    await usage.record(ROUTE, "paid")
    assert await store.counters([usage_key(ROUTE, "unpaid")]) == {usage_key(ROUTE, "unpaid"): 0}

    snapshot = await usage.snapshot([ROUTE])

    assert snapshot == {(ROUTE, "unpaid"): 3, (ROUTE, "paid"): 1, (ROUTE, "failed"): 0}
    assert (await store.counters([usage_key(ROUTE, "unpaid")]))[usage_key(ROUTE, "unpaid")] == 3


async def test_usage_counts_wait_out_a_store_outage() -> None:
    down = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    usage = Usage(down)
    await usage.record(ROUTE, "failed")
    await usage.record(ROUTE, "failed")
    await usage.flush()  # the store is down: nothing raised, nothing dropped
    await down.close()

    usage.store = store = MemoryStore()
    await usage.flush()

    assert (await store.counters([usage_key(ROUTE, "failed")]))[usage_key(ROUTE, "failed")] == 2
