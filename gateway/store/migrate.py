"""``x402-gateway store migrate-keys``: bring a store's state under the current key names.

The release that gave every gateway key its hash tag (``gateway.store.keys``) reads no key under
the old untagged root, and the one that spread the families touched alone over the slots (usage
counters, limit windows, ...) reads none of theirs under the one-slot root. With a ledger,
start-up restores the credit owed from it; without one, this renames every old key to its new
name once, before the new release starts (``docs/store.md``). ``RENAMENX`` keeps each key's
value and time to live, and never overwrites a key the new release wrote already (that one is
kept and the old one reported). A cluster refuses a rename across slots, and only the release
that kept every key on one slot ran on one: there each old key of a spread family is copied
(``DUMP``/``RESTORE``: value and time to live kept, an existing key never replaced) and then
deleted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from gateway.store import keys
from gateway.store.base import StoreUnavailable
from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url

SCAN_COUNT = 1_000


class Migrated(msgspec.Struct, frozen=True):
    """What a migration did: keys renamed, and old keys left where a new one existed already."""

    renamed: int
    kept: list[str]


async def migrate_client(client: Any) -> Migrated:
    """Rename every gateway key of ``client``'s database (redis-py's or upstash-redis's client:
    the same two commands) that an earlier release named otherwise to its current name
    (:func:`gateway.store.keys.current_name`): everything under the untagged roots, and the
    spread families under the one-slot root."""
    renamed, kept = 0, []
    for pattern in keys.RENAMED:
        cursor: Any = 0
        while True:
            cursor, found = await client.scan(cursor, match=pattern, count=SCAN_COUNT)
            for old in found:
                name = old.decode() if isinstance(old, bytes) else str(old)
                new = keys.current_name(name)
                if new is None:
                    continue
                if await client.renamenx(name, new):
                    renamed += 1
                else:
                    kept.append(name)
            if int(cursor) == 0:
                break
    return Migrated(renamed, kept)


async def migrate_cluster(client: Any) -> Migrated:
    """Move every key of a spread family that ``client`` (redis-py's ``RedisCluster``, raw
    replies) holds under the one-slot root to its current name. Those keys all sit on the one
    slot's node, so only that node is scanned. A copy whose delete was lost (the command ended
    part-way) is found again by the next run, and reported as kept."""
    renamed, kept = 0, []
    await client.initialize()  # learn the slots
    node = client.get_node_from_key(keys.ledger_mark())  # the one slot's node
    for pattern in keys.SPREAD_RENAMED:
        cursor: Any = 0
        while True:
            cursors, found = await client.execute_command(
                "SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT, target_nodes=node
            )
            cursor = cursors[node.name]  # redis-py answers a SCAN's cursor by node
            for old in found:
                name = old.decode() if isinstance(old, bytes) else str(old)
                new = keys.current_name(name)
                dumped = await client.dump(name)
                if new is None or dumped is None:
                    continue
                ttl_ms = max(int(await client.pttl(name)), 0)
                try:
                    await client.restore(new, ttl_ms, dumped)
                except Exception as exc:
                    if "BUSYKEY" not in str(exc):
                        raise
                    kept.append(name)
                    continue
                await client.delete(name)
                renamed += 1
            if int(cursor) == 0:
                break
    return Migrated(renamed, kept)


async def migrate_keys(url: str, token: str | None, timeout_s: float = 30.0) -> Migrated:
    """Migrate the store at ``url`` (``STATE_STORE_REST_URL``); ValueError for a store that
    cannot hold old keys, StoreUnavailable when it cannot be reached."""
    if url.startswith(("redis://", "rediss://")):
        import redis.asyncio as aioredis

        client: Any = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s)
        upstash = False
    elif url.startswith(("https://", "http://")):
        from upstash_redis.asyncio import Redis

        client = Redis(url, token or "", rest_retries=0, allow_telemetry=False)
        upstash = True
    elif url.startswith(CLUSTER_SCHEMES):
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes, username, password, tls = parse_cluster_url(url)
        startup = [ClusterNode(host, port) for host, port in nodes]
        client = RedisCluster(
            startup_nodes=startup, username=username, password=password, ssl=tls, socket_timeout=timeout_s
        )
        upstash = False
    else:
        raise ValueError("only a Redis (redis://, rediss://), a cluster or Upstash store can be migrated")
    try:
        async with asyncio.timeout(timeout_s * 10):
            if url.startswith(CLUSTER_SCHEMES):
                return await migrate_cluster(client)
            return await migrate_client(client)
    except Exception as exc:
        raise StoreUnavailable(f"the store could not be migrated ({type(exc).__name__})") from None
    finally:
        await (client.close() if upstash else client.aclose())
