"""Rate limits and the claims they guard: one step that reads what must be absent, charges the
buckets and writes the claims, and its undo: their scripts (``CHECK_THEN_LIMIT_SCRIPT``,
``UNDO_CLAIM_SCRIPT``, on the shared preludes of ``gateway.store.lua``), the functions that run them
on any backend (:meth:`Store.run`) and the checks on their replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.store.base import (
    Bucket,
    CreditHoldOrder,
    Entry,
    Lookup,
    RateDecision,
    Script,
    Store,
    StoreUnavailable,
    share_budgets,
)
from gateway.store.holds import unhold
from gateway.store.lua import CREDIT_PRELUDE, PRELUDE, credit_keys, credit_state_from_reply, text_from_reply
from gateway.store.slots import hash_tag, one_tag

# KEYS: the n entries, then the r refund buckets, then the debt buckets. ARGV: n, r, the value per
# entry, then limit and period_ms per bucket. Reply: 1.
UNDO_CLAIM_SCRIPT = Script(
    PRELUDE
    + """
local n, r = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[2 + i] then redis.call('DEL', KEYS[i]) end
end
local now = now_us()
for j = 1, #KEYS - n do
  local at = 1 + n + 2 * j
  local limit, period_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  if j <= r then refund(KEYS[n + j], limit, period_ms, now) else debt(KEYS[n + j], limit, period_ms, now) end
end
return 1
"""
)


# KEYS: the n checked keys, then the m buckets, then the puts, then (with a credit hold) the
# balance, its hold set and its lapse time, then the contention mark of each share bucket, in
# bucket order. ARGV: n, m, now in microseconds or "" (only the differential test against
# the reference GCRA passes a clock: the gateway always uses the server's), '1' with a credit hold
# else '', then limit, period_ms and kind per bucket (1: guard, 0: plain, 's<j>': a share of
# bucket j), then value and ttl_ms per put, then (with a hold) token, amount and ttl_ms.
# Reply: {values (nil where absent), retry_after_ms per bucket taken (0: allowed), 1 if the puts
# were written (and the hold made) else 0, and with a hold made the credit state after it}. The
# credit is checked before any bucket, so a wallet whose credit does not cover the hold spends
# nothing shared. A share binds (is a GCRA bucket) only while its mark names another subject
# (share bucket key) refused by bucket j within j's period; else it allows and is charged up
# to full, never past. A refusal gives the shares charged before it back as they were, and a
# bucket j that refuses records each of its shares' subjects in their marks (hash subject ->
# µs), keeping the two latest distinct (``base.MAX_CONTENDERS``).
CHECK_THEN_LIMIT_SCRIPT = Script(
    CREDIT_PRELUDE
    + """
local n, m, ordered = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4] == '1'
local shares, s = {}, 0
for j = 1, m do
  local budget = string.match(ARGV[4 + 3 * j], '^s(%d+)$')
  if budget then
    s = s + 1
    shares[j] = {tonumber(budget), s}
  end
end
local function contended(mark, subject, now, period_ms)
  local fields = redis.call('HGETALL', mark)
  for f = 1, #fields, 2 do
    if fields[f] ~= subject and tonumber(fields[f + 1]) > now - period_ms * 1000 then return true end
  end
  return false
end
local function mark_contended(mark, subject, now, period_ms)
  redis.call('HSET', mark, subject, string.format('%d', now))
  local fields = redis.call('HGETALL', mark)
  if #fields > 4 then
    local oldest, at = nil, nil
    for f = 1, #fields, 2 do
      local t = tonumber(fields[f + 1])
      if not at or t < at then oldest, at = fields[f], t end
    end
    redis.call('HDEL', mark, oldest)
  end
  redis.call('PEXPIRE', mark, period_ms)
end
local function charge_share(key, limit, period_ms, now)
  local tat = now
  local stored = redis.call('GET', key)
  if stored then tat = math.max(tonumber(stored), now) end
  set_tat(key, math.min(tat + interval_us(limit, period_ms), now + period_ms * 1000), now)
end
local before = {}
local function restore(key, stored, now)
  if not stored or tonumber(stored) <= now then return redis.call('DEL', key) end
  set_tat(key, tonumber(stored), now)
end
local values, found = {}, false
for i = 1, n do
  values[i] = redis.call('GET', KEYS[i])
  if values[i] then found = true end
end
local waits = {}
if found then return {values, waits, 0} end
local last_put, held, hold_at, expires = #KEYS - s, nil, 0, ''
if ordered then
  last_put = #KEYS - s - 3
  hold_at = 5 + 3 * m + 2 * (last_put - n - m)
  local clock = now_us()
  local others = credit_holds(KEYS[last_put + 2], ARGV[hold_at], clock, true)
  local balance, left = live_balance(KEYS[last_put + 1], KEYS[last_put + 3], now_ms(clock))
  local amount = tonumber(ARGV[hold_at + 1])
  if tonumber(balance) - others < amount then return {values, waits, 0} end
  held = {balance, others + amount, left, clock}
  expires = string.format('%d', clock + tonumber(ARGV[hold_at + 2]) * 1000)
end
if m > 0 then
  local now = tonumber(ARGV[3]) or now_us()
  for j = 1, m do
    local at = 2 + 3 * j
    local key, limit, period_ms = KEYS[n + j], tonumber(ARGV[at]), tonumber(ARGV[at + 1])
    local share, wait = shares[j], nil
    if share then before[j] = redis.call('GET', key) end
    if share and not contended(KEYS[#KEYS - s + share[2]], key, now, tonumber(ARGV[3 + 3 * share[1]])) then
      charge_share(key, limit, period_ms, now)
      wait = 0
    else
      wait = gcra(key, limit, period_ms, now, ARGV[at + 2] == '1')
    end
    waits[j] = wait
    if wait > 0 then
      for i, of in pairs(shares) do
        if i < j then restore(KEYS[n + i], before[i], now) end
        if of[1] == j then mark_contended(KEYS[#KEYS - s + of[2]], KEYS[n + i], now, period_ms) end
      end
      return {values, waits, 0}
    end
  end
end
local first = 5 + 3 * m
for k = n + m + 1, last_put do
  local arg = first + 2 * (k - n - m - 1)
  redis.call('SET', KEYS[k], ARGV[arg], 'PX', ARGV[arg + 1])
end
if not held then return {values, waits, 1} end
local holds, ttl = KEYS[last_put + 2], tonumber(ARGV[hold_at + 2])
redis.call('HSET', holds, ARGV[hold_at], ARGV[hold_at + 1] .. ' ' .. expires)
if redis.call('PTTL', holds) < ttl then redis.call('PEXPIRE', holds, ttl) end
return {values, waits, 1, held}
"""
)


def check_then_limit_call(
    keys: Sequence[str],
    buckets: Sequence[Bucket],
    puts: Sequence[Entry] = (),
    now_us: int | None = None,
    hold: CreditHoldOrder | None = None,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the check-then-limit script (``now_us`` only for tests: else the server's
    clock)."""
    clock = "" if now_us is None else str(now_us)
    args = [str(len(keys)), str(len(buckets)), clock, "" if hold is None else "1"]
    marks: list[str] = []
    for bucket, budget in zip(buckets, share_budgets(buckets), strict=True):
        kind = "1" if bucket.guard else "0"
        if bucket.share is not None and budget is not None:
            kind = f"s{budget + 1}"
            marks.append(bucket.share.contention)
        args += [str(bucket.limit), str(bucket.period_ms), kind]
    for entry in puts:
        args += [entry.value, str(entry.ttl_ms)]
    script_keys = [*keys, *(bucket.key for bucket in buckets), *(entry.key for entry in puts)]
    if hold is not None:
        script_keys += credit_keys(hold.account)
        args += [hold.token, str(hold.amount), str(hold.ttl_ms)]
    return [*script_keys, *marks], args


def undo_claim_call(
    entries: Sequence[Entry], refunds: Sequence[Bucket], debts: Sequence[Bucket]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the undo-claim script."""
    args = [str(len(entries)), str(len(refunds)), *(entry.value for entry in entries)]
    for bucket in (*refunds, *debts):
        args += [str(bucket.limit), str(bucket.period_ms)]
    keys = [entry.key for entry in entries] + [bucket.key for bucket in (*refunds, *debts)]
    return keys, args


def undone_from_reply(reply: object) -> None:
    """The undo-claim script's 1; anything else is garbage."""
    if reply != 1 or isinstance(reply, bool):
        raise StoreUnavailable("state store answered the undo-claim script with garbage")


def lookup_from_reply(keys: Sequence[str], reply: object, hold_ordered: bool = False) -> Lookup:
    """The check-then-limit script's ``{values, waits, written}``, with the credit state after the
    hold when one was ordered and made; anything else is garbage."""
    if (
        isinstance(reply, list)
        and len(reply) == (4 if hold_ordered and reply[2:3] == [1] else 3)
        and isinstance(reply[0], list)
        and isinstance(reply[1], list)
        and reply[2] in (0, 1)
        and not isinstance(reply[2], bool)
    ):
        raw_values, waits, written = reply[:3]
        values = [text_from_reply(v) for v in raw_values]
        held = credit_state_from_reply(reply[3]) if len(reply) == 4 else None
        # Lua drops trailing nils from a table: absent keys at the end are simply missing.
        if len(values) <= len(keys) and all(isinstance(w, int) and not isinstance(w, bool) for w in waits):
            values += [None] * (len(keys) - len(values))
            decisions = [RateDecision(allowed=w == 0, retry_after_ms=w) for w in waits]
            return Lookup(values=values, decisions=decisions, written=written == 1, held=held)
    raise StoreUnavailable("state store answered the check-then-limit script with garbage")


class OwnStep(Protocol):
    """A caller's own step on one hash tag, run in place of the plain check there (a credit
    session's spend): charged the buckets named on its tag, taken back by :meth:`undo`."""

    @property
    def tag(self) -> str: ...

    async def run(self, store: Store, buckets: Sequence[Bucket]) -> Lookup:
        """The step's decisions on ``buckets`` (in order, stopping at a refusal), ``written``
        when it admitted the request, and nothing decided and nothing written when it refused
        it before any bucket."""

    async def undo(self, store: Store) -> None:
        """Take back what a written step wrote and held (its buckets are refunded apart)."""


@dataclass(frozen=True, slots=True)
class _Step:
    """The part of a check-then-limit on one hash tag: the checked keys, buckets (their indices
    in the caller's order), puts and credit hold named on it, run as one script (or the
    caller's own step there)."""

    keys: tuple[int, ...]
    buckets: tuple[int, ...]
    puts: tuple[Entry, ...]
    hold: CreditHoldOrder | None
    shared: bool
    own: OwnStep | None = None
    call: tuple[list[str], list[str]] = ([], [])
    """The script's KEYS and ARGV (an own step makes its own)."""


def _steps(
    keys: Sequence[str],
    buckets: Sequence[Bucket],
    puts: Sequence[Entry],
    hold: CreditHoldOrder | None,
    own: OwnStep | None,
) -> list[_Step]:
    """One step per hash tag, in order of first appearance; ValueError when a step's keys would
    still span tags (a share's mark or budget on another tag than the share) or a hold's do."""
    hold_tag = None if hold is None else one_tag(credit_keys(hold.account), "a credit hold")
    if own is not None:
        hold_tag = own.tag
    tags: dict[str, tuple[list[int], list[int], list[Entry]]] = {}
    for i, key in enumerate(keys):
        tags.setdefault(hash_tag(key), ([], [], []))[0].append(i)
    for j, bucket in enumerate(buckets):
        tags.setdefault(hash_tag(bucket.key), ([], [], []))[1].append(j)
    for entry in puts:
        tags.setdefault(hash_tag(entry.key), ([], [], []))[2].append(entry)
    if hold_tag is not None:
        tags.setdefault(hold_tag, ([], [], []))
    steps = []
    for tag, (at, taken, written) in tags.items():
        shared = any(buckets[j].shared for j in taken)
        if own is not None and tag == own.tag:
            if at or written or shared:
                raise ValueError("an own step takes no checked key, put nor shared bucket of its tag")
            steps.append(_Step((), tuple(taken), (), None, False, own))
            continue
        step_hold = hold if tag == hold_tag else None
        named = [keys[i] for i in at], [buckets[j] for j in taken]
        call = check_then_limit_call(*named, written, hold=step_hold)
        one_tag(call[0], "a check-then-limit step")
        steps.append(_Step(tuple(at), tuple(taken), tuple(written), step_hold, shared, call=call))
    return steps


async def _run_step(store: Store, step: _Step, keys: Sequence[str], buckets: Sequence[Bucket]) -> Lookup:
    if step.own is not None:
        return await step.own.run(store, [buckets[j] for j in step.buckets])
    reply = await store.run(CHECK_THEN_LIMIT_SCRIPT, *step.call)
    return lookup_from_reply([keys[i] for i in step.keys], reply, step.hold is not None)


def _charged(step: _Step, found: Lookup, buckets: Sequence[Bucket]) -> list[int]:
    """The buckets (indices) the step charged: those it allowed, guards aside; a step that refused
    gave its shares back itself."""
    refused = found.refused is not None
    return [
        j
        for j, decision in zip(step.buckets, found.decisions, strict=False)
        if decision.allowed and not buckets[j].guard and not (refused and buckets[j].share is not None)
    ]


async def _compensate(
    store: Store, ran: Sequence[tuple[_Step, Lookup]], buckets: Sequence[Bucket], keep: Callable[[int], bool]
) -> None:
    """Take back what the steps that ran did for a request that is not admitted after all: the
    puts they wrote, the holds they made, and each charge ``keep`` does not keep (one script per
    step, on its tag; the steps at once)."""
    undos = []
    for step, found in ran:
        entries = step.puts if found.written else ()
        refunds = [buckets[j] for j in _charged(step, found, buckets) if not keep(j)]
        if entries or refunds:
            undos.append(undo_claim(store, entries, refunds))
        if step.hold is not None and found.held is not None:
            undos.append(unhold(store, [step.hold.account.holds], step.hold.token))
        if step.own is not None and found.written:
            undos.append(step.own.undo(store))
    await _all(undos)


async def _all(calls: Sequence[Awaitable[object]]) -> list[object]:
    """Await every call, all of them even when one fails, then raise the first failure."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


async def check_then_limit(
    store: Store,
    keys: Sequence[str],
    buckets: Sequence[Bucket],
    puts: Sequence[Entry] = (),
    hold: CreditHoldOrder | None = None,
    own: OwnStep | None = None,
) -> Lookup:
    """The values at ``keys``; only when every one is absent (and, with a ``hold``, only when
    the account's free credit covers it, as ``hold_credit`` decides), one GCRA decision per
    bucket in order, stopping at the first refusal (so no later bucket is charged for a request
    that will be refused); and only when every bucket allowed it too, write every put and make
    the hold. A put on a checked key is therefore a claim: exactly one of many concurrent
    callers writes it. Credit that does not cover the hold leaves ``written`` false with no
    decision and nothing changed (lapsed holds aside, forgotten).

    Atomic per hash tag: what is named on one tag is one script (one round trip, one step on a
    cluster). Several tags are several steps: first those of the client's own buckets, claims
    and hold, all at once; then each step of shared buckets, in order, only once all of those
    admitted the request. When one step finds a key, finds the credit short or refuses, what the
    others did is taken back (a compensating step per tag): their claims deleted, their holds
    dropped, every charge the one script would not have made handed back. So the outcome is the
    one script's; a process that dies between the steps leaves claims and holds to lapse and
    charges on the client's own buckets (``docs/store.md``)."""
    steps = _steps(keys, buckets, puts, hold, own)
    if len(steps) == 1:
        return await _run_step(store, steps[0], keys, buckets)
    stages = [[step for step in steps if not step.shared]]
    stages += [[step] for step in sorted((s for s in steps if s.shared), key=lambda s: s.buckets[0])]
    ran: list[tuple[_Step, Lookup]] = []
    decisions: dict[int, RateDecision] = {}
    for stage in stages:
        replies = await asyncio.gather(
            *(_run_step(store, step, keys, buckets) for step in stage), return_exceptions=True
        )
        failure = next((r for r in replies if isinstance(r, BaseException)), None)
        ran += [(s, r) for s, r in zip(stage, replies, strict=True) if not isinstance(r, BaseException)]
        if failure is not None:
            await _compensate(store, ran, buckets, keep=_nothing)
            raise failure
        values = _values(keys, ran)
        for step, found in ran:
            decisions.update(zip(step.buckets, found.decisions, strict=False))
        refused = [j for j, decision in decisions.items() if not decision.allowed]
        if any(v is not None for v in values) or any(_uncovered(step, found) for step, found in ran):
            await _compensate(store, ran, buckets, keep=_nothing)
            return Lookup(values=values, decisions=[])
        if refused:
            first = min(refused)
            await _compensate(store, ran, buckets, keep=_before(first, buckets))
            return Lookup(values=values, decisions=[decisions[j] for j in range(first + 1)])
    held = next((found.held for step, found in ran if step.hold is not None or step.own is not None), None)
    every = [decisions[j] for j in range(len(buckets))]
    return Lookup(values=_values(keys, ran), decisions=every, written=True, held=held)


def _uncovered(step: _Step, found: Lookup) -> bool:
    """The step's credit hold (or own step) refused the request before any bucket decided."""
    return (step.hold is not None or step.own is not None) and not found.written and not found.decisions


def _nothing(index: int) -> bool:
    return False


def _before(first: int, buckets: Sequence[Bucket]) -> Callable[[int], bool]:
    """What a refusal by bucket ``first`` keeps, as the one script would: the charges before it,
    shares aside (a refusal gives those back)."""
    return lambda j: j < first and buckets[j].share is None


def _values(keys: Sequence[str], ran: Sequence[tuple[_Step, Lookup]]) -> list[str | None]:
    values: list[str | None] = [None] * len(keys)
    for step, found in ran:
        for i, value in zip(step.keys, found.values, strict=True):
            values[i] = value
    return values


async def undo_claim(
    store: Store, entries: Sequence[Entry], refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
) -> None:
    """Delete each entry's key while it still holds the entry's value; hand one request back to
    each ``refunds`` bucket (a spend that turned out not to be owed); charge each ``debts``
    bucket one request even past its limit, so a burst that slipped past a guard is paid for by
    a longer wait, never forgiven. One script per hash tag, all at once (one round trip)."""
    tags: dict[str, tuple[list[Entry], list[Bucket], list[Bucket]]] = {}
    for entry in entries:
        tags.setdefault(hash_tag(entry.key), ([], [], []))[0].append(entry)
    for bucket in refunds:
        tags.setdefault(hash_tag(bucket.key), ([], [], []))[1].append(bucket)
    for bucket in debts:
        tags.setdefault(hash_tag(bucket.key), ([], [], []))[2].append(bucket)
    await _all([_undo(store, *parts) for parts in tags.values()])


async def _undo(
    store: Store, entries: Sequence[Entry], refunds: Sequence[Bucket], debts: Sequence[Bucket]
) -> None:
    script_keys, args = undo_claim_call(entries, refunds, debts)
    undone_from_reply(await store.run(UNDO_CLAIM_SCRIPT, script_keys, args))
