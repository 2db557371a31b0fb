"""Rate limits and the claims they guard: one step that reads what must be absent, charges the
buckets and writes the claims, and its undo. The scripts are ``CHECK_THEN_LIMIT_SCRIPT`` and
``UNDO_CLAIM_SCRIPT`` (``gateway.store.lua``), run by any backend (:meth:`Store.run`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.base import Bucket, CreditHoldOrder, Entry, Lookup, Store
from gateway.store.lua import (
    CHECK_THEN_LIMIT_SCRIPT,
    UNDO_CLAIM_SCRIPT,
    check_then_limit_call,
    lookup_from_reply,
    undo_claim_call,
    undone_from_reply,
)


async def check_then_limit(
    store: Store,
    keys: Sequence[str],
    buckets: Sequence[Bucket],
    puts: Sequence[Entry] = (),
    hold: CreditHoldOrder | None = None,
) -> Lookup:
    """Atomically, in one round trip: the values at ``keys``; only when every one is absent
    (and, with a ``hold``, only when the account's free credit covers it, as ``hold_credit``
    decides), one GCRA decision per bucket in order, stopping at the first refusal (so
    nothing already used, and no later bucket, is charged for a request that will be
    refused); and only when every bucket allowed it too, write every put and make the hold.
    A put on a checked key is therefore a claim: exactly one of many concurrent callers
    writes it. Credit that does not cover the hold leaves ``written`` false with no decision
    and nothing changed (lapsed holds aside, forgotten)."""
    script_keys, args = check_then_limit_call(keys, buckets, puts, hold=hold)
    return lookup_from_reply(
        keys, await store.run(CHECK_THEN_LIMIT_SCRIPT, script_keys, args), hold is not None
    )


async def undo_claim(
    store: Store, entries: Sequence[Entry], refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
) -> None:
    """Atomically, in one round trip: delete each entry's key while it still holds the entry's
    value; hand one request back to each ``refunds`` bucket (a spend that turned out not to be
    owed); charge each ``debts`` bucket one request even past its limit, so a burst that slipped
    past a guard is paid for by a longer wait, never forgiven."""
    script_keys, args = undo_claim_call(entries, refunds, debts)
    undone_from_reply(await store.run(UNDO_CLAIM_SCRIPT, script_keys, args))
