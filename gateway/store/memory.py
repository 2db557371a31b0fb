"""The embedded in-process store: the default for local runs and the sandbox.

It serves exactly one process. Replay protection and rate limits would not hold across
workers, so ``serve --workers 2`` on it is refused by the CLI.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence

from gateway.store.base import (
    MAX_CONTENDERS,
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
    LedgerPosition,
    Lookup,
    RateDecision,
    SessionLookup,
    SessionSpent,
    TakeTooLate,
    checked_amount,
    checked_ttl,
    share_budgets,
    taken_mark,
)


def _now_us() -> int:
    return time.monotonic_ns() // 1_000


def _interval_us(limit: int, period_ms: int) -> int:
    return max(period_ms * 1_000 // max(limit, 1), 1)


def gcra(tat_us: int | None, now_us: int, limit: int, period_ms: int) -> tuple[RateDecision, int | None]:
    """One GCRA step: the decision and the new theoretical arrival time (None: unchanged).

    Time is in microseconds so limits above 1000 per second keep their value (a millisecond
    clock would round the emission interval to 1 ms). The Lua script of the Redis backends
    implements these same lines.
    """
    period_us = period_ms * 1_000
    interval = _interval_us(limit, period_ms)
    tat = max(tat_us if tat_us is not None else now_us, now_us)
    new_tat = tat + interval
    allow_at = new_tat - period_us
    if allow_at > now_us:
        return RateDecision(allowed=False, retry_after_ms=-(-(allow_at - now_us) // 1_000)), None
    return RateDecision(allowed=True), new_tat


class MemoryStore:
    """Dict-backed store; safe because one event loop owns it.

    Every write also records its expiry in a heap, and each write first drops what has expired,
    so memory stays bounded (one bucket per client IP) without a sweep that stalls the loop.
    """

    timeout_s: float | None = None

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, int]] = {}
        self._counters: dict[str, int] = {}
        self._tats: dict[str, int] = {}
        self._holds: dict[str, dict[str, tuple[int, int]]] = {}
        """key -> token -> (amount, expires_us)."""
        self._lapses: dict[str, dict[str, int]] = {}
        """lapse index -> wallet -> lapses_us (the Redis backends keep Unix ms: the store's clock)."""
        self._lapsed: dict[str, dict[str, int]] = {}
        """lapsed key -> wallet -> credit a top-up found lapsed."""
        self._contention: dict[str, dict[str, int]] = {}
        """contention mark -> subject (its share's bucket key) -> refused at (µs); at most
        ``MAX_CONTENDERS`` subjects a mark, one mark a share scope."""
        self._sessions: dict[str, tuple[CreditSessionState, int]] = {}
        """credit session key -> (its state, expires_us); dropped when found expired."""
        self._expiries: list[tuple[int, int, str]] = []
        """(expires_us, kind, key): kind 0 is a value, 1 a rate-limit bucket."""

    def _expire(self, now: int) -> None:
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires, kind, key = heapq.heappop(heap)
            if kind == 0:
                entry = self._values.get(key)
                if entry is not None and entry[1] == expires:
                    del self._values[key]
            elif self._tats.get(key) == expires:
                del self._tats[key]

    def _set_value(self, key: str, value: str, ttl_ms: int) -> None:
        now = _now_us()
        self._expire(now)
        expires = now + ttl_ms * 1_000
        self._values[key] = (value, expires)
        heapq.heappush(self._expiries, (expires, 0, key))

    def size(self) -> int:
        """Entries held (values and buckets); not ``__len__``, so an empty store stays truthy."""
        return len(self._values) + len(self._tats)

    def _live(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires <= _now_us():
            del self._values[key]
            return None
        return value

    async def claim(self, key: str, value: str, ttl_ms: int) -> bool:
        if self._live(key) is not None:
            return False
        self._set_value(key, value, ttl_ms)
        return True

    async def get(self, key: str) -> str | None:
        return self._live(key)

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        self._set_value(key, value, ttl_ms)

    async def release(self, key: str, token: str) -> bool:
        if self._live(key) != token:
            return False
        del self._values[key]
        return True

    def _set_tat(self, key: str, tat: int) -> None:
        self._tats[key] = tat
        heapq.heappush(self._expiries, (tat, 1, key))

    def _gcra(self, bucket: Bucket) -> RateDecision:
        now = _now_us()
        self._expire(now)
        decision, new_tat = gcra(self._tats.get(bucket.key), now, bucket.limit, bucket.period_ms)
        if new_tat is not None and not bucket.guard:
            self._set_tat(bucket.key, new_tat)
        return decision

    def _contended(self, mark: str, subject: str, period_ms: int) -> bool:
        """Whether the budget refused another subject than ``subject`` within ``period_ms``."""
        since = _now_us() - period_ms * 1_000
        return any(s != subject and at > since for s, at in self._contention.get(mark, {}).items())

    def _mark_contended(self, mark: str, subject: str) -> None:
        """Record ``subject`` refused by the budget now, keeping the latest distinct subjects."""
        marked = self._contention.setdefault(mark, {})
        marked[subject] = _now_us()
        while len(marked) > MAX_CONTENDERS:
            del marked[min(marked, key=marked.__getitem__)]

    def _charge_share(self, bucket: Bucket) -> RateDecision:
        """An uncontended share: allowed, and charged up to full but never past it."""
        now = _now_us()
        self._expire(now)
        tat = max(self._tats.get(bucket.key, now), now)
        full = now + bucket.period_ms * 1_000
        self._set_tat(bucket.key, min(tat + _interval_us(bucket.limit, bucket.period_ms), full))
        return RateDecision(allowed=True)

    def _restore(self, key: str, tat: int | None) -> None:
        """Give a share back the arrival time it had before this step."""
        if tat is not None and tat > _now_us():
            self._set_tat(key, tat)
        else:
            self._tats.pop(key, None)

    def _limit(self, buckets: Sequence[Bucket]) -> list[RateDecision]:
        """The buckets in order, up to the first refusal, which gives the shares charged before
        it back as they were; a budget that refuses marks each of its shares' subjects."""
        budgets = share_budgets(buckets)
        self._expire(_now_us())
        before: dict[int, int | None] = {}
        decisions: list[RateDecision] = []
        for j, bucket in enumerate(buckets):
            share, budget = bucket.share, budgets[j]
            if share is not None and budget is not None:
                before[j] = self._tats.get(bucket.key)
                if not self._contended(share.contention, bucket.key, buckets[budget].period_ms):
                    decisions.append(self._charge_share(bucket))
                    continue
            decisions.append(self._gcra(bucket))
            if not decisions[-1].allowed:
                for i, tat in before.items():
                    mark = buckets[i].share
                    if i < j:
                        self._restore(buckets[i].key, tat)
                    if budgets[i] == j and mark is not None:
                        self._mark_contended(mark.contention, buckets[i].key)
                break
        return decisions

    async def check_then_limit(
        self,
        keys: Sequence[str],
        buckets: Sequence[Bucket],
        puts: Sequence[Entry] = (),
        hold: CreditHoldOrder | None = None,
    ) -> Lookup:
        values = [self._live(key) for key in keys]
        decisions: list[RateDecision] = []
        if any(value is not None for value in values):
            return Lookup(values=values, decisions=decisions)
        held = None
        if hold is not None:
            held = self._credit_cover(hold.account, hold.token, hold.amount)
            if held is None:
                return Lookup(values=values, decisions=decisions)
        decisions = self._limit(buckets)
        if not all(decision.allowed for decision in decisions):
            return Lookup(values=values, decisions=decisions)
        for entry in puts:
            self._set_value(entry.key, entry.value, entry.ttl_ms)
        if hold is not None and held is not None:
            expires = held.at_us + hold.ttl_ms * 1_000
            self._holds.setdefault(hold.account.holds, {})[hold.token] = (hold.amount, expires)
        return Lookup(values=values, decisions=decisions, written=True, held=held)

    async def claim_then_put(
        self, claims: Sequence[Entry], puts: Sequence[Entry] = (), credits: Sequence[Credit] = ()
    ) -> int:
        for done, entry in enumerate(claims):
            if self._live(entry.key) is not None:
                return done
            self._set_value(entry.key, entry.value, entry.ttl_ms)
        for entry in puts:
            self._set_value(entry.key, entry.value, entry.ttl_ms)
        now = _now_us()
        for credit in credits:
            account = credit.account
            gone = self._lapse_if_due(account, now)
            if gone:
                lapsed = self._lapsed.setdefault(account.lapsed, {})
                lapsed[account.wallet] = lapsed.get(account.wallet, 0) + gone
            balance = int(self._live(account.balance) or 0) + credit.amount
            self._set_value(account.balance, str(balance), credit.ttl_ms)
            self._lapses.setdefault(account.lapses, {})[account.wallet] = now + credit.lapse_ms * 1_000
            if credit.position is not None:
                self._raise_position(credit.position)
        return len(claims)

    def _raise_position(self, position: LedgerPosition) -> None:
        current = self._live(position.key)
        if current is None or int(current) < position.entry_id:
            self._set_value(position.key, str(position.entry_id), POSITION_TTL_MS)

    async def undo_claim(
        self, entries: Sequence[Entry], refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
    ) -> None:
        for entry in entries:
            await self.release(entry.key, entry.value)
        now = _now_us()
        self._expire(now)
        for bucket in refunds:
            tat = self._tats.get(bucket.key)
            if tat is None:
                continue
            tat -= _interval_us(bucket.limit, bucket.period_ms)
            if tat <= now:
                del self._tats[bucket.key]
            else:
                self._set_tat(bucket.key, tat)
        for bucket in debts:
            tat = max(self._tats.get(bucket.key, now), now)
            self._set_tat(bucket.key, tat + _interval_us(bucket.limit, bucket.period_ms))

    def _live_holds(self, key: str, now: int) -> dict[str, tuple[int, int]]:
        """The live holds at ``key``, after forgetting the lapsed ones (kept in the store: edit in
        place while it is not empty)."""
        live = {t: h for t, h in self._holds.pop(key, {}).items() if h[1] > now}
        if live:
            self._holds[key] = live
        return live

    async def hold(self, holds: Sequence[Hold], token: str, ttl_ms: int) -> bool:
        now = _now_us()
        for hold in holds:
            live = self._live_holds(hold.key, now)
            if sum(h[0] for t, h in live.items() if t != token) + hold.amount > hold.cap:
                return False
        for hold in holds:
            self._holds.setdefault(hold.key, {})[token] = (hold.amount, now + ttl_ms * 1_000)
        return True

    async def unhold(self, keys: Sequence[str], token: str) -> None:
        for key in keys:
            held = self._holds.get(key)
            if held is not None:
                held.pop(token, None)
                if not held:
                    del self._holds[key]

    def _live_balance(self, account: CreditAccount, now: int) -> tuple[int, int]:
        """The balance (kept as a value, like a window counter) as spendable at ``now``, and the
        ms left until it lapses: nothing once its lapse time has passed, swept or not."""
        lapses = self._lapses.get(account.lapses, {}).get(account.wallet)
        entry = self._values.get(account.balance)
        if (lapses is not None and lapses <= now) or entry is None or entry[1] <= now:
            return 0, 0
        ends = entry[1] if lapses is None else min(entry[1], lapses)
        return int(entry[0]), -(-(ends - now) // 1_000)

    def _lapse_if_due(self, account: CreditAccount, now: int) -> int | None:
        """Once the wallet's lapse time has passed: delete its balance and holds, drop it from
        the index and answer the balance it had; None while it is not due."""
        index = self._lapses.get(account.lapses, {})
        lapses = index.get(account.wallet)
        if lapses is None or lapses > now:
            return None
        del index[account.wallet]
        self._holds.pop(account.holds, None)
        entry = self._values.pop(account.balance, None)
        return int(entry[0]) if entry is not None and entry[1] > now else 0

    def _credit_cover(self, account: CreditAccount, token: str, amount: int) -> CreditState | None:
        """The credit state once ``token`` holds ``amount``, when the free credit covers it (the
        lapsed holds forgotten); None when it does not. Holds nothing itself."""
        now = _now_us()
        others = sum(h[0] for t, h in self._live_holds(account.holds, now).items() if t != token)
        balance, left = self._live_balance(account, now)
        if balance - others < amount:
            return None
        return CreditState(balance=balance, held=others + amount, ttl_ms=left, at_us=now)

    async def hold_credit(
        self, account: CreditAccount, amount: int, token: str, ttl_ms: int
    ) -> CreditState | None:
        order = CreditHoldOrder(account, amount, token, ttl_ms)
        return (await self.check_then_limit([], [], hold=order)).held

    async def take_credit(
        self,
        account: CreditAccount,
        token: str,
        amount: int,
        not_after_us: int | None = None,
        keep: Sequence[Entry] = (),
    ) -> CreditState | None:
        checked_amount(amount)
        for entry in keep:
            checked_ttl(entry.ttl_ms)
        now = _now_us()
        if not_after_us is not None and now > not_after_us:
            raise TakeTooLate("the take reached the store after its deadline: nothing was taken")
        mark = taken_mark(account, token)
        live = self._live_holds(account.holds, now)
        own = live.get(token)
        if own is None and self._live(mark) is not None:
            return None
        others = sum(h[0] for t, h in live.items() if t != token)
        balance, left = self._live_balance(account, now)
        if balance - others < amount:
            return None
        if own is not None:
            del live[token]
            self._set_value(mark, "1", max(1, (own[1] - now) // 1_000))
        if amount > 0:
            balance -= amount
            self._values[account.balance] = (str(balance), self._values[account.balance][1])
        for entry in keep:
            self._set_value(entry.key, entry.value, entry.ttl_ms)
        return CreditState(balance=balance, held=others, ttl_ms=left, at_us=now)

    def _live_session(self, key: str, now: int) -> CreditSessionState | None:
        found = self._sessions.get(key)
        if found is None:
            return None
        if found[1] <= now:
            del self._sessions[key]
            return None
        return found[0]

    def _drop_expired_sessions(self, now: int) -> None:
        """Forget expired sessions (each open pays for a sweep, so memory stays bounded)."""
        for key in [k for k, (_, expires) in self._sessions.items() if expires <= now]:
            del self._sessions[key]

    async def open_credit_session(self, key: str, wallet: str, cap: int, ttl_ms: int) -> None:
        now = _now_us()
        self._drop_expired_sessions(now)
        self._sessions[key] = (CreditSessionState(wallet, checked_amount(cap), 0), now + ttl_ms * 1_000)

    async def spend_credit_session(
        self, spend: CreditSessionSpend, buckets: Sequence[Bucket]
    ) -> SessionLookup:
        hold = spend.hold
        now = _now_us()
        session = self._live_session(spend.session, now)
        if session is None or session.wallet != hold.account.wallet:
            return SessionLookup(SessionSpent.UNKNOWN)
        if session.cap - session.spent < hold.amount:
            return SessionLookup(SessionSpent.CAP, spent=session.spent, cap=session.cap)
        held = self._credit_cover(hold.account, hold.token, hold.amount)
        if held is None:
            return SessionLookup(SessionSpent.UNCOVERED)
        decisions: list[RateDecision] = []
        for bucket in buckets:
            decisions.append(self._gcra(bucket))
            if not decisions[-1].allowed:
                return SessionLookup(SessionSpent.LIMITED, decisions)
        spent = session.spent + hold.amount
        self._sessions[spend.session] = (
            CreditSessionState(session.wallet, session.cap, spent),
            self._sessions[spend.session][1],
        )
        self._holds.setdefault(hold.account.holds, {})[hold.token] = (
            hold.amount,
            held.at_us + hold.ttl_ms * 1_000,
        )
        return SessionLookup(SessionSpent.SPENT, decisions, held, spent, session.cap)

    async def refund_credit_session(self, key: str, holds: str, token: str, amount: int) -> None:
        await self.unhold([holds], token)
        session = self._live_session(key, _now_us())
        if session is not None:
            spent = max(session.spent - amount, 0)
            self._sessions[key] = (
                CreditSessionState(session.wallet, session.cap, spent),
                self._sessions[key][1],
            )

    async def revoke_credit_session(self, key: str) -> CreditSessionState | None:
        session = self._live_session(key, _now_us())
        if session is not None:
            del self._sessions[key]
        return session

    async def credit_state(self, account: CreditAccount) -> CreditState:
        now = _now_us()
        held = sum(amount for amount, expires in self._holds.get(account.holds, {}).values() if expires > now)
        balance, left = self._live_balance(account, now)
        return CreditState(balance=balance, held=held, ttl_ms=left, at_us=now)

    async def due_lapses(self, lapses: str, limit: int) -> list[str]:
        now = _now_us()
        due = sorted((at, wallet) for wallet, at in self._lapses.get(lapses, {}).items() if at <= now)
        return [wallet for _, wallet in due[:limit]]

    async def lapse_credit(self, account: CreditAccount) -> int | None:
        return self._lapse_if_due(account, _now_us())

    async def restore_credit(
        self, account: CreditAccount, balance: int, lapse_at_ms: int, ttl_ms: int
    ) -> None:
        self._holds.pop(account.holds, None)
        index = self._lapses.setdefault(account.lapses, {})
        if balance <= 0:
            self._values.pop(account.balance, None)
            index.pop(account.wallet, None)
            return
        self._set_value(account.balance, str(balance), ttl_ms)
        # This store's clock is monotonic: the lapse time is moved onto it from the wall clock.
        index[account.wallet] = _now_us() + (lapse_at_ms - int(time.time() * 1000)) * 1_000

    async def drain_lapsed(self, lapsed: str) -> dict[str, int]:
        return self._lapsed.pop(lapsed, {})

    async def incr(self, deltas: Mapping[str, int]) -> dict[str, int]:
        for key, delta in deltas.items():
            self._counters[key] = self._counters.get(key, 0) + delta
        return {key: self._counters[key] for key in deltas}

    async def counters(self, keys: list[str]) -> dict[str, int]:
        return {key: self._counters.get(key, 0) for key in keys}

    async def add_counts(self, deltas: Mapping[str, int], ttl_ms: int) -> dict[str, int]:
        totals: dict[str, int] = {}
        for key, delta in deltas.items():
            total = int(self._live(key) or 0) + delta
            self._set_value(key, str(total), ttl_ms)
            totals[key] = total
        return totals

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
