"""A store's speed, request by request: ``python -m bench.store_ops [--url URL]``.

Not a test. It times the store calls one request makes, on one event loop, against the memory
store or the store ``--url`` names (Redis, a Redis Cluster, Upstash): a paid request's
three round trips (the claim with its buckets, the write-ahead intent, the delivery), and a call
paid from credit (the sign-in's hold with its nonce and bucket, then the take), one after another
or ``--concurrency`` at a time. It prints steps per second and the p50 of one step per kind;
with ``--server-cost`` (a Redis or a Redis Cluster), also the servers' own CPU time per step
(``INFO cpu``, main thread, summed over every node): what bounds a shard's capacity once
enough gateway replicas feed it. ``bench/README.md`` records the figures before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.store import Bucket, Credit, CreditAccount, CreditHoldOrder, Entry, Store, open_store
from gateway.store import keys as store_keys
from gateway.store.claims import claim_then_put
from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url
from gateway.store.credit import take_credit
from gateway.store.limits import check_then_limit

TTL_MS = 60_000


def _account(wallet: str) -> CreditAccount:
    return CreditAccount(
        wallet,
        store_keys.credit_balance(wallet),
        store_keys.credit_holds(wallet),
        store_keys.credit_lapse(wallet),
        store_keys.credit_lapsed(wallet),
    )


async def _paid(store: Store, n: int) -> None:
    payment = secrets.token_hex(16) + str(n)
    buckets = [Bucket(store_keys.rate_bucket("bench", f"payer{n % 50}"), 10**6, 1_000)]
    claim = Entry(store_keys.payment_claim(payment), "claimant", TTL_MS)
    read = [store_keys.payment_claim(payment), store_keys.pending_settlement(payment)]
    await check_then_limit(store, read, buckets, [claim])
    await store.put(store_keys.pending_settlement(payment), "{}", TTL_MS)
    delivery = Entry(store_keys.delivery(payment), "answer", TTL_MS)
    await claim_then_put(store, [delivery], [Entry(store_keys.pending_settlement(payment), "", 1)])


async def _credit(store: Store, n: int) -> None:
    account = _account(f"wallet{n % 50}")
    nonce = secrets.token_hex(8)
    hold = CreditHoldOrder(account, 1, nonce, TTL_MS)
    bucket = Bucket(store_keys.rate_bucket("bench-credit", account.wallet), 10**6, 1_000)
    found = await check_then_limit(store, [store_keys.sign_in_nonce(nonce)], [bucket], [], hold)
    await take_credit(store, account, nonce, 1)
    assert found.written


async def _rate(store: Store, n: int) -> None:
    await check_then_limit(
        store, [], [Bucket(store_keys.rate_bucket("bench-ip", str(n % 100)), 10**6, 1_000)]
    )


class ServerCost:
    """The servers' own CPU time per step: the main thread's (``INFO cpu``, user and system), the
    one that runs every command and script of a node, summed over every node. It counts what a
    node spends on the steps (parsing, scripts, replies, its sockets), and what it spends meanwhile
    on its own upkeep (a cluster's bus, expiry), so it errs high: one core's second divided by it
    is a floor of what a node carries."""

    def __init__(self, url: str) -> None:
        if url.startswith(CLUSTER_SCHEMES):
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            nodes, username, password, tls = parse_cluster_url(url)
            startup = [ClusterNode(host, port) for host, port in nodes]
            self._client: Any = RedisCluster(
                startup_nodes=startup, username=username, password=password, ssl=tls
            )
            self._nodes: Any = {"target_nodes": RedisCluster.ALL_NODES}
        else:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(url)
            self._nodes = {}
        self._before = 0.0

    async def _cpu_s(self) -> float:
        replies = await self._client.info("cpu", **self._nodes)
        per_node = replies.values() if self._nodes else [replies]
        main = ("used_cpu_user_main_thread", "used_cpu_sys_main_thread")
        return sum(float(cpu[field]) for cpu in per_node for field in main)

    async def reset(self) -> None:
        self._before = await self._cpu_s()

    async def usec(self) -> float:
        """The servers' main-thread CPU microseconds since :meth:`reset`, over every node."""
        return (await self._cpu_s() - self._before) * 1e6

    async def close(self) -> None:
        await self._client.aclose()


async def _timed(
    label: str,
    count: int,
    step: Callable[[Store, int], Awaitable[None]],
    store: Store,
    concurrency: int,
    cost: ServerCost | None = None,
) -> None:
    """``count`` steps, ``concurrency`` at a time: throughput and the p50 of one step (and the
    server's time per step, with ``cost``)."""
    took: list[float] = []
    next_n = iter(range(count))

    async def worker() -> None:
        for n in next_n:
            began = time.perf_counter()
            await step(store, n)
            took.append(time.perf_counter() - began)

    if cost is not None:
        await cost.reset()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    p50 = statistics.median(took) * 1e6
    line = f"{label:<34} {count / elapsed:>10.0f} /s  p50 {p50:>7.0f} µs"
    if cost is not None:
        line += f"  server CPU {await cost.usec() / count:>6.1f} µs/step"
    print(line)


async def main(url: str | None, count: int, concurrency: int, server_cost: bool = False) -> None:
    store = open_store(url, None)
    cost = ServerCost(url) if server_cost and url else None
    try:
        for wallet in (f"wallet{i}" for i in range(50)):
            credit = Credit(_account(wallet), 10**12, TTL_MS * 10, TTL_MS, store_keys.credit_lapses())
            await claim_then_put(store, [], [], [credit])
        print(f"store: {type(store).__name__}, {count} operations each, c={concurrency}")
        await _timed("rate-limit check (1 bucket)", count, _rate, store, concurrency, cost)
        await _timed("paid request (3 round trips)", count, _paid, store, concurrency, cost)
        await _timed("credit call (hold, take)", count, _credit, store, concurrency, cost)
    finally:
        await store.close()
        if cost is not None:
            await cost.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None, help="STATE_STORE_REST_URL (default: the memory store)")
    parser.add_argument("--count", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=1, help="steps in flight at once (default: 1)")
    parser.add_argument(
        "--server-cost", action="store_true", help="also the server's time per step (a Redis or a cluster)"
    )
    options = parser.parse_args()
    asyncio.run(main(options.url, options.count, options.concurrency, options.server_cost))
