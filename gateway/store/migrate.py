"""``x402-gateway store migrate-keys``: bring a store's state under the tagged key names.

The release that gave every gateway key its hash tag (``gateway.store.keys``) reads no key
under the old untagged root. With a ledger, start-up restores the credit owed from
it; without one, this renames every old key to its new name once, before the new release starts
(``docs/store.md``). ``RENAMENX`` keeps each key's value and time to live, and never overwrites a
key the new release wrote already (that one is kept and the old one reported). Only a single
Redis or Upstash can hold old keys: the untagged release never ran on a cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from gateway.store import keys
from gateway.store.base import StoreUnavailable

SCAN_COUNT = 1_000


class Migrated(msgspec.Struct, frozen=True):
    """What a migration did: keys renamed, and old keys left where a new one existed already."""

    renamed: int
    kept: list[str]


async def migrate_client(client: Any) -> Migrated:
    """Rename every old gateway key of ``client``'s database (redis-py's or upstash-redis's
    client: the same two commands) to the same family and arguments under the new root."""
    renamed, kept = 0, []
    for old_root, new_root in keys.LEGACY_ROOTS.items():
        cursor: Any = 0
        while True:
            cursor, found = await client.scan(cursor, match=old_root + "*", count=SCAN_COUNT)
            for old in found:
                name = old.decode() if isinstance(old, bytes) else str(old)
                if await client.renamenx(name, new_root + name.removeprefix(old_root)):
                    renamed += 1
                else:
                    kept.append(name)
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
    else:
        raise ValueError("only a Redis (redis://, rediss://) or Upstash store can hold untagged keys")
    try:
        async with asyncio.timeout(timeout_s * 10):
            return await migrate_client(client)
    except Exception as exc:
        raise StoreUnavailable(f"the store could not be migrated ({type(exc).__name__})") from None
    finally:
        await (client.close() if upstash else client.aclose())
