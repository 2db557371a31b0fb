"""``x402-gateway store migrate-keys``: bring a store's state under the current key names.

Each release that renamed keys reads none under their old names: the one that gave every gateway
key its hash tag (``gateway.store.keys``), the one that spread the families touched alone over
the slots (usage counters, limit windows, ...), and the one that named each wallet's, client
IP's, token account's and payment's keys on a tag of their own (credit, holds, calls, sign-in
nonces, the fee guard's records, the internal facilitator's settlements). With a ledger, start-up
restores the credit owed from it; without one, this renames every old key that can be named anew
to its new name once, before the new release starts (``docs/store.md``). ``RENAMENX`` keeps each
key's value and time to live, and never overwrites a key the new release wrote already (that one
is kept and the old one reported). A cluster refuses a rename across slots, and only the release
that kept every key on one slot ran on one: there each old key is copied (``DUMP``/``RESTORE``:
value and time to live kept, an existing key never replaced) and then deleted. A payment's keys,
its identifier and the rate-limit buckets of that release do not say whose they are: they stay
and expire (within 15 minutes); its write-ahead intents still open are counted and reported.

Then the credit is brought to one wallet's keys (:func:`migrate_credit`, through the store's own
scripts, each on one wallet's keys or on the lapse index alone, so it runs on every backend): each
wallet the lapse index scores gets its lapse time beside its balance; the credit the release
before kept in one hash of what top-ups found lapsed goes to each wallet's counter, and the
wallet is marked due in the index, so the first sweep counts it. Every step is idempotent (a run
cut short is run again). The old shared ledger mark is deleted (with a ledger, the first check
restores every wallet: none has its own mark yet), and so are the old credit sessions: named
by their token's digest alone, they cannot be named anew without their token; they end, and their
wallets open new ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec

from gateway.store import keys, open_store
from gateway.store.base import Script, Store, StoreUnavailable
from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url
from gateway.store.credit import register_lapses
from gateway.store.lua import integer_from_reply

SCAN_COUNT = 1_000
INDEX_PAGE = 500
LAPSED_TTL_MS = 30 * 86_400_000
"""How long credit found lapsed waits for its count (the first sweep counts it within a minute)."""

# KEYS[1]: the lapse index; ARGV: the first rank, the last. Reply: its wallets and scores, flat.
INDEX_PAGE_SCRIPT = Script("""
return redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES')
""")

# KEYS: a wallet's balance, its lapse time; ARGV: the lapse time its index score says. Reply: 1 when
# written (a balance without a lapse time), else 0. The lapse time lives as long as the balance.
KEEP_LAPSE_SCRIPT = Script("""
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return 0 end
if ttl > 0 then redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl) else redis.call('SET', KEYS[2], ARGV[1]) end
return 1
""")

# KEYS[1]: the old hash of lapsed credit. Reply: its wallets and amounts, flat.
LEGACY_LAPSED_SCRIPT = Script("""
return redis.call('HGETALL', KEYS[1])
""")

# KEYS[1]: a wallet's lapsed counter; ARGV: the amount, ttl_ms. Reply: 1. Set only where absent:
# before the new release runs, only a run of this migration writes it, so a run again after a
# crash counts nothing twice.
KEEP_LAPSED_SCRIPT = Script("""
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return 1
""")

# KEYS[1]: the old hash; ARGV[1]: a wallet moved out of it. Reply: 1.
FORGET_LAPSED_SCRIPT = Script("""
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
""")


class CreditMigrated(msgspec.Struct, frozen=True):
    """What :func:`migrate_credit` did: wallets given their lapse time beside their balance,
    wallets whose lapsed credit moved to their own counter (and marked due), sessions ended."""

    lapse_times: int = 0
    lapsed: int = 0
    sessions_ended: int = 0

    @property
    def moved(self) -> int:
        return self.lapse_times + self.lapsed + self.sessions_ended


class Migrated(msgspec.Struct, frozen=True):
    """What a migration did: keys renamed, old keys left where a new one existed already, and the
    credit brought to one wallet's keys."""

    renamed: int
    kept: list[str]
    credit: CreditMigrated | None = None
    settling: int = 0
    """Write-ahead intents of payments still settling that the release before left (a replica
    that died mid-settle): their payer is not in their name, so they stay where the new release
    does not read them; a retry of such a payment is refused as used (its settle finds the
    transaction settled). Report them, to reconcile by hand from the logs and the ledger."""


def _name(found: object) -> str:
    return found.decode() if isinstance(found, bytes) else str(found)


def _legacy_session(name: str) -> bool:
    """A session key of the release before, named by its token's digest alone."""
    return name.startswith(keys.LEGACY_CREDIT_SESSIONS.removesuffix("*"))


async def _current_name(client: Any, name: str) -> str | None:
    """``name``'s current name (reading its value when the name alone does not say it)."""
    value = await client.get(name) if name.startswith(keys.OLD_NONCES) else None
    return keys.current_name(name, None if value is None else _name(value))


async def migrate_credit(store: Store, sessions_ended: int = 0) -> CreditMigrated:
    """Bring the credit of the release before to one wallet's keys (``sessions_ended``: the
    old sessions the caller deleted, to report)."""
    index = keys.credit_lapses()
    lapse_times, rank = 0, 0
    while True:
        page = await store.run(INDEX_PAGE_SCRIPT, [index], [str(rank), str(rank + INDEX_PAGE - 1)])
        if not isinstance(page, list):
            raise StoreUnavailable("state store answered a read of the lapse index with garbage")
        for wallet, score in zip(page[0::2], page[1::2], strict=True):
            lapse = str(int(float(score)))
            script_keys = [keys.credit_balance(str(wallet)), keys.credit_lapse(str(wallet))]
            lapse_times += integer_from_reply(await store.run(KEEP_LAPSE_SCRIPT, script_keys, [lapse]))
        if len(page) < 2 * INDEX_PAGE:
            break
        rank += INDEX_PAGE
    found = await store.run(LEGACY_LAPSED_SCRIPT, [keys.LEGACY_CREDIT_LAPSED], [])
    if not isinstance(found, list):
        raise StoreUnavailable("state store answered a read of the lapsed credit with garbage")
    lapsed = 0
    for wallet, amount in zip(found[0::2], found[1::2], strict=True):
        counter = keys.credit_lapsed(str(wallet))
        await store.run(KEEP_LAPSED_SCRIPT, [counter], [str(amount), str(LAPSED_TTL_MS)])
        await register_lapses(store, index, [(str(wallet), "in", 0)])  # due now: the first sweep counts it
        await store.run(FORGET_LAPSED_SCRIPT, [keys.LEGACY_CREDIT_LAPSED], [str(wallet)])
        lapsed += 1
    return CreditMigrated(lapse_times, lapsed, sessions_ended)


async def _names(client: Any, pattern: str, node: Any = None) -> AsyncIterator[str]:
    """The names of ``client``'s keys matching ``pattern`` (on a cluster, those of ``node``)."""
    cursor: Any = 0
    while True:
        if node is None:
            cursor, found = await client.scan(cursor, match=pattern, count=SCAN_COUNT)
        else:
            cursors, found = await client.execute_command(
                "SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT, target_nodes=node
            )
            cursor = cursors[node.name]  # redis-py answers a SCAN's cursor by node
        for old in found:
            yield _name(old)
        if int(cursor) == 0:
            return


async def _renamed(client: Any, name: str, new: str) -> bool | None:
    """``RENAMENX``: True when renamed, False when ``new`` exists (kept)."""
    return bool(await client.renamenx(name, new))


async def _copied(client: Any, name: str, new: str) -> bool | None:
    """Across a cluster's slots: ``DUMP``, ``RESTORE`` (value and lifetime kept, never replacing
    a key), then ``DEL``. True when moved, False when ``new`` exists (kept), None when gone."""
    dumped = await client.dump(name)
    if dumped is None:
        return None
    ttl_ms = max(int(await client.pttl(name)), 0)
    try:
        await client.restore(new, ttl_ms, dumped)
    except Exception as exc:
        if "BUSYKEY" not in str(exc):
            raise
        return False
    await client.delete(name)
    return True


Move = Callable[[Any, str, str], Awaitable[bool | None]]


async def _migrate(client: Any, patterns: Sequence[str], move: Move, node: Any = None) -> Migrated:
    """Move every key matching ``patterns`` that has a name now to it; end the old sessions,
    delete the old shared mark, count the open intents left behind."""
    renamed, kept = 0, []
    for pattern in patterns:
        async for name in _names(client, pattern, node):
            new = await _current_name(client, name)
            moved = None if new is None else await move(client, name, new)
            if moved is not None:
                renamed += moved
                kept += [] if moved else [name]
    ended = 0
    async for name in _names(client, keys.LEGACY_CREDIT_SESSIONS, node):
        if _legacy_session(name):
            ended += int(await client.delete(name))
    await client.delete(keys.LEGACY_LEDGER_MARK)
    settling = 0
    async for name in _names(client, keys.ONE_SLOT_INTENTS, node):
        settling += bool(await client.get(name))
    return Migrated(renamed, kept, CreditMigrated(sessions_ended=ended), settling)


async def migrate_client(client: Any) -> Migrated:
    """Rename every gateway key of ``client``'s database (redis-py's or upstash-redis's client:
    the same commands) that an earlier release named otherwise to its current name
    (:func:`gateway.store.keys.current_name`): everything under the untagged roots, and under the
    one-slot root the spread families and the keys now on their own tags."""
    return await _migrate(client, keys.RENAMED, _renamed)


async def migrate_cluster(client: Any) -> Migrated:
    """Move every key that ``client`` (redis-py's ``RedisCluster``, raw replies) holds under the
    one-slot root and that has a name now (a spread family's, or one now on its wallet's, IP's,
    account's or payment's tag) to that name. Those keys all sit on the one slot's node, so only
    that node is scanned. A copy whose delete was lost (the command ended part-way) is found
    again by the next run, and reported as kept."""
    await client.initialize()  # learn the slots
    node = client.get_node_from_key(keys.credit_lapses())  # the one slot's node
    return await _migrate(client, keys.ONE_SLOT_RENAMED, _copied, node)


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
    store = open_store(url, token, timeout_s=timeout_s)
    try:
        async with asyncio.timeout(timeout_s * 10):
            if url.startswith(CLUSTER_SCHEMES):
                done = await migrate_cluster(client)
            else:
                done = await migrate_client(client)
            ended = done.credit.sessions_ended if done.credit is not None else 0
            return msgspec.structs.replace(done, credit=await migrate_credit(store, ended))
    except Exception as exc:
        raise StoreUnavailable(f"the store could not be migrated ({type(exc).__name__})") from None
    finally:
        await (client.close() if upstash else client.aclose())
        await store.close()
