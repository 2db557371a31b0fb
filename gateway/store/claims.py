"""Claims and the records written with them: set-if-absent claims in order, then puts and credits
(a payment's delivery, a top-up's credit), and the release of a lock by its holder:
``CLAIM_THEN_PUT_SCRIPT`` and ``RELEASE_SCRIPT``, and the functions that run them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.store.base import Credit, Entry, Script, Store, StoreUnavailable
from gateway.store.credit import register_credits
from gateway.store.lua import LAPSE_PRELUDE
from gateway.store.slots import by_tag, hash_tag, one_tag

# KEYS: the claims, then the puts, then per credit its wallet's balance, hold set, lapse time,
# lapsed counter and ledger mark; ARGV: how many claims, how many credits, then value and ttl_ms
# per claim and put, then amount, lapse_ms, ttl_ms, deadline (Unix ms) and ledger entry id (0:
# none) per credit. Reply: how many claims were set (all of them: the puts and credits were
# written too). A script is not rolled back when a command in it fails, so every credit's
# deadline is checked, and each of its counters to be one, before the first write: a failing
# INCRBY after the claims would leave a payment claimed and its credit lost. A credit touches
# its own wallet's keys only (the lapse index was written in a step before); a ledger mark is
# only ever raised.
CLAIM_THEN_PUT_SCRIPT = Script(
    LAPSE_PRELUDE
    + """
local n, c = tonumber(ARGV[1]), tonumber(ARGV[2])
local entries = #KEYS - 5 * c
local first = 3 + 2 * entries
local now = now_ms(now_us())
for j = 0, c - 1 do
  local k, a = entries + 5 * j, first + 5 * j
  if now > tonumber(ARGV[a + 3]) then
    return redis.error_reply('ERR credit past its deadline: registered in the lapse index too long ago')
  end
  for _, at in ipairs({1, 3, 4, 5}) do
    local value = redis.call('GET', KEYS[k + at])
    if value and not string.match(value, '^-?%d+$') then
      return redis.error_reply('ERR credit to a balance that is not a counter')
    end
  end
end
for i = 1, n do
  if not redis.call('SET', KEYS[i], ARGV[1 + 2 * i], 'NX', 'PX', ARGV[2 + 2 * i]) then return i - 1 end
end
for i = n + 1, entries do
  redis.call('SET', KEYS[i], ARGV[1 + 2 * i], 'PX', ARGV[2 + 2 * i])
end
for j = 0, c - 1 do
  local k, a = entries + 5 * j, first + 5 * j
  local ttl = ARGV[a + 2]
  local gone = lapse_if_due(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], now)
  if gone and gone ~= '0' then
    redis.call('INCRBY', KEYS[k + 4], gone)
    if redis.call('PTTL', KEYS[k + 4]) < tonumber(ttl) then redis.call('PEXPIRE', KEYS[k + 4], ttl) end
  end
  redis.call('INCRBY', KEYS[k + 1], ARGV[a])
  redis.call('PEXPIRE', KEYS[k + 1], ttl)
  redis.call('SET', KEYS[k + 3], string.format('%d', now + tonumber(ARGV[a + 1])), 'PX', ttl)
  local position = tonumber(ARGV[a + 4])
  if position > 0 then
    local mark = math.max(position, tonumber(redis.call('GET', KEYS[k + 5]) or '0'))
    redis.call('SET', KEYS[k + 5], string.format('%d', mark), 'PX', ttl)
  end
end
return n
"""
)


# KEYS[1]: the lock; ARGV[1]: the holder's token. Reply: 1 when deleted, else 0.
RELEASE_SCRIPT = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


def claim_then_put_call(
    claims: Sequence[Entry], puts: Sequence[Entry], credits: Sequence[Credit] = ()
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the claim-then-put script (ValueError for a credit not registered in its
    lapse index first: :func:`gateway.store.credit.register_credits`)."""
    entries = [*claims, *puts]
    args = [str(len(claims)), str(len(credits))]
    for entry in entries:
        args += [entry.value, str(entry.ttl_ms)]
    script_keys = [entry.key for entry in entries]
    for credit in credits:
        if credit.not_after_ms is None:
            raise ValueError("a credit is registered in its lapse index before it is booked")
        account, position = credit.account, credit.position
        entry_id = "0" if position is None else str(position.entry_id)
        args += [str(credit.amount), str(credit.lapse_ms), str(credit.ttl_ms), str(credit.not_after_ms)]
        args.append(entry_id)
        mark = account.balance if position is None else position.key  # untouched without a position
        script_keys += [account.balance, account.holds, account.lapse, account.lapsed, mark]
    return script_keys, args


def claimed_from_reply(count: int, reply: object) -> int:
    """The claim-then-put script's count of claims set; anything else is garbage."""
    if isinstance(reply, int) and not isinstance(reply, bool) and 0 <= reply <= count:
        return reply
    raise StoreUnavailable("state store answered the claim-then-put script with garbage")


def released_from_reply(reply: object) -> bool:
    """The release script's 1 (deleted) or 0; anything else is garbage."""
    if reply in (0, 1) and not isinstance(reply, bool):
        return reply == 1
    raise StoreUnavailable("state store answered the release script with garbage")


async def claim_then_put(
    store: Store, claims: Sequence[Entry], puts: Sequence[Entry] = (), credits: Sequence[Credit] = ()
) -> int:
    """Set-if-absent each claim in order, stopping at the first key that exists; only when all
    were set, write every put and add every credit. A credit renews its balance: the wallet's
    lapse time moves to ``lapse_ms`` from now, and the counter's TTL to that plus ``grace_ms``; a
    balance already past its lapse time is lapsed first (it, and its holds, are deleted and its
    amount added to the wallet's ``lapsed`` counter for the sweeper to count), so a late top-up
    never revives lapsed credit. Returns how many claims were set (``len(claims)``: all of them,
    and the puts and credits were written).

    With credits, a step comes first: each wallet is registered in its lapse index
    (:func:`gateway.store.credit.register_credits`), so credit is never booked unindexed; the
    booking then carries that step's deadline (past it, ``StoreUnavailable`` and nothing
    written).

    The claims, the puts on their hash tag and the credits are one script, atomic: the claims
    and the credits must share that tag (ValueError otherwise: money is booked exactly when its
    claim is won). Puts on other tags are written once the claims are won, one script per tag
    at once (a process that dies in between leaves them unwritten); without claims, every tag's
    puts and credits are one script each, at once."""
    tag = one_tag([claim.key for claim in claims], "a claim-then-put's claims")
    credit_tags = [_credit_tag(credit) for credit in credits]
    if tag is not None and any(credit_tag != tag for credit_tag in credit_tags):
        raise ValueError("a claim-then-put's credits must share its claims' hash tag")
    if credits:
        credits = await register_credits(store, credits)
    if tag is None:
        writes = by_tag(puts, lambda put: put.key)
        booked: dict[str, list[Credit]] = {}
        for credit, credit_tag in zip(credits, credit_tags, strict=True):
            booked.setdefault(credit_tag, []).append(credit)
        tags = {*writes, *booked}
        steps = [_claim_then_put(store, (), writes.get(t, ()), booked.get(t, ())) for t in tags]
        await asyncio.gather(*steps)
        return 0
    later = by_tag([put for put in puts if hash_tag(put.key) != tag], lambda put: put.key)
    won = await _claim_then_put(store, claims, [put for put in puts if hash_tag(put.key) == tag], credits)
    if won == len(claims) and later:
        await asyncio.gather(*(_claim_then_put(store, (), group, ()) for group in later.values()))
    return won


def _credit_tag(credit: Credit) -> str:
    """The hash tag of every key a credit's booking writes (ValueError when they span several)."""
    account, position = credit.account, credit.position
    written = [account.balance, account.holds, account.lapse, account.lapsed]
    return one_tag(written + ([] if position is None else [position.key]), "a credit") or ""


async def _claim_then_put(
    store: Store, claims: Sequence[Entry], puts: Sequence[Entry], credits: Sequence[Credit]
) -> int:
    script_keys, args = claim_then_put_call(claims, puts, credits)
    return claimed_from_reply(len(claims), await store.run(CLAIM_THEN_PUT_SCRIPT, script_keys, args))


async def release(store: Store, key: str, token: str) -> bool:
    """Delete ``key`` only while it still holds ``token``; True when this call deleted it. A
    lock is released by its holder only, never by a former holder after it expired and
    another took it."""
    return released_from_reply(await store.run(RELEASE_SCRIPT, [key], [token]))
