"""Claims and the records written with them: set-if-absent claims in order, then puts and credits
(a payment's delivery, a top-up's credit), and the release of a lock by its holder. The scripts
are ``CLAIM_THEN_PUT_SCRIPT`` and ``RELEASE_SCRIPT`` (``gateway.store.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.base import Credit, Entry, Store
from gateway.store.lua import (
    CLAIM_THEN_PUT_SCRIPT,
    RELEASE_SCRIPT,
    claim_then_put_call,
    claimed_from_reply,
    released_from_reply,
)


async def claim_then_put(
    store: Store, claims: Sequence[Entry], puts: Sequence[Entry] = (), credits: Sequence[Credit] = ()
) -> int:
    """Atomically, in one round trip: set-if-absent each claim in order, stopping at the first
    key that exists; only when all were set, write every put and add every credit. A credit
    renews its balance: the wallet's lapse time in the index moves to ``lapse_ms`` from now,
    and the counter's TTL to that plus ``grace_ms``; a balance already past its lapse time is
    lapsed first (it, and its holds, are deleted and its amount added to the account's
    ``lapsed`` for the sweeper to count), so a late top-up never revives lapsed credit.
    Returns how many claims were set (``len(claims)``: all of them, and the puts and credits
    were written)."""
    script_keys, args = claim_then_put_call(claims, puts, credits)
    return claimed_from_reply(len(claims), await store.run(CLAIM_THEN_PUT_SCRIPT, script_keys, args))


async def release(store: Store, key: str, token: str) -> bool:
    """Delete ``key`` only while it still holds ``token``; True when this call deleted it. A
    lock is released by its holder only, never by a former holder after it expired and
    another took it."""
    return released_from_reply(await store.run(RELEASE_SCRIPT, [key], [token]))
