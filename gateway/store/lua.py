"""What every domain's scripts share: the Lua preludes (the store's clock, GCRA, a wallet's live
balance and lapse, credit holds) and the checks on the server's common replies.

Each script is the one definition of its store behaviour, kept in its domain's module
(``gateway.store.limits``, ``.claims``, ``.holds``, ``.credit``): Redis, a Redis Cluster and
Upstash run it on the server, the memory store on its in-process Redis. The GCRA step runs
atomically inside the server so that every gateway process reads the same clock (``TIME``) and
the same theoretical arrival time (``tests/test_store_contract.py`` holds it to a reference
model). A reply of the wrong shape raises StoreUnavailable: callers fail closed rather than guess.
"""

from __future__ import annotations

from gateway.store.base import (
    MAX_AMOUNT,
    CreditAccount,
    CreditState,
    StoreUnavailable,
)

# Time is in microseconds (exact in Lua's doubles) so limits above 1000/s keep their value. A
# bucket's key expires when its TAT passes, at which point GCRA would treat it as "now" anyway.
# TIME before a write is safe: scripts replicate by effects (the default since Redis 5; enabled
# explicitly where the call still exists).
PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- One GCRA step on KEYS-named bucket: 0 when allowed (and counted, unless guard), else retry_after_ms.
local function interval_us(limit, period_ms)
  return math.max(math.floor(period_ms * 1000 / math.max(limit, 1)), 1)
end
local function set_tat(key, tat, now)
  redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000)))
end
local function gcra(key, limit, period_ms, now, guard)
  local interval = interval_us(limit, period_ms)
  local tat = now
  local stored = redis.call('GET', key)
  if stored then tat = math.max(tonumber(stored), now) end
  local new_tat = tat + interval
  local allow_at = new_tat - period_ms * 1000
  if allow_at > now then
    return math.ceil((allow_at - now) / 1000)
  end
  if not guard then set_tat(key, new_tat, now) end
  return 0
end
-- Hand one request back to a bucket (never below "now": an idle bucket stays idle).
local function refund(key, limit, period_ms, now)
  local stored = redis.call('GET', key)
  if not stored then return end
  local tat = tonumber(stored) - interval_us(limit, period_ms)
  if tat <= now then redis.call('DEL', key) else set_tat(key, tat, now) end
end
-- Charge one request whatever the limit: the debt is a longer wait.
local function debt(key, limit, period_ms, now)
  local tat = now
  local stored = redis.call('GET', key)
  if stored then tat = math.max(tonumber(stored), now) end
  set_tat(key, tat + interval_us(limit, period_ms), now)
end
"""

# A wallet's lapse: the key beside its balance holds the Unix ms (store clock) its credit lapses
# at, written with the balance by each top-up. A balance with no lapse key (written before lapse
# times were kept) lapses by its TTL alone.
LAPSE_PRELUDE = (
    PRELUDE
    + """
local function now_ms(now) return math.floor(now / 1000) end
-- The balance as spendable at at_ms (its text: exact past 2^53) and the ms left until it lapses:
-- nothing once its lapse time has passed, whether or not the sweeper has lapsed it yet.
local function live_balance(balance_key, lapse_key, at_ms)
  local lapse = redis.call('GET', lapse_key)
  local left = lapse and tonumber(lapse) - at_ms
  if left and left <= 0 then return '0', 0 end
  local balance = redis.call('GET', balance_key)
  if not balance then return '0', 0 end
  local ttl = redis.call('PTTL', balance_key)
  if left and (ttl < 0 or left < ttl) then ttl = left end
  return balance, ttl
end
-- Once the wallet's lapse time has passed: delete its balance, holds and lapse time and answer
-- the balance it had (its text, '0' when none); nil while it is not due.
local function lapse_if_due(balance_key, holds_key, lapse_key, at_ms)
  local lapse = redis.call('GET', lapse_key)
  if not lapse or tonumber(lapse) > at_ms then return nil end
  local amount = redis.call('GET', balance_key) or '0'
  redis.call('DEL', balance_key, holds_key, lapse_key)
  return amount
end
"""
)

# A credit's holds are hold sets like the hold script's (so ``unhold`` drops them too): field
# ``token``, valued "amount expires_us"; a taken hold leaves a key of its own (see the take). Every
# credit script takes KEYS balance, hold set, lapse time (one wallet's keys) and answers
# {balance (its text: exact past 2^53; '0' past its lapse time), the live holds, the ms left
# until it lapses}.
CREDIT_PRELUDE = (
    LAPSE_PRELUDE
    + """
-- The live holds at key: their sum leaving out token's own hold, and token's expiry while its
-- hold is live (else nil). Lapsed holds are deleted when prune is set.
local function credit_holds(key, token, now, prune)
  local others, own = 0, nil
  local fields = redis.call('HGETALL', key)
  for f = 1, #fields, 2 do
    local amount, expires = string.match(fields[f + 1], '^(%d+) (%d+)$')
    if not amount or tonumber(expires) <= now then
      if prune then redis.call('HDEL', key, fields[f]) end
    elseif fields[f] == token then
      own = expires
    else
      others = others + tonumber(amount)
    end
  end
  return others, own
end
"""
)

MAX_HOLD_AMOUNT = MAX_AMOUNT
"""Amounts and caps above this lose precision in Lua's doubles: caps are clamped to it."""


def credit_state_from_reply(reply: object) -> CreditState:
    """A credit script's ``{balance, held, ms left, store clock}`` (a negative time left reads as
    0); anything else is garbage."""
    if isinstance(reply, list) and len(reply) == 4:
        balance, held, ttl_ms, at_us = reply
        if isinstance(balance, str) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in (held, ttl_ms, at_us)
        ):
            try:
                return CreditState(balance=int(balance), held=held, ttl_ms=max(ttl_ms, 0), at_us=at_us)
            except ValueError:
                pass
    raise StoreUnavailable("state store answered a credit script with garbage")


def credit_keys(account: CreditAccount) -> list[str]:
    """KEYS of every credit script: the balance, its hold set and its lapse time."""
    return [account.balance, account.holds, account.lapse]


def text_from_reply(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise StoreUnavailable("state store answered a GET with garbage")


def integer_from_reply(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise StoreUnavailable("state store answered a counter with garbage")


def counters_from_reply(keys: list[str], values: object) -> dict[str, int]:
    """Absent counters are 0; a value that is not an integer means the keyspace is misused."""
    if not isinstance(values, list) or len(values) != len(keys):
        raise StoreUnavailable("state store answered MGET with garbage")
    result: dict[str, int] = {}
    for key, value in zip(keys, values, strict=True):
        try:
            result[key] = 0 if value is None else int(value)
        except (TypeError, ValueError):
            raise StoreUnavailable("state store holds a non-integer counter") from None
    return result


def totals_from_replies(keys: list[str], replies: object, per_key: int = 2) -> dict[str, int]:
    """The INCRBY totals of a pipeline of ``per_key`` commands per key, its INCRBY first (an
    ``INCRBY, PEXPIRE`` pair, or the INCRBY alone)."""
    if not isinstance(replies, list) or len(replies) != per_key * len(keys):
        raise StoreUnavailable("state store answered a counter pipeline with garbage")
    return {key: integer_from_reply(total) for key, total in zip(keys, replies[0::per_key], strict=True)}
