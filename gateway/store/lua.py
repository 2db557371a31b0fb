"""What the Redis and Upstash backends share: the GCRA script and the checks on server replies.

The script is ``gateway.store.memory.gcra()`` line for line, run atomically inside the server so
that every gateway process reads the same clock (``TIME``) and the same theoretical arrival time.
A reply of the wrong shape raises StoreUnavailable: callers fail closed rather than guess.
"""

from __future__ import annotations

import hashlib

from gateway.store.base import RateDecision, StoreUnavailable

# KEYS[1]: bucket key. ARGV[1]: limit, ARGV[2]: period_ms, ARGV[3] (optional): now in microseconds,
# which only the differential test against memory.gcra() passes; the gateway always uses the
# server clock. Time is in microseconds (exact in Lua's doubles) so limits above 1000/s keep their
# value. Reply: {1, 0} allowed, or {0, retry_after_ms}. The key expires when its TAT passes, at
# which point GCRA would treat it as "now" anyway. TIME before a write is safe: scripts replicate
# by effects (the default since Redis 5; enabled explicitly where the call still exists).
GCRA_SCRIPT = """
if redis.replicate_commands then redis.replicate_commands() end
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2]) * 1000
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local interval = math.max(math.floor(period / math.max(limit, 1)), 1)
local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then tat = math.max(tonumber(stored), now) end
local new_tat = tat + interval
local allow_at = new_tat - period
if allow_at > now then
  return {0, math.ceil((allow_at - now) / 1000)}
end
local ttl_ms = math.ceil((new_tat - now) / 1000)
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', string.format('%d', ttl_ms))
return {1, 0}
"""

GCRA_SHA1 = hashlib.sha1(GCRA_SCRIPT.encode()).hexdigest()


def decision_from_reply(reply: object) -> RateDecision:
    """Turn the script's ``{allowed, retry_after_ms}`` into a decision; anything else is garbage."""
    if (
        isinstance(reply, list)
        and len(reply) == 2
        and all(isinstance(item, int) and not isinstance(item, bool) for item in reply)
    ):
        allowed, retry_after_ms = reply
        if allowed == 1:
            return RateDecision(allowed=True)
        if allowed == 0 and retry_after_ms > 0:
            return RateDecision(allowed=False, retry_after_ms=retry_after_ms)
    raise StoreUnavailable("state store answered the rate-limit script with garbage")


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
