"""What every backend shares: the Lua scripts and the checks on server replies.

These scripts are the one definition of each store behaviour: Redis and Upstash run them on the
server, the memory store on its in-process Redis. The GCRA step runs atomically inside the server
so that every gateway process reads the same clock (``TIME``) and the same theoretical arrival
time (``tests/test_store_contract.py`` holds it to a reference model).
The two payment scripts do in one round trip what would otherwise take one per key.
A reply of the wrong shape raises StoreUnavailable: callers fail closed rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.base import (
    MAX_AMOUNT,
    POSITION_TTL_MS,
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
    RateDecision,
    Script,
    SessionLookup,
    SessionSpent,
    StoreUnavailable,
    TakeTooLate,
    checked_amount,
    checked_ttl,
    share_budgets,
    taken_mark,
)

# Time is in microseconds (exact in Lua's doubles) so limits above 1000/s keep their value. A
# bucket's key expires when its TAT passes, at which point GCRA would treat it as "now" anyway.
# TIME before a write is safe: scripts replicate by effects (the default since Redis 5; enabled
# explicitly where the call still exists).
_PRELUDE = """
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

# A wallet's lapse: its score in the lapse index is the Unix ms (store clock) its credit lapses
# at. A balance whose wallet is in no index (written before the index) lapses by its TTL alone.
_LAPSE_PRELUDE = (
    _PRELUDE
    + """
local function now_ms(now) return math.floor(now / 1000) end
-- The balance as spendable at at_ms (its text: exact past 2^53) and the ms left until it lapses:
-- nothing once its lapse time has passed, whether or not the sweeper has lapsed it yet.
local function live_balance(balance_key, index_key, wallet, at_ms)
  local lapse = redis.call('ZSCORE', index_key, wallet)
  local left = lapse and tonumber(lapse) - at_ms
  if left and left <= 0 then return '0', 0 end
  local balance = redis.call('GET', balance_key)
  if not balance then return '0', 0 end
  local ttl = redis.call('PTTL', balance_key)
  if left and (ttl < 0 or left < ttl) then ttl = left end
  return balance, ttl
end
-- Once the wallet's lapse time has passed: delete its balance and holds, drop it from the index
-- and answer the balance it had (its text, '0' when none); nil while it is not due.
local function lapse_if_due(balance_key, holds_key, index_key, wallet, at_ms)
  local lapse = redis.call('ZSCORE', index_key, wallet)
  if not lapse or tonumber(lapse) > at_ms then return nil end
  local amount = redis.call('GET', balance_key) or '0'
  redis.call('DEL', balance_key, holds_key)
  redis.call('ZREM', index_key, wallet)
  return amount
end
"""
)

# KEYS: the claims, then the puts, then per credit its balance, hold set, lapse index, lapsed
# hash and ledger position; ARGV: how many claims, how many credits, then value and ttl_ms per
# claim and put, then amount, lapse_ms, ttl_ms, wallet and ledger entry id (0: none) per credit.
# Reply: how many claims were set (all of them: the puts and credits were written too). A script
# is not rolled back when a command in it fails, so every balance is checked to be a counter, and
# every index to be a sorted set, before the first write: a failing INCRBY after the claims would
# leave a payment claimed and its credit lost. A ledger position is only ever raised.
CLAIM_THEN_PUT_SCRIPT = Script(
    _LAPSE_PRELUDE
    + """
local n, c = tonumber(ARGV[1]), tonumber(ARGV[2])
local entries = #KEYS - 5 * c
local first = 3 + 2 * entries
for j = 0, c - 1 do
  local k, a = entries + 5 * j, first + 5 * j
  local balance = redis.call('GET', KEYS[k + 1])
  if balance and not string.match(balance, '^-?%d+$') then
    return redis.error_reply('ERR credit to a balance that is not a counter')
  end
  redis.call('ZSCORE', KEYS[k + 3], ARGV[a + 3])
end
for i = 1, n do
  if not redis.call('SET', KEYS[i], ARGV[1 + 2 * i], 'NX', 'PX', ARGV[2 + 2 * i]) then return i - 1 end
end
for i = n + 1, entries do
  redis.call('SET', KEYS[i], ARGV[1 + 2 * i], 'PX', ARGV[2 + 2 * i])
end
local now = now_ms(now_us())
for j = 0, c - 1 do
  local k, a = entries + 5 * j, first + 5 * j
  local wallet = ARGV[a + 3]
  local gone = lapse_if_due(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], wallet, now)
  if gone and gone ~= '0' then redis.call('HINCRBY', KEYS[k + 4], wallet, gone) end
  redis.call('INCRBY', KEYS[k + 1], ARGV[a])
  redis.call('PEXPIRE', KEYS[k + 1], ARGV[a + 2])
  redis.call('ZADD', KEYS[k + 3], string.format('%d', now + tonumber(ARGV[a + 1])), wallet)
  local position = tonumber(ARGV[a + 4])
  if position > 0 and position > (tonumber(redis.call('GET', KEYS[k + 5]) or '0') or 0) then
    redis.call('SET', KEYS[k + 5], ARGV[a + 4], 'PX', '"""
    + str(POSITION_TTL_MS)
    + """')
  end
end
return n
"""
)

# KEYS: the n entries, then the r refund buckets, then the debt buckets. ARGV: n, r, the value per
# entry, then limit and period_ms per bucket. Reply: 1.
UNDO_CLAIM_SCRIPT = Script(
    _PRELUDE
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

# KEYS: the hold sets. ARGV: token, ttl_ms, then amount and cap per key. A hold is the field
# ``token`` of the key's hash, valued "amount expires_us". Reply: 1 when held everywhere, else 0.
HOLD_SCRIPT = Script(
    _PRELUDE
    + """
local now = now_us()
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  local total = 0
  local fields = redis.call('HGETALL', KEYS[i])
  for f = 1, #fields, 2 do
    local amount, expires = string.match(fields[f + 1], '^(%d+) (%d+)$')
    if not amount or tonumber(expires) <= now then
      redis.call('HDEL', KEYS[i], fields[f])
    elseif fields[f] ~= ARGV[1] then
      total = total + tonumber(amount)
    end
  end
  if total + tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[2 + 2 * i]) then return 0 end
end
local expires = string.format('%d', now + ttl * 1000)
for i = 1, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[1], ARGV[1 + 2 * i] .. ' ' .. expires)
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
"""
)

# A credit's holds are hold sets like the hold script's (so ``unhold`` drops them too): field
# ``token``, valued "amount expires_us"; a taken hold leaves a key of its own (see the take). Every
# credit script takes KEYS balance, hold set, lapse index and ARGV[1] the
# wallet, and answers {balance (its text: exact past 2^53; '0' past its lapse time), the live
# holds, the ms left until it lapses}.
_CREDIT_PRELUDE = (
    _LAPSE_PRELUDE
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

# Reply: the credit state. Reads only.
CREDIT_STATE_SCRIPT = Script(
    _CREDIT_PRELUDE
    + """
local now = now_us()
local held = credit_holds(KEYS[2], nil, now, false)
local balance, left = live_balance(KEYS[1], KEYS[3], ARGV[1], now_ms(now))
return {balance, held, left, now}
"""
)

# KEYS: the n checked keys, then the m buckets, then the puts, then (with a credit hold) the
# balance, its hold set and the lapse index, then the contention mark of each share bucket, in
# bucket order. ARGV: n, m, now in microseconds or "" (only the differential test against
# the reference GCRA passes a clock: the gateway always uses the server's), '1' with a credit hold
# else '', then limit, period_ms and kind per bucket (1: guard, 0: plain, 's<j>': a share of
# bucket j), then value and ttl_ms per put, then (with a hold) wallet, token, amount and ttl_ms.
# Reply: {values (nil where absent), retry_after_ms per bucket taken (0: allowed), 1 if the puts
# were written (and the hold made) else 0, and with a hold made the credit state after it}. The
# credit is checked before any bucket, so a wallet whose credit does not cover the hold spends
# nothing shared. A share binds (is a GCRA bucket) only while its mark names another subject
# (share bucket key) refused by bucket j within j's period; else it allows and is charged up
# to full, never past. A refusal gives the shares charged before it back as they were, and a
# bucket j that refuses records each of its shares' subjects in their marks (hash subject ->
# µs), keeping the two latest distinct (``base.MAX_CONTENDERS``).
CHECK_THEN_LIMIT_SCRIPT = Script(
    _CREDIT_PRELUDE
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
  local others = credit_holds(KEYS[last_put + 2], ARGV[hold_at + 1], clock, true)
  local balance, left = live_balance(KEYS[last_put + 1], KEYS[last_put + 3], ARGV[hold_at], now_ms(clock))
  local amount = tonumber(ARGV[hold_at + 2])
  if tonumber(balance) - others < amount then return {values, waits, 0} end
  held = {balance, others + amount, left, clock}
  expires = string.format('%d', clock + tonumber(ARGV[hold_at + 3]) * 1000)
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
local holds, ttl = KEYS[last_put + 2], tonumber(ARGV[hold_at + 3])
redis.call('HSET', holds, ARGV[hold_at + 1], ARGV[hold_at + 2] .. ' ' .. expires)
if redis.call('PTTL', holds) < ttl then redis.call('PEXPIRE', holds, ttl) end
return {values, waits, 1, held}
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

# KEYS: the session, the balance, its hold set, the lapse index, then the buckets. ARGV: wallet,
# token, amount, the hold's ttl_ms, then limit, period_ms and guard (1 or 0) per bucket. Reply:
# {'unknown'} (no live session for this wallet), {'cap', cap, spent}, {'uncovered'},
# {'limited', retry_after_ms per bucket taken}, or {'spent', the decisions (0s), the credit state
# after the hold, the session's spent total, its cap}. Checks in that order, and writes nothing
# before the last: a refused call spends neither the session's cap, nor credit, nor a bucket.
SPEND_CREDIT_SESSION_SCRIPT = Script(
    _CREDIT_PRELUDE
    + """
local wallet, token, amount, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local session = redis.call('HMGET', KEYS[1], 'wallet', 'cap', 'spent')
if session[1] ~= wallet or not session[2] or not session[3] then return {'unknown'} end
if tonumber(session[2]) - tonumber(session[3]) < amount then return {'cap', session[2], session[3]} end
local clock = now_us()
local others = credit_holds(KEYS[3], token, clock, true)
local balance, left = live_balance(KEYS[2], KEYS[4], wallet, now_ms(clock))
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

# ARGV: wallet, token, amount, the deadline on the store's clock (µs; empty: none), then value and
# ttl_ms per entry to keep. Reply: the credit state after the take, nil when nothing was taken, or
# 'late' past the deadline. KEYS[4]: the token's taken mark, set while its hold would have lived;
# KEYS[5...]: the entries written with the take (a call's answer), and only with it.
TAKE_CREDIT_SCRIPT = Script(
    _CREDIT_PRELUDE
    + """
local token, amount = ARGV[2], tonumber(ARGV[3])
local now = now_us()
if ARGV[4] ~= '' and now > tonumber(ARGV[4]) then return 'late' end
local others, own = credit_holds(KEYS[2], token, now, true)
if not own and redis.call('EXISTS', KEYS[4]) == 1 then return false end
local balance, left = live_balance(KEYS[1], KEYS[3], ARGV[1], now_ms(now))
if tonumber(balance) - others < amount then return false end
if own then
  redis.call('SET', KEYS[4], '1', 'PX', math.max(1, math.floor((tonumber(own) - now) / 1000)))
  redis.call('HDEL', KEYS[2], token)
end
if amount > 0 then
  redis.call('DECRBY', KEYS[1], ARGV[3])
  balance = redis.call('GET', KEYS[1])
end
for i = 5, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2 * i - 5], 'PX', ARGV[2 * i - 4])
end
return {balance, others, left, now}
"""
)

# KEYS: the balance, its hold set, the lapse index. ARGV: the wallet. Reply: the balance lapsed
# (its text), or nil when the wallet is not due.
LAPSE_CREDIT_SCRIPT = Script(
    _LAPSE_PRELUDE
    + """
local gone = lapse_if_due(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now_ms(now_us()))
if not gone then return false end
return gone
"""
)

# KEYS: the balance, its hold set, the lapse index; ARGV: wallet, balance, lapse time (Unix ms),
# the balance key's ttl_ms. Reply: 1.
RESTORE_CREDIT_SCRIPT = Script("""
redis.call('DEL', KEYS[2])
if tonumber(ARGV[2]) <= 0 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
""")

# KEYS[1]: the lapse index; ARGV[1]: the most wallets to answer. Reply: the wallets due, longest due
# first.
DUE_LAPSES_SCRIPT = Script(
    _LAPSE_PRELUDE
    + """
local now = string.format('%d', now_ms(now_us()))
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)

# KEYS[1]: the lapsed hash. Reply: its fields and values, flat; it is deleted.
DRAIN_LAPSED_SCRIPT = Script("""
local lapsed = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return lapsed
""")

# KEYS[1]: the lock; ARGV[1]: the holder's token. Reply: 1 when deleted, else 0.
RELEASE_SCRIPT = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")

# KEYS: hold sets; ARGV[1]: the token whose hold to drop at each. Reply: 1.
UNHOLD_SCRIPT = Script("""
for i = 1, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
return 1
""")

MAX_HOLD_AMOUNT = MAX_AMOUNT
"""Amounts and caps above this lose precision in Lua's doubles: caps are clamped to it."""


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
        args += [hold.account.wallet, hold.token, str(hold.amount), str(hold.ttl_ms)]
    return [*script_keys, *marks], args


def claim_then_put_call(
    claims: Sequence[Entry], puts: Sequence[Entry], credits: Sequence[Credit] = ()
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the claim-then-put script."""
    entries = [*claims, *puts]
    args = [str(len(claims)), str(len(credits))]
    for entry in entries:
        args += [entry.value, str(entry.ttl_ms)]
    script_keys = [entry.key for entry in entries]
    for credit in credits:
        account, position = credit.account, credit.position
        entry_id = "0" if position is None else str(position.entry_id)
        args += [str(credit.amount), str(credit.lapse_ms), str(credit.ttl_ms), account.wallet, entry_id]
        mark = account.balance if position is None else position.key  # untouched without a position
        script_keys += [account.balance, account.holds, account.lapses, account.lapsed, mark]
    return script_keys, args


def undo_claim_call(
    entries: Sequence[Entry], refunds: Sequence[Bucket], debts: Sequence[Bucket]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the undo-claim script."""
    args = [str(len(entries)), str(len(refunds)), *(entry.value for entry in entries)]
    for bucket in (*refunds, *debts):
        args += [str(bucket.limit), str(bucket.period_ms)]
    keys = [entry.key for entry in entries] + [bucket.key for bucket in (*refunds, *debts)]
    return keys, args


def hold_call(holds: Sequence[Hold], token: str, ttl_ms: int) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the hold script."""
    args = [token, str(ttl_ms)]
    for hold in holds:
        args += [str(min(hold.amount, MAX_HOLD_AMOUNT)), str(min(hold.cap, MAX_HOLD_AMOUNT))]
    return [hold.key for hold in holds], args


def held_from_reply(reply: object) -> bool:
    """The hold script's 1 (held) or 0; anything else is garbage."""
    if reply in (0, 1) and not isinstance(reply, bool):
        return reply == 1
    raise StoreUnavailable("state store answered the hold script with garbage")


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
    """KEYS of every credit script: the balance, its hold set and the lapse index."""
    return [account.balance, account.holds, account.lapses]


def restore_credit_call(
    account: CreditAccount, balance: int, lapse_at_ms: int, ttl_ms: int
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the restore-credit script (ValueError on an amount it cannot keep)."""
    args = [account.wallet, str(checked_amount(balance)), str(lapse_at_ms), str(max(1, ttl_ms))]
    return credit_keys(account), args


def take_credit_call(
    account: CreditAccount, token: str, amount: int, not_after_us: int | None, keep: Sequence[Entry] = ()
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the take-credit script (ValueError on an amount it cannot keep)."""
    deadline = "" if not_after_us is None else str(not_after_us)
    script_keys = [*credit_keys(account), taken_mark(account, token), *(entry.key for entry in keep)]
    args = [account.wallet, token, str(checked_amount(amount)), deadline]
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


def lapsed_from_reply(reply: object) -> int | None:
    """The lapse-credit script's balance lapsed, or nil: not due; anything else is garbage."""
    if reply is None:
        return None
    if isinstance(reply, str):
        try:
            return int(reply)
        except ValueError:
            pass
    raise StoreUnavailable("state store answered the lapse-credit script with garbage")


def wallets_from_reply(reply: object) -> list[str]:
    """The due-lapses script's wallets; anything else is garbage."""
    if isinstance(reply, list) and all(isinstance(wallet, str) for wallet in reply):
        return list(reply)
    raise StoreUnavailable("state store answered the due-lapses script with garbage")


def drained_from_reply(reply: object) -> dict[str, int]:
    """The drain-lapsed script's flat fields and values; anything else is garbage."""
    if isinstance(reply, list) and len(reply) % 2 == 0 and all(isinstance(v, str) for v in reply):
        try:
            return {wallet: int(amount) for wallet, amount in zip(reply[0::2], reply[1::2], strict=True)}
        except ValueError:
            pass
    raise StoreUnavailable("state store answered the drain-lapsed script with garbage")


def unheld_from_reply(reply: object) -> None:
    """The unhold script's 1; anything else is garbage."""
    if reply != 1 or isinstance(reply, bool):
        raise StoreUnavailable("state store answered the unhold script with garbage")


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


def claimed_from_reply(count: int, reply: object) -> int:
    """The claim-then-put script's count of claims set; anything else is garbage."""
    if isinstance(reply, int) and not isinstance(reply, bool) and 0 <= reply <= count:
        return reply
    raise StoreUnavailable("state store answered the claim-then-put script with garbage")


def text_from_reply(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise StoreUnavailable("state store answered a GET with garbage")


def released_from_reply(reply: object) -> bool:
    """The release script's 1 (deleted) or 0; anything else is garbage."""
    if reply in (0, 1) and not isinstance(reply, bool):
        return reply == 1
    raise StoreUnavailable("state store answered the release script with garbage")


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
