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
from typing import Any, cast

from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.credit.book import CreditBook
from gateway.methods.credit.calls import credit_call
from gateway.methods.exact.fee_guard import Party
from gateway.methods.exact.ledger import DeliveredRecord, PaymentLedger, PendingSettlement
from gateway.methods.sign_in import Admitted, SignInGate
from gateway.routing.routes import RateLimitSpec
from gateway.store import Store, open_store
from gateway.store.claims import claim_then_put
from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url
from gateway.store.credit import take_credit
from gateway.store.limits import check_then_limit
from gateway.store.memory import MemoryStore
from gateway.x402.siwx import VerifiedSignIn

TTL_MS = 60_000
PAYERS, CLIENTS = 1_000, 200
"""The wallets and client IPs the requests come from: their keys spread over a cluster's slots."""
LIMITS = (
    RateLimitSpec("bench:rpc", 10**6, 1_000),
    RateLimitSpec("bench:rpc:wallet", 10**6, 1_000, per="wallet"),
)
"""A paid route's limits as routes.yaml declares them: a shared budget, and each wallet's own."""
LIMITER = RateLimiter(MemoryStore(), refused_per_minute=10**6)
"""Plans each request's buckets as the gateway does (its own, the refusal guards, the budget)."""


async def _paid(store: Store, n: int) -> None:
    """A paid request's store work, by the gateway's own ledger: the claim (with the payer's
    and the IP's steps, then the budget's), the write-ahead intent, the delivery."""
    payer, ip = f"payer{n % PAYERS}", f"198.51.{n % CLIENTS // 250}.{n % CLIENTS % 250}"
    plan = LIMITER.plan(LIMITS, wallet=payer, ip=ip, guards=LIMITER.refusal_guards)
    ledger, key = PaymentLedger(store), secrets.token_hex(32)
    blockers = [Party("ip", ip).cooldown_key]
    attempt = await ledger.claim(payer, key, "bench", key[:16], key, plan.buckets, blockers)
    assert attempt.won, attempt
    await ledger.record_pending(payer, key, PendingSettlement(fingerprint=key, claimant=key))
    assert await ledger.deliver(payer, key, DeliveredRecord(fingerprint=key, claimant=key))


async def _credit(store: Store, n: int) -> None:
    """A call paid from credit by a sign-in, by the gateway's own gate: the nonce, the call's
    record, the wallet's bucket and the hold (then the budget), then the take."""
    wallet, ip = f"wallet{n % PAYERS}", f"198.51.{n % CLIENTS // 250}.{n % CLIENTS % 250}"
    gate, book = SignInGate(store, LIMITER, LIMITS), CreditBook(store, lapse_days=1, upstream_timeout_s=5.0)
    signed = VerifiedSignIn(wallet, "solana", secrets.token_hex(8), 0.0, 0.0, TTL_MS)
    order = book.order(wallet, 1)
    call = credit_call("bench", wallet, signed.nonce, b"{}", TTL_MS)
    admitted = await gate.admit(signed, ip, order, call.in_flight())
    assert isinstance(admitted, Admitted), admitted
    assert await take_credit(store, order.account, order.token, 1) is not None


async def _rate(store: Store, n: int) -> None:
    """One wallet's own bucket."""
    plan = LIMITER.plan(LIMITS[1:], wallet=f"payer{n % PAYERS}")
    assert (await check_then_limit(store, [], plan.buckets)).decisions[0].allowed


class Counted:
    """A store that counts what it is asked: commands, and round trips (the times it goes from
    nothing in flight to something: calls sent at once count once)."""

    def __init__(self, store: Store) -> None:
        self.store, self.timeout_s = store, store.timeout_s
        self.commands = self.trips = self._in_flight = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def counted(*args: Any) -> Any:
            self.commands += 1
            self.trips += self._in_flight == 0
            self._in_flight += 1
            try:
                return await method(*args)
            finally:
                self._in_flight -= 1

        return counted


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
        book = CreditBook(store, lapse_days=1, upstream_timeout_s=5.0)
        for wallet in (f"wallet{i}" for i in range(PAYERS)):
            await claim_then_put(store, [], [], book.credits(wallet, 10**12))
        print(f"store: {type(store).__name__}, {count} operations each, c={concurrency}")
        for label, step in (("rate-limit check", _rate), ("paid request", _paid), ("credit call", _credit)):
            counted = Counted(store)
            for n in range(20):
                await step(cast(Store, counted), n)
            per_call = f"{counted.trips / 20:.0f} trips, {counted.commands / 20:.1f} commands"
            await _timed(f"{label} ({per_call})", count, step, store, concurrency, cost)
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
