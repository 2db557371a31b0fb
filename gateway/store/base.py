"""The store protocol every backend implements (``gateway.store`` opens one by URL), and the
shapes its domains' scripts speak.

The protocol is primitives plus one script runner (``run``). Semantics are shared by all
backends, which run the very same scripts, and pinned by ``tests/test_store_contract.py``:

* ``claim`` is an atomic set-if-absent with a TTL: exactly one caller wins, across processes.
* ``add_counts`` adds to expiring counters and reads their totals back in one round trip; the
  locally decided limits exchange their counts with it.
* ``gateway.store.limits``: ``check_then_limit`` and ``gateway.store.claims``: ``claim_then_put``
  run a payment's store work in one round trip each (what it must not find, then its buckets,
  then its claims; once settled, its delivery claim, then its records), atomically;
  ``undo_claim`` takes back a claim whose payment was refused, with the shared spends it made
  and the refusal it costs, in one round trip too. ``gateway.store.holds``: capped holds.
* ``gateway.store.credit``: prepaid credit is a wallet's balance counter plus holds against it
  (``hold_credit``, or a ``CreditHoldOrder`` made by ``check_then_limit`` with its other checks;
  ``take_credit``, ``credit_state``); a top-up is a ``Credit`` written by ``claim_then_put`` once
  its payment's claim is won, so a replayed top-up credits nothing. The balance is the
  operator's liability: every change is one atomic step on the store's clock, and no take
  overdraws it. Each top-up also records when the balance lapses, beside it; past that time the
  balance spends as nothing, and ``lapse_credit`` takes it out of the books with what top-ups
  found lapsed (``due_lapses`` lists the wallets due in the lapse index, the sweeper's hint,
  ``fix_lapse_index`` corrects it), so every lapse can be counted.
* A credit session is a hash of its wallet, the cap the wallet signed and the credit spent under
  it so far (``open_credit_session``); ``spend_credit_session`` is a credit hold that also
  checks the session is live, that its cap less what it spent covers the amount, and the route's
  buckets, then adds the amount to what it spent, in one atomic step; ``refund_credit_session``
  drops a hold and gives its amount back to the session; ``revoke_credit_session`` ends it.
* A rate limit is GCRA: up to ``limit`` requests in any ``period_ms`` window, with the
  allowance refilling evenly; one atomic decision per bucket, using the store's clock so that
  many gateway processes share one bucket exactly.
* Every failure to reach the backend raises :class:`StoreUnavailable`, so callers fail closed.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script a backend runs atomically (:meth:`Store.run`): sent by its SHA-1 once the
    server has it, by its source the first time."""

    source: str
    sha1: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha1", hashlib.sha1(self.source.encode()).hexdigest())


class StoreUnavailable(Exception):
    """The backend could not be reached or answered garbage; payments must fail closed."""


class RateDecision(msgspec.Struct, frozen=True):
    allowed: bool
    retry_after_ms: int = 0


class Entry(msgspec.Struct, frozen=True):
    """A value to write at ``key`` that expires ``ttl_ms`` after the write."""

    key: str
    value: str
    ttl_ms: int


class Share(msgspec.Struct, frozen=True):
    """What makes a bucket one subject's share of a budget other subjects share: it binds only
    while they wait for that budget, so a lone subject may use all of it."""

    budget: str
    """The key of the budget's bucket, charged later in the same step."""
    contention: str
    """The key of the share scope's contention mark: the (at most two) latest distinct subjects
    the budget refused, each with when; the share binds while one of them is another subject and
    was refused within the budget's period."""


class Bucket(msgspec.Struct, frozen=True):
    """A GCRA bucket: up to ``limit`` requests in any ``period_ms``."""

    key: str
    limit: int
    period_ms: int
    guard: bool = False
    """Checked but never charged here: refuses when one more charge would be refused. For a
    budget that something else spends (refused payments are charged to it after the fact)."""
    share: Share | None = None
    """A share of a later bucket's budget: while uncontended it allows and is charged up to full
    (never into debt), so once contention starts its subject gets its share's rate and no more."""
    shared: bool = False
    """Other clients spend it too (a route's budget, or a share of one): charged in a step after
    the client's own buckets, so a client over its own limit never spends what others share."""


STORE_TIMEOUT_S = 2.0
"""How long one store call may take before it is StoreUnavailable (``STATE_STORE_TIMEOUT_SECONDS``):
a request then fails closed with 503 ``store_unavailable`` instead of waiting on a hung store."""


MAX_CONTENDERS = 2
"""Distinct subjects a contention mark keeps: the latest refused one and, if that is the asking
subject itself, the latest other, which is all "another subject was refused" needs."""


def share_budgets(buckets: Sequence[Bucket]) -> list[int | None]:
    """Per bucket, the index of the budget it is a share of (None: not a share). The budget must
    come later in the same step: a share is decided, and charged, before what it is a share of."""
    at = {bucket.key: i for i, bucket in enumerate(buckets) if bucket.share is None}
    budgets: list[int | None] = []
    for i, bucket in enumerate(buckets):
        budget = None if bucket.share is None else at.get(bucket.share.budget)
        if bucket.share is not None and (budget is None or budget <= i):
            raise ValueError(f"share {bucket.key!r}: its budget is not a later bucket of the same step")
        budgets.append(budget)
    return budgets


class Hold(msgspec.Struct, frozen=True):
    """``amount`` held at ``key`` (a set of holds), as long as all the holds there stay within
    ``cap``: in-flight settlements against a balance, settlements in flight per payer."""

    key: str
    amount: int
    cap: int


MAX_AMOUNT = 2**53
"""Amounts above this lose precision in Lua's doubles: hold caps are clamped to it, and credit
amounts beyond it are refused (balances stay exact while they stay below it)."""


def checked_amount(amount: int) -> int:
    """``amount`` when it is a whole number the backends keep exactly; else ValueError. A negative
    credit or hold would move a balance past the checks that keep it from being overdrawn."""
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= MAX_AMOUNT:
        raise ValueError(f"a credit amount must be an integer from 0 to {MAX_AMOUNT}")
    return amount


def checked_ttl(ttl_ms: int) -> int:
    """``ttl_ms`` when positive; else ValueError (an expiry of 0 would delete the key at once)."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise ValueError("a credit's ttl_ms must be a positive integer")
    return ttl_ms


class CreditAccount(msgspec.Struct, frozen=True):
    """Where one wallet's prepaid credit lives in the store: its keys only, never a key another
    wallet's scripts touch (so a tag per wallet puts all of them on the wallet's one slot)."""

    wallet: str
    """Its member in the lapse index."""
    balance: str
    """The balance counter (micro-USDC)."""
    holds: str
    """The hold set of its calls in flight."""
    lapse: str
    """When the balance lapses (Unix ms on the store's clock), written with it by each top-up and
    living as long: the truth every credit script reads."""
    lapsed: str
    """A counter of the credit a top-up found already lapsed, kept until the sweeper counts it
    (``gateway.store.credit.lapse_credit``)."""


class LedgerPosition(msgspec.Struct, frozen=True):
    """How far into the ledger of record a wallet's credit goes: the journal id of the newest
    top-up booked for it, kept at ``key`` (the wallet's own) and only ever raised (a wallet found
    behind the ledger lost credit: see ``gateway.ledger.restore``)."""

    key: str
    entry_id: int


class Credit(msgspec.Struct, frozen=True):
    """Add ``amount`` to ``account``'s balance, which then lapses ``lapse_ms`` after this write
    (each top-up renews it). The wallet is first registered in the lapse ``index`` (a step of
    its own, ``gateway.store.credit.register_credits``, which sets ``not_after_ms``); the lapse
    time itself is written with the balance. The counter expires ``grace_ms`` after the lapse,
    a backstop should no sweeper ever lapse it (a silent, uncounted lapse: the grace must outlast
    any sweeper outage). ``position``: the top-up's place in the ledger, raised in the same step
    as the balance."""

    account: CreditAccount
    amount: int
    lapse_ms: int
    grace_ms: int
    index: str
    """The lapse index the wallet is registered in before its credit is booked."""
    position: LedgerPosition | None = None
    not_after_ms: int | None = None
    """The credit step's deadline on the store's clock (Unix ms), set by its registration in the
    index: a credit step that runs later books nothing (the sweeper may have dropped the wallet
    from the index meanwhile)."""

    def __post_init__(self) -> None:
        checked_amount(self.amount)
        checked_ttl(self.lapse_ms)
        if isinstance(self.grace_ms, bool) or not isinstance(self.grace_ms, int) or self.grace_ms < 0:
            raise ValueError("a credit's grace_ms must be a whole number of ms, 0 or more")

    @property
    def ttl_ms(self) -> int:
        """The balance counter's TTL: the lapse, then the grace."""
        return self.lapse_ms + self.grace_ms


class CreditHoldOrder(msgspec.Struct, frozen=True):
    """Hold ``amount`` of ``account``'s credit under ``token``, lapsing ``ttl_ms`` after it is made
    (on the store's clock): nothing renews a hold, so a holder that dies frees it by itself."""

    account: CreditAccount
    amount: int
    token: str
    ttl_ms: int

    def __post_init__(self) -> None:
        checked_amount(self.amount)
        checked_ttl(self.ttl_ms)


TAKEN_MARK = ":taken:"


def taken_mark(account: CreditAccount, token: str) -> str:
    """The key a taken credit hold leaves (lapsing when the hold would have), so a repeated take of
    that token takes nothing. A key of its own, never a field of the hold set: every hold and take
    reads the whole set, which must hold only the calls in flight, however busy the wallet."""
    return account.holds + TAKEN_MARK + token


class CreditState(msgspec.Struct, frozen=True):
    """A prepaid balance as one atomic read saw it."""

    balance: int
    """The counter's value (0 when absent or past its lapse time, swept or not)."""
    held: int
    """The sum of the live holds at the holds key."""
    ttl_ms: int
    """The time left until the balance lapses, in ms (0 when it has none)."""
    at_us: int = 0
    """The store's clock when the state was read or changed (µs): a take's deadline is counted
    from a hold's."""


class CreditSessionSpend(msgspec.Struct, frozen=True):
    """Spend ``hold.amount`` under the credit session at ``session`` (a hash: wallet, cap, spent)
    by making ``hold``, as long as the session is live, belongs to the hold's wallet and its cap
    less what it spent covers the amount."""

    session: str
    hold: CreditHoldOrder


class SessionSpent(enum.StrEnum):
    """What :meth:`Store.spend_credit_session` came to."""

    SPENT = "spent"
    UNKNOWN = "unknown"
    """No live session there for that wallet: never opened, expired or revoked."""
    CAP = "cap"
    """The session's cap less what it spent does not cover the amount."""
    UNCOVERED = "uncovered"
    """The wallet's free credit does not cover the amount."""
    LIMITED = "limited"
    """A bucket refused (the last decision)."""


class SessionLookup(msgspec.Struct, frozen=True):
    """What :meth:`Store.spend_credit_session` found: its outcome, a decision per bucket taken
    (when the session, its cap and the credit allowed the call), and once spent the credit's
    state after the hold and the session's spent total and cap."""

    outcome: SessionSpent
    decisions: list[RateDecision] = msgspec.field(default_factory=list)
    held: CreditState | None = None
    spent: int = 0
    cap: int = 0


class CreditSessionState(msgspec.Struct, frozen=True):
    """A credit session as one atomic read saw it."""

    wallet: str
    cap: int
    spent: int


class TakeTooLate(StoreUnavailable):
    """A take reached the store after its deadline, when its caller may have given up waiting:
    nothing was taken, exactly as if the store had not answered."""


class Lookup(msgspec.Struct, frozen=True):
    """What :meth:`Store.check_then_limit` found: the values at the checked keys, a decision
    per bucket taken (none when a checked key was present or the credit ordered held did not
    cover it; the last one refused, if any did), whether the puts were written (every key
    absent, the credit covered, every bucket allowed), and the credit's state after the hold
    when one was ordered and made."""

    values: list[str | None]
    decisions: list[RateDecision]
    written: bool = False
    held: CreditState | None = None

    @property
    def refused(self) -> RateDecision | None:
        last = self.decisions[-1] if self.decisions else None
        return last if last is not None and not last.allowed else None


class Store(Protocol):
    """Shared state: a handful of primitives and one script runner. What the gateway's domains
    do with it (claims guarded by rate limits, holds, prepaid credit, credit sessions) is their
    scripts, run through :meth:`run`: ``gateway.store.limits``, ``.claims``, ``.holds`` and
    ``.credit`` each own theirs."""

    timeout_s: float | None
    """How long the client waits for one command before it raises ``StoreUnavailable`` (None:
    in-process, never waited for)."""

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        """Set ``key`` to ``value`` only if absent; True when this call set it."""

    async def get(self, key: str) -> str | None:
        """The value at ``key``, or None when absent or expired."""

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        """Set ``key`` unconditionally with a TTL."""

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> object:
        """Run ``script`` over ``keys`` with ``args`` atomically, in one round trip, and answer its
        reply as the server gave it (decoded text, integers, nested lists; an error reply raises
        ``StoreUnavailable``). Every key must share one hash slot (on a cluster: one tag)."""

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        """Add each delta to its counter (no TTL) and return every counter's new value: one
        round trip, all or none (a transaction; on a cluster each counter on its own), for any
        number of counters."""

    async def counters(self, keys: list[str]) -> dict[str, int]:
        """Current values of the counters at ``keys`` (absent counters are 0)."""

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        """Add each delta to its window counter, which expires ``ttl_ms`` after this write, and
        return every counter's new total: one round trip for any number of keys."""

    async def ping(self) -> bool:
        """True when the backend answers."""

    async def close(self) -> None:
        """Release connections."""
