"""Prepaid credit and credit sessions: a wallet's balance, the holds against it, its lapse, and
the sessions that spend it under a signed cap. Each operation is one of the credit scripts of
``gateway.store.lua``, run by any backend (:meth:`Store.run`); a credit hold made together with a
sign-in's other checks is ``gateway.store.limits.check_then_limit`` with a ``CreditHoldOrder``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.base import (
    Bucket,
    CreditAccount,
    CreditHoldOrder,
    CreditSessionSpend,
    CreditSessionState,
    CreditState,
    Entry,
    SessionLookup,
    Store,
)
from gateway.store.limits import check_then_limit
from gateway.store.lua import (
    CREDIT_STATE_SCRIPT,
    DRAIN_LAPSED_SCRIPT,
    DUE_LAPSES_SCRIPT,
    LAPSE_CREDIT_SCRIPT,
    OPEN_CREDIT_SESSION_SCRIPT,
    REFUND_CREDIT_SESSION_SCRIPT,
    RESTORE_CREDIT_SCRIPT,
    REVOKE_CREDIT_SESSION_SCRIPT,
    SPEND_CREDIT_SESSION_SCRIPT,
    TAKE_CREDIT_SCRIPT,
    credit_change_from_reply,
    credit_keys,
    credit_state_from_reply,
    drained_from_reply,
    lapsed_from_reply,
    open_credit_session_call,
    restore_credit_call,
    session_lookup_from_reply,
    session_state_from_reply,
    spend_credit_session_call,
    take_credit_call,
    wallets_from_reply,
)


async def hold_credit(
    store: Store, account: CreditAccount, amount: int, token: str, ttl_ms: int
) -> CreditState | None:
    """Atomically, in one round trip: forget the lapsed holds of ``account``; only when the
    balance less the other live holds covers ``amount``, hold it under ``token`` (replacing
    that token's own hold), lapsing ``ttl_ms`` from now on the store's clock, and answer the
    state after the hold (``held`` includes it); else change nothing and answer None. The
    holds never add up to more than the balance, however many callers race; a balance past
    its lapse time covers nothing. ``unhold`` releases a credit hold like any other. This is
    ``check_then_limit`` with nothing else to check."""
    return (await check_then_limit(store, [], [], hold=CreditHoldOrder(account, amount, token, ttl_ms))).held


async def take_credit(
    store: Store,
    account: CreditAccount,
    token: str,
    amount: int,
    not_after_us: int | None = None,
    keep: Sequence[Entry] = (),
) -> CreditState | None:
    """Atomically, in one round trip, and only while the store's clock is at most
    ``not_after_us`` (else nothing changes and :class:`TakeTooLate` is raised, so a take that
    waited out a stalled store never lands after its caller gave up): take ``amount`` from
    the balance (keeping its lapse and TTL) only when the balance less the other live holds
    covers it, dropping ``token``'s hold if it is live, and answer the state after; else take
    nothing and answer None. A lapsed or never made hold takes only what is still free, so a
    take never overdraws the balance nor eats into another caller's hold; a balance past its
    lapse time has nothing to take. A taken hold leaves a mark until it would have lapsed: a
    repeated take of the token meanwhile takes nothing (None). Every ``keep`` entry is
    written in the same step, exactly when the take takes (a call's answer, kept for its
    retries: a take without its kept answer cannot happen, nor a kept answer never paid)."""
    script_keys, args = take_credit_call(account, token, amount, not_after_us, keep)
    return credit_change_from_reply(await store.run(TAKE_CREDIT_SCRIPT, script_keys, args))


async def credit_state(store: Store, account: CreditAccount) -> CreditState:
    """In one round trip: the balance (0 past its lapse time), the sum of the live holds and
    the time left until the balance lapses."""
    return credit_state_from_reply(
        await store.run(CREDIT_STATE_SCRIPT, credit_keys(account), [account.wallet])
    )


async def due_lapses(store: Store, lapses: str, limit: int) -> list[str]:
    """The wallets of the lapse index at ``lapses`` whose lapse time has passed on the
    store's clock, the longest due first, at most ``limit``."""
    return wallets_from_reply(await store.run(DUE_LAPSES_SCRIPT, [lapses], [str(limit)]))


async def lapse_credit(store: Store, account: CreditAccount) -> int | None:
    """Atomically, in one round trip: when the wallet's lapse time (read now: a top-up may
    have moved it) has passed, delete its balance and holds, drop it from the index and
    answer the balance it had (0 when none was left); else change nothing and answer None.
    Each lapse is answered once, however many sweepers race."""
    return lapsed_from_reply(await store.run(LAPSE_CREDIT_SCRIPT, credit_keys(account), [account.wallet]))


async def restore_credit(
    store: Store, account: CreditAccount, balance: int, lapse_at_ms: int, ttl_ms: int
) -> None:
    """Atomically, in one round trip: set the wallet's balance to exactly ``balance`` (the
    ledger's word, after the store lost data), lapsing at ``lapse_at_ms`` (Unix ms), its key
    living ``ttl_ms``; its holds are dropped. A balance of 0 deletes the balance and its
    lapse."""
    script_keys, args = restore_credit_call(account, balance, lapse_at_ms, ttl_ms)
    await store.run(RESTORE_CREDIT_SCRIPT, script_keys, args)


async def drain_lapsed(store: Store, lapsed: str) -> dict[str, int]:
    """Atomically, in one round trip: the credit top-ups found lapsed (``lapsed`` of their
    accounts), by wallet, deleted as it is read, so each amount is answered once."""
    return drained_from_reply(await store.run(DRAIN_LAPSED_SCRIPT, [lapsed], []))


async def open_credit_session(store: Store, key: str, wallet: str, cap: int, ttl_ms: int) -> None:
    """Write the credit session at ``key``: ``wallet``, its signed ``cap`` and nothing spent,
    deleted ``ttl_ms`` from now (one atomic round trip)."""
    script_keys, args = open_credit_session_call(key, wallet, cap, ttl_ms)
    await store.run(OPEN_CREDIT_SESSION_SCRIPT, script_keys, args)


async def spend_credit_session(
    store: Store, spend: CreditSessionSpend, buckets: Sequence[Bucket]
) -> SessionLookup:
    """Atomically, in one round trip: the session at ``spend.session`` live and the hold's
    wallet's (else ``UNKNOWN``), its cap less what it spent covering the amount (else ``CAP``),
    the wallet's free credit covering it as ``hold_credit`` decides (else ``UNCOVERED``), then
    one GCRA decision per bucket in order, stopping at the first refusal (``LIMITED``); and
    only when all allowed it, add the amount to the session's spent total and make the hold
    (``SPENT``). Every refusal changes nothing (lapsed holds aside, forgotten), so concurrent
    calls on one session never spend more than its cap."""
    script_keys, args = spend_credit_session_call(spend, buckets)
    return session_lookup_from_reply(await store.run(SPEND_CREDIT_SESSION_SCRIPT, script_keys, args))


async def refund_credit_session(store: Store, key: str, holds: str, token: str, amount: int) -> None:
    """Atomically, in one round trip: drop ``token``'s hold at ``holds`` and, while the
    session at ``key`` is live, take ``amount`` off what it spent (never below 0): a call that
    took nothing gives its share of the cap back."""
    await store.run(REFUND_CREDIT_SESSION_SCRIPT, [key, holds], [token, str(amount)])


async def revoke_credit_session(store: Store, key: str) -> CreditSessionState | None:
    """Atomically, in one round trip: delete the session at ``key`` and answer what it was
    (its spent total counts the calls still in flight); None when there was none live."""
    return session_state_from_reply(await store.run(REVOKE_CREDIT_SESSION_SCRIPT, [key], []))
