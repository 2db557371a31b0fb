"""Capped holds: amounts held at keys (sets of holds) while each key's total stays within its cap,
each lapsing by itself (the fee guard's places and funds in flight; credit holds are dropped the
same way): ``HOLD_SCRIPT`` and ``UNHOLD_SCRIPT``, and the functions that run them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.store.base import Hold, Script, Store, StoreUnavailable
from gateway.store.lua import MAX_HOLD_AMOUNT, PRELUDE
from gateway.store.slots import by_tag

# KEYS: the hold sets. ARGV: token, ttl_ms, then amount and cap per key. A hold is the field
# ``token`` of the key's hash, valued "amount expires_us". Reply: 1 when held everywhere, else 0.
HOLD_SCRIPT = Script(
    PRELUDE
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


# KEYS: hold sets; ARGV[1]: the token whose hold to drop at each. Reply: 1.
UNHOLD_SCRIPT = Script("""
for i = 1, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
return 1
""")


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


def unheld_from_reply(reply: object) -> None:
    """The unhold script's 1; anything else is garbage."""
    if reply != 1 or isinstance(reply, bool):
        raise StoreUnavailable("state store answered the unhold script with garbage")


async def hold(store: Store, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
    """Forget the lapsed holds at each key; only when every key's live holds plus the new amount
    fit its cap, add a hold of that amount under ``token`` at every key, lapsing ``ttl_ms`` from
    now (so a holder that dies frees it by itself), and answer True; else answer False with
    nothing held. Atomic per hash tag: the keys of each tag are one script, the tags' scripts
    run at once (one round trip), and when one tag's refuses the holds the others made are
    dropped again (a holder that dies in between leaves them to lapse)."""
    if not holds:
        return True
    tags = list(by_tag(holds, lambda h: h.key).values())
    steps = (_hold(store, group, token, ttl_ms) for group in tags)
    held = await asyncio.gather(*steps, return_exceptions=True)
    if all(result is True for result in held):
        return True
    made = [h.key for group, result in zip(tags, held, strict=True) if result is True for h in group]
    await unhold(store, made, token)
    failure = next((result for result in held if isinstance(result, BaseException)), None)
    if failure is not None:
        raise failure
    return False


async def _hold(store: Store, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
    script_keys, args = hold_call(holds, token, ttl_ms)
    return held_from_reply(await store.run(HOLD_SCRIPT, script_keys, args))


async def unhold(store: Store, keys: Sequence[str], token: str) -> None:
    """Drop ``token``'s hold at each key (absent holds are ignored): one script per hash tag, at
    once (one round trip)."""
    groups = by_tag(keys, lambda key: key).values()
    replies = await asyncio.gather(*(store.run(UNHOLD_SCRIPT, group, [token]) for group in groups))
    for reply in replies:
        unheld_from_reply(reply)
