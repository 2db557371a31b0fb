"""Prepaid credit and credit sessions: a wallet's balance, the holds against it, its lapse, and
the sessions that spend it under a signed cap. Each operation is one of the scripts here (on the
shared preludes of ``gateway.store.lua``), run by any backend (:meth:`Store.run`); a credit hold
made together with a sign-in's other checks is ``gateway.store.limits.check_then_limit`` with a
``CreditHoldOrder``, a top-up ``gateway.store.claims.claim_then_put`` with its ``Credit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway.store.base import (
    Bucket,
    Credit,
    CreditAccount,
    CreditHoldOrder,
    CreditSessionSpend,
    CreditSessionState,
    CreditState,
    Entry,
    LedgerPosition,
    Lookup,
    RateDecision,
    Script,
    SessionLookup,
    SessionSpent,
    Store,
    StoreUnavailable,
    TakeTooLate,
    checked_amount,
    checked_ttl,
    taken_mark,
)
from gateway.store.limits import check_then_limit
from gateway.store.lua import (
    CREDIT_PRELUDE,
    LAPSE_PRELUDE,
    credit_keys,
    credit_state_from_reply,
    integer_from_reply,
)
from gateway.store.slots import one_tag

# Reply: the credit state. Reads only.
CREDIT_STATE_SCRIPT = Script(
    CREDIT_PRELUDE
    + """
local now = now_us()
local held = credit_holds(KEYS[2], nil, now, false)
local balance, left = live_balance(KEYS[1], KEYS[3], now_ms(now))
return {balance, held, left, now}
"""
)


# A credit session is a hash: wallet, cap (micro-USDC, what the wallet signed), spent. KEYS: the
# session. ARGV: wallet, cap, ttl_ms. Reply: 1.
OPEN_CREDIT_SESSION_SCRIPT = Script("""
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'wallet', ARGV[1], 'cap', ARGV[2], 'spent', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
""")


# KEYS: the session, the balance, its hold set, its lapse time, then the buckets. ARGV: wallet,
# token, amount, the hold's ttl_ms, then limit, period_ms and guard (1 or 0) per bucket. Reply:
# {'unknown'} (no live session for this wallet), {'cap', cap, spent}, {'uncovered'},
# {'limited', retry_after_ms per bucket taken}, or {'spent', the decisions (0s), the credit state
# after the hold, the session's spent total, its cap}. Checks in that order, and writes nothing
# before the last: a refused call spends neither the session's cap, nor credit, nor a bucket.
SPEND_CREDIT_SESSION_SCRIPT = Script(
    CREDIT_PRELUDE
    + """
local wallet, token, amount, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local session = redis.call('HMGET', KEYS[1], 'wallet', 'cap', 'spent')
if session[1] ~= wallet or not session[2] or not session[3] then return {'unknown'} end
if tonumber(session[2]) - tonumber(session[3]) < amount then return {'cap', session[2], session[3]} end
local clock = now_us()
local others = credit_holds(KEYS[3], token, clock, true)
local balance, left = live_balance(KEYS[2], KEYS[4], now_ms(clock))
if tonumber(balance) - others < amount then return {'uncovered'} end
local waits = {}
for j = 1, #KEYS - 4 do
  local at = 2 + 3 * j
  local wait = gcra(KEYS[4 + j], tonumber(ARGV[at]), tonumber(ARGV[at + 1]), clock, ARGV[at + 2] == '1')
  waits[j] = wait
  if wait > 0 then return {'limited', waits} end
end
local spent = redis.call('HINCRBY', KEYS[1], 'spent', amount)
redis.call('HSET', KEYS[3], token, ARGV[3] .. ' ' .. string.format('%d', clock + ttl * 1000))
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
return {'spent', waits, {balance, others + amount, left, clock}, spent, session[2]}
"""
)


# KEYS: the session, the hold set. ARGV: the hold's token, its amount. Reply: 1.
REFUND_CREDIT_SESSION_SCRIPT = Script("""
redis.call('HDEL', KEYS[2], ARGV[1])
local spent = redis.call('HGET', KEYS[1], 'spent')
if spent then
  local back = math.min(tonumber(spent), tonumber(ARGV[2]))
  if back > 0 then redis.call('HINCRBY', KEYS[1], 'spent', -back) end
end
return 1
""")


# KEYS: the session. Reply: {wallet, cap, spent} of the session deleted, or nil when none was live.
REVOKE_CREDIT_SESSION_SCRIPT = Script("""
local session = redis.call('HMGET', KEYS[1], 'wallet', 'cap', 'spent')
if not session[1] then return false end
redis.call('DEL', KEYS[1])
return session
""")


# ARGV: token, amount, the deadline on the store's clock (µs; empty: none), then value and
# ttl_ms per entry to keep. Reply: the credit state after the take, nil when nothing was taken, or
# 'late' past the deadline. KEYS[4]: the token's taken mark, set while its hold would have lived;
# KEYS[5...]: the entries written with the take (a call's answer), and only with it.
TAKE_CREDIT_SCRIPT = Script(
    CREDIT_PRELUDE
    + """
local token, amount = ARGV[1], tonumber(ARGV[2])
local now = now_us()
if ARGV[3] ~= '' and now > tonumber(ARGV[3]) then return 'late' end
local others, own = credit_holds(KEYS[2], token, now, true)
if not own and redis.call('EXISTS', KEYS[4]) == 1 then return false end
local balance, left = live_balance(KEYS[1], KEYS[3], now_ms(now))
if tonumber(balance) - others < amount then return false end
if own then
  redis.call('SET', KEYS[4], '1', 'PX', math.max(1, math.floor((tonumber(own) - now) / 1000)))
  redis.call('HDEL', KEYS[2], token)
end
if amount > 0 then
  redis.call('DECRBY', KEYS[1], ARGV[2])
  balance = redis.call('GET', KEYS[1])
end
for i = 5, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2 * i - 6], 'PX', ARGV[2 * i - 5])
end
return {balance, others, left, now}
"""
)


CREDIT_STEP_WINDOW_MS = 10_000
"""How long after its wallet's registration in the lapse index a credit step (a top-up's booking,
a restore) may still run, on the store's clock: later, it books nothing. The sweeper drops a
wallet with no credit from the index only once its score is twice this old at the listing, so a
credit registered before can no longer land unindexed (the two steps' nodes' clocks may differ
by up to this much)."""


# KEYS[1]: the lapse index; ARGV: per wallet its member, 'in' or 'at' and a time (ms from now, or
# Unix ms). Reply: the store's clock (Unix ms). Each wallet's score becomes the earlier of its
# score and that time, but never before now: a wallet due stays due, now, which also shows when it
# was last registered (a score is never earlier than the registrations before it).
REGISTER_LAPSES_SCRIPT = Script(
    LAPSE_PRELUDE
    + """
local now = now_ms(now_us())
for i = 1, #ARGV, 3 do
  local lapse = tonumber(ARGV[i + 2])
  if ARGV[i + 1] == 'in' then lapse = now + lapse end
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score then lapse = math.min(tonumber(score), lapse) end
  redis.call('ZADD', KEYS[1], string.format('%d', math.max(lapse, now)), ARGV[i])
end
return now
"""
)


# KEYS: the balance, its hold set, its lapse time, its lapsed counter. Reply: {the balance lapsed
# (its text; '' when not due), the lapsed counter drained (its text), the lapse time left (Unix
# ms; '' when none)}. One wallet's keys only.
LAPSE_CREDIT_SCRIPT = Script(
    LAPSE_PRELUDE
    + """
local gone = lapse_if_due(KEYS[1], KEYS[2], KEYS[3], now_ms(now_us()))
local found = redis.call('GET', KEYS[4]) or '0'
redis.call('DEL', KEYS[4])
return {gone or '', found, redis.call('GET', KEYS[3]) or ''}
"""
)


# KEYS[1]: the lapse index; ARGV: the wallet, the score it was listed with, its new score ('':
# drop it). Reply: 1 when changed, 0 when the score moved since it was listed (a top-up registered
# the wallet again: the next sweep visits it anew).
FIX_LAPSE_INDEX_SCRIPT = Script("""
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
""")


# KEYS: the balance, its hold set, its lapse time, its lapsed counter, its ledger mark; ARGV:
# balance, lapse time (Unix ms), the keys' ttl_ms, the ledger entry id (0: none, the mark left
# alone), the deadline (Unix ms, from the registration; '': a balance of 0, not registered).
# Reply: 1. What top-ups found lapsed is dropped: the ledger's balance still holds it (only the
# sweeper's count takes it out of the ledger), so it is restored, not counted as well.
RESTORE_CREDIT_SCRIPT = Script(
    LAPSE_PRELUDE
    + """
if ARGV[5] ~= '' and now_ms(now_us()) > tonumber(ARGV[5]) then
  return redis.error_reply('ERR credit past its deadline: registered in the lapse index too long ago')
end
redis.call('DEL', KEYS[2], KEYS[4])
if tonumber(ARGV[1]) <= 0 then
  redis.call('DEL', KEYS[1], KEYS[3])
  if tonumber(ARGV[4]) > 0 then redis.call('DEL', KEYS[5]) end
  return 1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
if tonumber(ARGV[4]) > 0 then redis.call('SET', KEYS[5], ARGV[4], 'PX', ARGV[3]) end
return 1
"""
)


# KEYS[1]: the lapse index; ARGV[1]: the most wallets to answer. Reply: {the store's clock (Unix
# ms), the wallets due and their scores, flat, longest due first}.
DUE_LAPSES_SCRIPT = Script(
    LAPSE_PRELUDE
    + """
local now = now_ms(now_us())
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[1]))
return {now, due}
"""
)


class DueLapses(msgspec.Struct, frozen=True):
    """What the lapse index listed as due: the store's clock then, and each wallet due with its
    score, longest due first."""

    at_ms: int
    wallets: dict[str, int]


class WalletLapse(msgspec.Struct, frozen=True):
    """What a visit to one wallet's credit (:func:`lapse_credit`) did and found."""

    lapsed: int | None
    """The balance it lapsed (0: none was left), or None: its lapse time has not passed."""
    found: int
    """The credit top-ups had found lapsed, counted now."""
    lapse_at_ms: int | None
    """When the credit left lapses (Unix ms), or None: none is left."""

    @property
    def counted(self) -> int:
        """All the credit this visit took out of the books."""
        return (self.lapsed or 0) + self.found


def restore_credit_call(
    account: CreditAccount,
    balance: int,
    lapse_at_ms: int,
    ttl_ms: int,
    mark: LedgerPosition | None,
    not_after_ms: int | None,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the restore-credit script (ValueError on an amount it cannot keep, or a
    balance not registered in the lapse index first)."""
    if checked_amount(balance) > 0 and not_after_ms is None:
        raise ValueError("restored credit is registered in its lapse index before it is set")
    mark_key = account.balance if mark is None else mark.key  # untouched without a mark
    entry_id = "0" if mark is None else str(mark.entry_id)
    deadline = "" if not_after_ms is None else str(not_after_ms)
    args = [str(balance), str(lapse_at_ms), str(max(1, ttl_ms)), entry_id, deadline]
    return [account.balance, account.holds, account.lapse, account.lapsed, mark_key], args


def take_credit_call(
    account: CreditAccount, token: str, amount: int, not_after_us: int | None, keep: Sequence[Entry] = ()
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the take-credit script (ValueError on an amount it cannot keep)."""
    deadline = "" if not_after_us is None else str(not_after_us)
    script_keys = [*credit_keys(account), taken_mark(account, token), *(entry.key for entry in keep)]
    args = [token, str(checked_amount(amount)), deadline]
    for entry in keep:
        args += [entry.value, str(checked_ttl(entry.ttl_ms))]
    return script_keys, args


def credit_change_from_reply(reply: object) -> CreditState | None:
    """The hold- or take-credit script's state after the change, or nil: nothing changed; a take
    past its deadline ('late') raises :class:`TakeTooLate`."""
    if reply in ("late", b"late"):
        raise TakeTooLate("the take reached the store after its deadline: nothing was taken")
    return None if reply is None else credit_state_from_reply(reply)


def open_credit_session_call(key: str, wallet: str, cap: int, ttl_ms: int) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the open-credit-session script (ValueError on a cap or TTL it cannot keep)."""
    return [key], [wallet, str(checked_amount(cap)), str(checked_ttl(ttl_ms))]


def spend_credit_session_call(
    spend: CreditSessionSpend, buckets: Sequence[Bucket]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the spend-credit-session script."""
    hold = spend.hold
    args = [hold.account.wallet, hold.token, str(hold.amount), str(hold.ttl_ms)]
    for bucket in buckets:
        args += [str(bucket.limit), str(bucket.period_ms), "1" if bucket.guard else "0"]
    return [spend.session, *credit_keys(hold.account), *(bucket.key for bucket in buckets)], args


def _whole(value: object) -> int:
    """An integer reply, or an integer's text (a hash field); anything else is garbage."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise StoreUnavailable("state store answered a credit session script with garbage")


def _waits(value: object) -> list[RateDecision]:
    if not isinstance(value, list):
        raise StoreUnavailable("state store answered a credit session script with garbage")
    return [RateDecision(allowed=w == 0, retry_after_ms=w) for w in map(_whole, value)]


def session_lookup_from_reply(reply: object) -> SessionLookup:
    """The spend-credit-session script's outcome and what goes with it; anything else is garbage."""
    if isinstance(reply, list) and reply and isinstance(reply[0], str):
        match reply:
            case ["unknown"]:
                return SessionLookup(SessionSpent.UNKNOWN)
            case ["uncovered"]:
                return SessionLookup(SessionSpent.UNCOVERED)
            case ["cap", cap, spent]:
                return SessionLookup(SessionSpent.CAP, spent=_whole(spent), cap=_whole(cap))
            case ["limited", waits]:
                return SessionLookup(SessionSpent.LIMITED, _waits(waits))
            case ["spent", waits, state, spent, cap]:
                held = credit_state_from_reply(state)
                return SessionLookup(SessionSpent.SPENT, _waits(waits), held, _whole(spent), _whole(cap))
    raise StoreUnavailable("state store answered the spend-credit-session script with garbage")


def session_state_from_reply(reply: object) -> CreditSessionState | None:
    """The revoke-credit-session script's ``{wallet, cap, spent}``, or nil: none was live."""
    if reply is None:
        return None
    if isinstance(reply, list) and len(reply) == 3 and isinstance(reply[0], str):
        return CreditSessionState(reply[0], _whole(reply[1]), _whole(reply[2]))
    raise StoreUnavailable("state store answered the revoke-credit-session script with garbage")


def _text_amount(value: object, script: str) -> int | None:
    """A whole amount's text ('' reads as None); anything else is garbage."""
    if value == "":
        return None
    if isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit():
        return int(value)
    raise StoreUnavailable(f"state store answered the {script} script with garbage")


def wallet_lapse_from_reply(reply: object) -> WalletLapse:
    """The lapse-credit script's ``{lapsed, found, lapse time}``; anything else is garbage."""
    if isinstance(reply, list) and len(reply) == 3:
        lapsed, found, lapse_at = (_text_amount(value, "lapse-credit") for value in reply)
        if found is not None:
            return WalletLapse(lapsed, found, lapse_at)
    raise StoreUnavailable("state store answered the lapse-credit script with garbage")


def due_from_reply(reply: object) -> DueLapses:
    """The due-lapses script's ``{clock, wallets and scores}``; anything else is garbage."""
    if isinstance(reply, list) and len(reply) == 2:
        at_ms, flat = reply
        if isinstance(at_ms, int) and isinstance(flat, list) and len(flat) % 2 == 0:
            try:
                wallets = {str(w): int(float(score)) for w, score in zip(flat[0::2], flat[1::2], strict=True)}
                return DueLapses(at_ms, wallets)
            except (TypeError, ValueError):
                pass
    raise StoreUnavailable("state store answered the due-lapses script with garbage")


def clock_from_reply(reply: object) -> int:
    """The register-lapses script's clock (Unix ms); anything else is garbage."""
    if isinstance(reply, int) and not isinstance(reply, bool) and reply > 0:
        return reply
    raise StoreUnavailable("state store answered the register-lapses script with garbage")


def register_lapses_call(index: str, lapses: Sequence[tuple[str, str, int]]) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the register-lapses script: per wallet its member, ``in`` (ms from now)
    or ``at`` (Unix ms) and the time."""
    args: list[str] = []
    for wallet, kind, when in lapses:
        if kind not in ("in", "at"):
            raise ValueError(f"a lapse is registered 'in' ms or 'at' a time, not {kind!r}")
        args += [wallet, kind, str(when)]
    return [index], args


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
        await store.run(CREDIT_STATE_SCRIPT, credit_keys(account), [])
    )


async def register_lapses(
    store: Store, index: str, lapses: Sequence[tuple[str, str, int]], window_ms: int = CREDIT_STEP_WINDOW_MS
) -> int:
    """The step before any credit: in one round trip, score each wallet of ``lapses`` (its
    member, ``in`` and ms from now or ``at`` and Unix ms) in the lapse ``index`` at the earlier
    of its score and that time, never before now. Answers the deadline (Unix ms on the store's
    clock) of the credit steps that follow: ``window_ms`` from now. A wallet is so never
    booked credit it is not indexed for, whatever step is lost after this one."""
    script_keys, args = register_lapses_call(index, lapses)
    return clock_from_reply(await store.run(REGISTER_LAPSES_SCRIPT, script_keys, args)) + window_ms


async def register_credits(
    store: Store, credits: Sequence[Credit], window_ms: int = CREDIT_STEP_WINDOW_MS
) -> list[Credit]:
    """``credits`` registered in their lapse indexes (one round trip per index), each with the
    deadline of its booking: what ``claim_then_put`` books."""
    deadlines: dict[str, int] = {}
    for index in dict.fromkeys(credit.index for credit in credits):
        lapses = [(c.account.wallet, "in", c.lapse_ms) for c in credits if c.index == index]
        deadlines[index] = await register_lapses(store, index, lapses, window_ms)
    return [msgspec.structs.replace(credit, not_after_ms=deadlines[credit.index]) for credit in credits]


async def due_lapses(store: Store, lapses: str, limit: int) -> DueLapses:
    """The wallets of the lapse index at ``lapses`` whose score has passed on the store's
    clock, with their scores, the longest due first, at most ``limit``. A hint: each one's own
    lapse time (:func:`lapse_credit`) says whether its credit lapsed."""
    return due_from_reply(await store.run(DUE_LAPSES_SCRIPT, [lapses], [str(limit)]))


async def lapse_credit(store: Store, account: CreditAccount) -> WalletLapse:
    """A sweep's visit to one wallet, atomically, in one round trip, on its keys alone: when its
    lapse time (read now: a top-up may have moved it) has passed, delete its balance, holds and
    lapse time; and drain what its top-ups found lapsed. Answers both amounts and the lapse time
    left, so the sweeper can fix the index. Each amount is answered once, however many sweepers
    race."""
    script_keys = [account.balance, account.holds, account.lapse, account.lapsed]
    return wallet_lapse_from_reply(await store.run(LAPSE_CREDIT_SCRIPT, script_keys, []))


async def fix_lapse_index(store: Store, index: str, wallet: str, listed: int, score: int | None) -> bool:
    """The step after a visit: in one round trip, while ``wallet`` is still scored ``listed`` in
    the lapse ``index`` (no top-up registered it since it was listed), score it ``score``, or
    drop it (None). True when it changed."""
    args = [wallet, str(listed), "" if score is None else str(score)]
    return bool(integer_from_reply(await store.run(FIX_LAPSE_INDEX_SCRIPT, [index], args)))


async def restore_credit(
    store: Store,
    account: CreditAccount,
    index: str,
    balance: int,
    lapse_at_ms: int,
    ttl_ms: int,
    mark: LedgerPosition | None = None,
) -> None:
    """Set the wallet's balance to exactly ``balance`` (the ledger's word, after the store lost
    data), lapsing at ``lapse_at_ms`` (Unix ms), its keys living ``ttl_ms``, its ledger mark at
    ``mark``; its holds and the lapsed credit its top-ups found are dropped (the ledger's balance
    holds it). Two steps: the wallet registered in the lapse ``index`` (a balance of 0 needs
    none), then its own keys set in one atomic round trip. A balance of 0 deletes the balance,
    its lapse time and mark."""
    deadline = None
    if balance > 0:
        deadline = await register_lapses(store, index, [(account.wallet, "at", lapse_at_ms)])
    script_keys, args = restore_credit_call(account, balance, lapse_at_ms, ttl_ms, mark, deadline)
    await store.run(RESTORE_CREDIT_SCRIPT, script_keys, args)


async def open_credit_session(store: Store, key: str, wallet: str, cap: int, ttl_ms: int) -> None:
    """Write the credit session at ``key``: ``wallet``, its signed ``cap`` and nothing spent,
    deleted ``ttl_ms`` from now (one atomic round trip)."""
    script_keys, args = open_credit_session_call(key, wallet, cap, ttl_ms)
    await store.run(OPEN_CREDIT_SESSION_SCRIPT, script_keys, args)


class _SessionSpend:
    """A session's spend as the own step of its wallet's tag: the session, its cap, the credit
    and the buckets named on the wallet's tag, in one script; what it found is kept for the
    caller, and its undo gives the hold and the cap back."""

    def __init__(self, spend: CreditSessionSpend) -> None:
        self.spend = spend
        named = [spend.session, *credit_keys(spend.hold.account)]
        self.tag = one_tag(named, "a credit session's spend") or ""
        self.found = SessionLookup(SessionSpent.UNKNOWN)

    async def run(self, store: Store, buckets: Sequence[Bucket]) -> Lookup:
        script_keys, args = spend_credit_session_call(self.spend, buckets)
        reply = await store.run(SPEND_CREDIT_SESSION_SCRIPT, script_keys, args)
        self.found = session_lookup_from_reply(reply)
        spent = self.found.outcome is SessionSpent.SPENT
        return Lookup([], self.found.decisions, written=spent, held=self.found.held)

    async def undo(self, store: Store) -> None:
        hold = self.spend.hold
        await refund_credit_session(store, self.spend.session, hold.account.holds, hold.token, hold.amount)


async def spend_credit_session(
    store: Store, spend: CreditSessionSpend, buckets: Sequence[Bucket]
) -> SessionLookup:
    """The session at ``spend.session`` live and the hold's wallet's (else ``UNKNOWN``), its cap
    less what it spent covering the amount (else ``CAP``), the wallet's free credit covering it
    as ``hold_credit`` decides (else ``UNCOVERED``), then one GCRA decision per bucket in order,
    stopping at the first refusal (``LIMITED``); and only when all allowed it, add the amount to
    the session's spent total and make the hold (``SPENT``). Atomic on the wallet's tag (the
    session is one of its keys) with the buckets named there; the buckets of other tags are
    ``check_then_limit``'s other steps, and a refusal there gives the hold and the cap back.
    So a refusal spends nothing (lapsed holds aside, forgotten), and concurrent calls on one
    session never spend more than its cap."""
    step = _SessionSpend(spend)
    found = await check_then_limit(store, [], buckets, own=step)
    if step.found.outcome in (SessionSpent.UNKNOWN, SessionSpent.CAP, SessionSpent.UNCOVERED):
        return step.found
    if not found.written:
        return SessionLookup(SessionSpent.LIMITED, found.decisions)
    return msgspec.structs.replace(step.found, decisions=found.decisions)


async def refund_credit_session(store: Store, key: str, holds: str, token: str, amount: int) -> None:
    """Atomically, in one round trip: drop ``token``'s hold at ``holds`` and, while the
    session at ``key`` is live, take ``amount`` off what it spent (never below 0): a call that
    took nothing gives its share of the cap back."""
    await store.run(REFUND_CREDIT_SESSION_SCRIPT, [key, holds], [token, str(amount)])


async def revoke_credit_session(store: Store, key: str) -> CreditSessionState | None:
    """Atomically, in one round trip: delete the session at ``key`` and answer what it was
    (its spent total counts the calls still in flight); None when there was none live."""
    return session_state_from_reply(await store.run(REVOKE_CREDIT_SESSION_SCRIPT, [key], []))
