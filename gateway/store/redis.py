"""The Redis-protocol backend (Redis, Valkey, or anything speaking RESP): one pool per process.

Every failure becomes :class:`StoreUnavailable`. The URL may carry a password, so a connection
failure is named only by its kind (the client's own text names the host) and no original
exception is chained; a server's error reply ("ERR ...") is kept, as it holds no secret.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from gateway.store.base import (
    Bucket,
    Credit,
    CreditAccount,
    CreditHoldOrder,
    CreditSessionSpend,
    CreditSessionState,
    CreditState,
    Entry,
    Hold,
    Lookup,
    SessionLookup,
    StoreUnavailable,
)
from gateway.store.lua import (
    CHECK_THEN_LIMIT_SCRIPT,
    CLAIM_THEN_PUT_SCRIPT,
    CREDIT_STATE_SCRIPT,
    DRAIN_LAPSED_SCRIPT,
    DUE_LAPSES_SCRIPT,
    HOLD_SCRIPT,
    LAPSE_CREDIT_SCRIPT,
    OPEN_CREDIT_SESSION_SCRIPT,
    REFUND_CREDIT_SESSION_SCRIPT,
    RELEASE_SCRIPT,
    RESTORE_CREDIT_SCRIPT,
    REVOKE_CREDIT_SESSION_SCRIPT,
    SPEND_CREDIT_SESSION_SCRIPT,
    TAKE_CREDIT_SCRIPT,
    UNDO_CLAIM_SCRIPT,
    check_then_limit_call,
    claim_then_put_call,
    claimed_from_reply,
    counters_from_reply,
    credit_change_from_reply,
    credit_keys,
    credit_state_from_reply,
    drained_from_reply,
    held_from_reply,
    hold_call,
    lapsed_from_reply,
    lookup_from_reply,
    open_credit_session_call,
    released_from_reply,
    restore_credit_call,
    session_lookup_from_reply,
    session_state_from_reply,
    spend_credit_session_call,
    take_credit_call,
    text_from_reply,
    totals_from_replies,
    undo_claim_call,
    undone_from_reply,
    wallets_from_reply,
)

T = TypeVar("T")
MAX_CONNECTIONS = 100


class RedisStore:
    """Store over ``redis.asyncio``; the rate limit runs as one server-side script."""

    timeout_s: float | None

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        health_check_interval_s: int = 15,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        try:
            # A blocking pool: past max_connections a command waits up to timeout_s for a free
            # connection. The default pool raises at once (redis-py caps it at 100), which turned a
            # burst of concurrent requests into 503s.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=timeout_s,
                decode_responses=True,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                health_check_interval=health_check_interval_s,
                # One immediate retry, on a dropped connection only (never a timeout): it rescues a
                # pooled connection the server closed, and a repeated SET NX can only lose the claim.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            )
        except ValueError:
            raise ValueError("STATE_STORE_REST_URL is not a valid redis:// URL") from None
        self._bind(aioredis.Redis.from_pool(pool), timeout_s)

    def _bind(self, client: aioredis.Redis | RedisCluster, timeout_s: float | None) -> None:
        """Run every operation on ``client``: a server's, a cluster's (the same commands, routed by
        slot) or the in-process one's."""
        self.timeout_s = timeout_s
        self._redis: aioredis.Redis | RedisCluster = client
        # register_script sends EVALSHA and falls back to loading the script on NOSCRIPT.
        self._check_then_limit = self._redis.register_script(CHECK_THEN_LIMIT_SCRIPT)
        self._claim_then_put = self._redis.register_script(CLAIM_THEN_PUT_SCRIPT)
        self._release = self._redis.register_script(RELEASE_SCRIPT)
        self._undo_claim = self._redis.register_script(UNDO_CLAIM_SCRIPT)
        self._hold = self._redis.register_script(HOLD_SCRIPT)
        self._credit_state = self._redis.register_script(CREDIT_STATE_SCRIPT)
        self._take_credit = self._redis.register_script(TAKE_CREDIT_SCRIPT)
        self._lapse_credit = self._redis.register_script(LAPSE_CREDIT_SCRIPT)
        self._due_lapses = self._redis.register_script(DUE_LAPSES_SCRIPT)
        self._restore_credit = self._redis.register_script(RESTORE_CREDIT_SCRIPT)
        self._drain_lapsed = self._redis.register_script(DRAIN_LAPSED_SCRIPT)
        self._open_session = self._redis.register_script(OPEN_CREDIT_SESSION_SCRIPT)
        self._spend_session = self._redis.register_script(SPEND_CREDIT_SESSION_SCRIPT)
        self._refund_session = self._redis.register_script(REFUND_CREDIT_SESSION_SCRIPT)
        self._revoke_session = self._redis.register_script(REVOKE_CREDIT_SESSION_SCRIPT)

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Await one command, turning every client failure into StoreUnavailable."""
        try:
            return await awaitable
        except ResponseError as exc:
            raise StoreUnavailable(f"redis store error: {exc}") from None
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis store unreachable ({type(exc).__name__})") from None

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        return bool(await self._call(self._redis.set(key, value, nx=True, px=ttl_ms)))

    async def get(self, key: str) -> str | None:
        value: Any = await self._call(self._redis.get(key))
        return text_from_reply(value)

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        await self._call(self._redis.set(key, value, px=ttl_ms))

    async def check_then_limit(
        self,
        keys: Sequence[str],
        buckets: Sequence[Bucket],
        puts: Sequence[Entry] = (),
        hold: CreditHoldOrder | None = None,
    ) -> Lookup:
        script_keys, args = check_then_limit_call(keys, buckets, puts, hold=hold)
        reply: Any = await self._call(self._check_then_limit(keys=script_keys, args=args))
        return lookup_from_reply(keys, reply, hold is not None)

    async def claim_then_put(
        self, claims: Sequence[Entry], puts: Sequence[Entry] = (), credits: Sequence[Credit] = ()
    ) -> int:
        script_keys, args = claim_then_put_call(claims, puts, credits)
        reply: Any = await self._call(self._claim_then_put(keys=script_keys, args=args))
        return claimed_from_reply(len(claims), reply)

    async def release(self, key: str, token: str) -> bool:
        reply: Any = await self._call(self._release(keys=[key], args=[token]))
        return released_from_reply(reply)

    async def undo_claim(
        self, entries: Sequence[Entry], refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
    ) -> None:
        script_keys, args = undo_claim_call(entries, refunds, debts)
        undone_from_reply(await self._call(self._undo_claim(keys=script_keys, args=args)))

    async def hold(self, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
        if not holds:
            return True
        script_keys, args = hold_call(holds, token, ttl_ms)
        return held_from_reply(await self._call(self._hold(keys=script_keys, args=args)))

    async def unhold(self, keys: Sequence[str], token: str) -> None:
        if keys:
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.hdel(key, token)
            await self._call(pipe.execute())

    async def hold_credit(
        self, account: CreditAccount, amount: int, token: str, ttl_ms: int
    ) -> CreditState | None:
        order = CreditHoldOrder(account, amount, token, ttl_ms)
        return (await self.check_then_limit([], [], hold=order)).held

    async def take_credit(
        self,
        account: CreditAccount,
        token: str,
        amount: int,
        not_after_us: int | None = None,
        keep: Sequence[Entry] = (),
    ) -> CreditState | None:
        script_keys, args = take_credit_call(account, token, amount, not_after_us, keep)
        reply: Any = await self._call(self._take_credit(keys=script_keys, args=args))
        return credit_change_from_reply(reply)

    async def open_credit_session(self, key: str, wallet: str, cap: int, ttl_ms: int) -> None:
        script_keys, args = open_credit_session_call(key, wallet, cap, ttl_ms)
        await self._call(self._open_session(keys=script_keys, args=args))

    async def spend_credit_session(
        self, spend: CreditSessionSpend, buckets: Sequence[Bucket]
    ) -> SessionLookup:
        script_keys, args = spend_credit_session_call(spend, buckets)
        reply: Any = await self._call(self._spend_session(keys=script_keys, args=args))
        return session_lookup_from_reply(reply)

    async def refund_credit_session(self, key: str, holds: str, token: str, amount: int) -> None:
        await self._call(self._refund_session(keys=[key, holds], args=[token, str(amount)]))

    async def revoke_credit_session(self, key: str) -> CreditSessionState | None:
        reply: Any = await self._call(self._revoke_session(keys=[key], args=[]))
        return session_state_from_reply(reply)

    async def credit_state(self, account: CreditAccount) -> CreditState:
        reply: Any = await self._call(self._credit_state(keys=credit_keys(account), args=[account.wallet]))
        return credit_state_from_reply(reply)

    async def due_lapses(self, lapses: str, limit: int) -> list[str]:
        reply: Any = await self._call(self._due_lapses(keys=[lapses], args=[str(limit)]))
        return wallets_from_reply(reply)

    async def lapse_credit(self, account: CreditAccount) -> int | None:
        reply: Any = await self._call(self._lapse_credit(keys=credit_keys(account), args=[account.wallet]))
        return lapsed_from_reply(reply)

    async def restore_credit(
        self, account: CreditAccount, balance: int, lapse_at_ms: int, ttl_ms: int
    ) -> None:
        script_keys, args = restore_credit_call(account, balance, lapse_at_ms, ttl_ms)
        await self._call(self._restore_credit(keys=script_keys, args=args))

    async def drain_lapsed(self, lapsed: str) -> dict[str, int]:
        reply: Any = await self._call(self._drain_lapsed(keys=[lapsed], args=[]))
        return drained_from_reply(reply)

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline(transaction=True)
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
        replies: Any = await self._call(pipe.execute())
        return totals_from_replies(list(deltas), replies, per_key=1)

    async def counters(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        values: Any = await self._call(self._redis.mget(keys))
        return counters_from_reply(keys, values)

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
            pipe.pexpire(key, ttl_ms)
        replies: Any = await self._call(pipe.execute())
        return totals_from_replies(list(deltas), replies)

    async def ping(self) -> bool:
        """True when the server answers; False (not an exception) so health checks stay simple."""
        try:
            return bool(await self._call(self._redis.ping()))
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        await self._redis.aclose()
