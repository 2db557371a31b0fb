"""Capped holds: amounts held at keys (sets of holds) while each key's total stays within its cap,
each lapsing by itself (the fee guard's places and funds in flight; credit holds are dropped the
same way). The scripts are ``HOLD_SCRIPT`` and ``UNHOLD_SCRIPT`` (``gateway.store.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.base import Hold, Store
from gateway.store.lua import HOLD_SCRIPT, UNHOLD_SCRIPT, held_from_reply, hold_call, unheld_from_reply


async def hold(store: Store, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
    """Atomically, in one round trip: forget the lapsed holds at each key; only when every
    key's live holds plus the new amount fit its cap, add a hold of that amount under
    ``token`` at every key, lapsing ``ttl_ms`` from now (so a holder that dies frees it by
    itself), and answer True; else change nothing and answer False."""
    if not holds:
        return True
    script_keys, args = hold_call(holds, token, ttl_ms)
    return held_from_reply(await store.run(HOLD_SCRIPT, script_keys, args))


async def unhold(store: Store, keys: Sequence[str], token: str) -> None:
    """Drop ``token``'s hold at each key (one round trip; absent holds are ignored)."""
    if keys:
        unheld_from_reply(await store.run(UNHOLD_SCRIPT, keys, [token]))
