"""The Upstash REST backend: the same commands and script as the Redis backend, over HTTPS.

The client has no timeout of its own and retries after 3 s by default, so each call is bounded
here and client retries are off (a retried SET NX or script could double-count; we fail closed).
Failures become :class:`StoreUnavailable` naming only the kind of failure, never the URL or token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from upstash_redis.asyncio import Redis
from upstash_redis.errors import UpstashError

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
    CHECK_THEN_LIMIT_SHA1,
    CLAIM_THEN_PUT_SCRIPT,
    CLAIM_THEN_PUT_SHA1,
    CREDIT_STATE_SCRIPT,
    CREDIT_STATE_SHA1,
    DRAIN_LAPSED_SCRIPT,
    DRAIN_LAPSED_SHA1,
    DUE_LAPSES_SCRIPT,
    DUE_LAPSES_SHA1,
    HOLD_SCRIPT,
    HOLD_SHA1,
    LAPSE_CREDIT_SCRIPT,
    LAPSE_CREDIT_SHA1,
    OPEN_CREDIT_SESSION_SCRIPT,
    OPEN_CREDIT_SESSION_SHA1,
    REFUND_CREDIT_SESSION_SCRIPT,
    REFUND_CREDIT_SESSION_SHA1,
    RELEASE_SCRIPT,
    RELEASE_SHA1,
    RESTORE_CREDIT_SCRIPT,
    RESTORE_CREDIT_SHA1,
    REVOKE_CREDIT_SESSION_SCRIPT,
    REVOKE_CREDIT_SESSION_SHA1,
    SPEND_CREDIT_SESSION_SCRIPT,
    SPEND_CREDIT_SESSION_SHA1,
    TAKE_CREDIT_SCRIPT,
    TAKE_CREDIT_SHA1,
    UNDO_CLAIM_SCRIPT,
    UNDO_CLAIM_SHA1,
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


class UpstashStore:
    """Store over ``upstash_redis.asyncio``; one HTTP connection pool per process."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 2.0) -> None:
        self._redis = Redis(url, token, rest_retries=0, allow_telemetry=False)
        self._timeout_s = timeout_s
        self.timeout_s: float | None = timeout_s

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Await one request with a deadline, turning every failure into StoreUnavailable.

        The client's failures are untyped (httpx errors, JSON and base64 decoding errors, missing
        keys in a malformed answer), so anything but cancellation counts as unavailable.
        """
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except UpstashError as exc:
            # The server's own error text ("ERR ...", "Unauthorized") names no secret.
            raise StoreUnavailable(f"upstash store error: {exc}") from None
        except Exception as exc:
            raise StoreUnavailable(f"upstash store unreachable ({type(exc).__name__})") from None

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        # The client answers True when set and False (not None) when the key exists.
        result: Any = await self._call(self._redis.set(key, value, nx=True, px=ttl_ms))
        return result is True

    async def get(self, key: str) -> str | None:
        return text_from_reply(await self._call(self._redis.get(key)))

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
        reply = await self._call(
            self._script(CHECK_THEN_LIMIT_SCRIPT, CHECK_THEN_LIMIT_SHA1, script_keys, args)
        )
        return lookup_from_reply(keys, reply, hold is not None)

    async def claim_then_put(
        self, claims: Sequence[Entry], puts: Sequence[Entry] = (), credits: Sequence[Credit] = ()
    ) -> int:
        script_keys, args = claim_then_put_call(claims, puts, credits)
        reply = await self._call(self._script(CLAIM_THEN_PUT_SCRIPT, CLAIM_THEN_PUT_SHA1, script_keys, args))
        return claimed_from_reply(len(claims), reply)

    async def _script(self, script: str, sha1: str, keys: list[str], args: list[str]) -> Any:
        """EVALSHA, and on a server that has not seen the script yet, EVAL (which caches it)."""
        try:
            return await self._redis.evalsha(sha1, keys=keys, args=args)
        except UpstashError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self._redis.eval(script, keys=keys, args=args)

    async def release(self, key: str, token: str) -> bool:
        reply = await self._call(self._script(RELEASE_SCRIPT, RELEASE_SHA1, [key], [token]))
        return released_from_reply(reply)

    async def undo_claim(
        self, entries: Sequence[Entry], refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
    ) -> None:
        script_keys, args = undo_claim_call(entries, refunds, debts)
        reply = await self._call(self._script(UNDO_CLAIM_SCRIPT, UNDO_CLAIM_SHA1, script_keys, args))
        undone_from_reply(reply)

    async def hold(self, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
        if not holds:
            return True
        script_keys, args = hold_call(holds, token, ttl_ms)
        return held_from_reply(await self._call(self._script(HOLD_SCRIPT, HOLD_SHA1, script_keys, args)))

    async def unhold(self, keys: Sequence[str], token: str) -> None:
        if keys:
            pipe = self._redis.pipeline()
            for key in keys:
                pipe.hdel(key, token)
            await self._call(pipe.exec())

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
        reply = await self._call(self._script(TAKE_CREDIT_SCRIPT, TAKE_CREDIT_SHA1, script_keys, args))
        return credit_change_from_reply(reply)

    async def open_credit_session(self, key: str, wallet: str, cap: int, ttl_ms: int) -> None:
        script_keys, args = open_credit_session_call(key, wallet, cap, ttl_ms)
        await self._call(
            self._script(OPEN_CREDIT_SESSION_SCRIPT, OPEN_CREDIT_SESSION_SHA1, script_keys, args)
        )

    async def spend_credit_session(
        self, spend: CreditSessionSpend, buckets: Sequence[Bucket]
    ) -> SessionLookup:
        script_keys, args = spend_credit_session_call(spend, buckets)
        script, sha1 = SPEND_CREDIT_SESSION_SCRIPT, SPEND_CREDIT_SESSION_SHA1
        return session_lookup_from_reply(await self._call(self._script(script, sha1, script_keys, args)))

    async def refund_credit_session(self, key: str, holds: str, token: str, amount: int) -> None:
        script, sha1 = REFUND_CREDIT_SESSION_SCRIPT, REFUND_CREDIT_SESSION_SHA1
        await self._call(self._script(script, sha1, [key, holds], [token, str(amount)]))

    async def revoke_credit_session(self, key: str) -> CreditSessionState | None:
        script, sha1 = REVOKE_CREDIT_SESSION_SCRIPT, REVOKE_CREDIT_SESSION_SHA1
        return session_state_from_reply(await self._call(self._script(script, sha1, [key], [])))

    async def credit_state(self, account: CreditAccount) -> CreditState:
        script_keys, args = credit_keys(account), [account.wallet]
        reply = await self._call(self._script(CREDIT_STATE_SCRIPT, CREDIT_STATE_SHA1, script_keys, args))
        return credit_state_from_reply(reply)

    async def due_lapses(self, lapses: str, limit: int) -> list[str]:
        reply = await self._call(self._script(DUE_LAPSES_SCRIPT, DUE_LAPSES_SHA1, [lapses], [str(limit)]))
        return wallets_from_reply(reply)

    async def lapse_credit(self, account: CreditAccount) -> int | None:
        script_keys, args = credit_keys(account), [account.wallet]
        reply = await self._call(self._script(LAPSE_CREDIT_SCRIPT, LAPSE_CREDIT_SHA1, script_keys, args))
        return lapsed_from_reply(reply)

    async def restore_credit(
        self, account: CreditAccount, balance: int, lapse_at_ms: int, ttl_ms: int
    ) -> None:
        script_keys, args = restore_credit_call(account, balance, lapse_at_ms, ttl_ms)
        await self._call(self._script(RESTORE_CREDIT_SCRIPT, RESTORE_CREDIT_SHA1, script_keys, args))

    async def drain_lapsed(self, lapsed: str) -> dict[str, int]:
        reply = await self._call(self._script(DRAIN_LAPSED_SCRIPT, DRAIN_LAPSED_SHA1, [lapsed], []))
        return drained_from_reply(reply)

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        if not deltas:
            return {}
        transaction = self._redis.multi()
        for key, delta in deltas.items():
            transaction.incrby(key, delta)
        return totals_from_replies(list(deltas), await self._call(transaction.exec()), per_key=1)

    async def counters(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        return counters_from_reply(keys, await self._call(self._redis.mget(*keys)))

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        if not deltas:
            return {}
        pipe = self._redis.pipeline()
        for key, delta in deltas.items():
            pipe.incrby(key, delta)
            pipe.pexpire(key, ttl_ms)
        return totals_from_replies(list(deltas), await self._call(pipe.exec()))

    async def ping(self) -> bool:
        """True when the server answers; False (not an exception) so health checks stay simple."""
        try:
            await self._call(self._redis.ping())
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        await self._redis.close()
