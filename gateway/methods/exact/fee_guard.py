"""What settlements that fail on chain may cost our fee payer, bounded per payer, per token account
and per client IP.

The internal facilitator's fee payer pays for every transaction that lands, failed ones too. A
payer can make its settlements fail after every check passed: a transaction of its own that
empties its token accounts lands between our preflight and ours (on a real cluster a broadcast
lands a slot or more after the node's preflight). Such a failure looks like an honest burst until
it lands, so the guard allows concurrency only as far as a party has earned it:

* **in flight**: a party (a payer owner, a client IP) may have ``1 + 2 x settled`` settlements in
  flight at once, ``settled`` being its settlements that landed in the last ``record_window_s``
  (10 minutes), at most ``max_in_flight`` (16). A stranger settles one at a time; a client with
  5 settled payments may have 11 in flight;
* **funds**: the settlements in flight from one token account never move more USDC than its
  balance observed right before the broadcast;
* **cool-down**: a settlement that fails on chain puts its owner, its token account and its
  client IP in a cool-down (``cooldown_s``, 10 minutes) in which they cannot pay (verify and the
  gateway refuse them before the provider is called), and wipes their record.

A client IP is shared (a NAT, a cloud egress, an IPv6 /64), so its cool-down and its record bind
only payers *without a record of their own*: a payer that settled payments recently (its owner's
record, which it paid for) is **vouched for** by it. It is served through its IP's cool-down, and
within its IP's places in flight up to its own allowance, so it stays bounded by its own record
and is never refused because another wallet of its IP failed. Its settlements count for its own
record, not its IP's: an IP's record is what payers without one settled from it, so it cannot be
rebuilt for them by others during its cool-down. Whatever the payers, an IP never has more than
``max_in_flight`` settlements in flight at once.

So one IP can make the fee payer lose at most its allowance (one settlement without a record) per
cool-down through payers without a record, and each payer with a record at most its own
allowance, ``1 + 2 x settled`` (at most ``max_in_flight``), bought by ``settled`` payments, after
which it cools down and its record is gone. The state lives in the shared store, so replicas
agree; a settlement in flight whose process dies frees its place when its hold lapses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.store import Entry, Hold, Store, keys
from gateway.store.claims import claim_then_put
from gateway.store.holds import hold, unhold
from gateway.store.limits import check_then_limit

PartyKind = Literal["owner", "account", "ip"]


@dataclass(frozen=True, slots=True)
class Party:
    """Someone whose settlements the guard counts: a payer owner, a token account, a client IP."""

    kind: PartyKind
    id: str

    @property
    def record_key(self) -> str:
        return keys.fee_guard_record(self.kind, self.id)

    @property
    def cooldown_key(self) -> str:
        return keys.fee_guard_cooldown(self.kind, self.id)

    @property
    def in_flight_key(self) -> str:
        return keys.fee_guard_in_flight(self.kind, self.id)


@dataclass(frozen=True, slots=True)
class Turn:
    """What waiting for a place in flight came to: ``admitted`` (holding ``funds``, if any),
    else why not: ``cooling_down``, ``in_flight`` (no place within the wait) or
    ``insufficient_funds`` (the balance cannot pay even with nothing in flight)."""

    outcome: Literal["admitted", "cooling_down", "in_flight", "insufficient_funds"]
    funds: Hold | None = None

    @property
    def admitted(self) -> bool:
        return self.outcome == "admitted"


Funds = Callable[[], Awaitable[Hold | None]]
"""The settlement's amount held against its account's balance read just now; None when the
balance cannot cover the amount."""

WAIT_POLL_S = 0.1
"""How often a settlement waiting for a place in flight looks again."""


@dataclass(frozen=True, slots=True)
class Standing:
    """What the store knows of some parties: the first one cooling down, and each one's record
    (and the values of the other keys read in the same round trip). A client IP vouched for by
    its payer's record counts as not cooling, and with that record if it is the longer."""

    cooling: Party | None
    records: Mapping[Party, int]
    found: Sequence[str | None] = ()
    vouched: bool = False
    """The voucher (the payer) has a record of its own and is not cooling down."""


def _vouches(voucher: Party | None, cooling: bool, record: int) -> bool:
    """``voucher`` (the payer owner) has a record of its own and is not cooling down itself."""
    return voucher is not None and not cooling and record > 0


class FeeGuard:
    """The allowances, records and cool-downs of the parties to settlements (see the module)."""

    def __init__(
        self,
        store: Store,
        *,
        max_in_flight: int = 16,
        cooldown_s: float = 600.0,
        record_window_s: float = 600.0,
        hold_ttl_s: float = 180.0,
    ) -> None:
        """``hold_ttl_s``: a place in flight whose holder died lapses after it; it must outlive a
        settlement's confirmation wait and its late follow-up (until its blockhash expires), so a
        party has no more in flight than its allowance while any of them may still land."""
        self.store = store
        self.max_in_flight = max_in_flight
        self.cooldown_ms = int(cooldown_s * 1000)
        self.record_window_ms = int(record_window_s * 1000)
        self.hold_ttl_ms = int(hold_ttl_s * 1000)

    def allowance(self, settled: int) -> int:
        """How many settlements a party with ``settled`` recent ones may have in flight."""
        return min(self.max_in_flight, 1 + 2 * settled)

    async def standing(
        self, parties: Sequence[Party], also: Sequence[str] = (), *, voucher: Party | None = None
    ) -> Standing:
        """Who is cooling down and each party's record, and the values at ``also``, in one
        store round trip. With a ``voucher`` (the payer owner, read too), a client IP among
        ``parties`` is vouched for while the voucher has a record and is not cooling down: its
        cool-down is waived and its allowance is at least the voucher's (see the module)."""
        everyone = [*parties, voucher] if voucher is not None else list(parties)
        n = len(everyone)
        read = [*also, *(p.cooldown_key for p in everyone), *(p.record_key for p in everyone)]
        values = (await check_then_limit(self.store, read, [])).values
        first = len(also)
        found, cooldowns, records = values[:first], values[first : first + n], values[first + n :]
        counts = {p: _count(v) for p, v in zip(everyone, records, strict=True)}
        cools = {p: v is not None for p, v in zip(everyone, cooldowns, strict=True)}
        own = counts.get(voucher, 0) if voucher is not None else 0
        vouched = _vouches(voucher, voucher is not None and cools[voucher], own)
        cooling = next(
            (p for p in everyone if cools[p] and not (vouched and p.kind == "ip")),
            None,
        )
        records_of = {p: max(counts[p], own) if vouched and p.kind == "ip" else counts[p] for p in parties}
        return Standing(cooling, records_of, found, vouched)

    async def enter(
        self, token: str, standing: Standing, parties: Sequence[Party], funds: Hold | None = None
    ) -> bool:
        """Take a place in flight for each party (within its allowance) and, with ``funds``, the
        amount against the balance; all or nothing, one round trip."""
        holds = [Hold(p.in_flight_key, 1, self.allowance(standing.records.get(p, 0))) for p in parties]
        if funds is not None:
            holds.append(funds)
        return await hold(self.store, holds, token, self.hold_ttl_ms)

    async def take_turn(
        self,
        token: str,
        parties: Sequence[Party],
        standing: Standing,
        *,
        wait_s: float,
        funds: Funds | None = None,
        voucher: Party | None = None,
    ) -> Turn:
        """Wait up to ``wait_s`` for a place in flight for every party (and the funds), looking
        again every :data:`WAIT_POLL_S` with fresh standing (read with ``voucher``, as
        ``standing`` was): records grow as other settlements land, and one of them failing on
        chain puts the parties in a cool-down meanwhile."""
        deadline = time.monotonic() + wait_s
        while True:
            if standing.cooling is not None:
                return Turn("cooling_down")
            if await self.enter(token, standing, parties):
                if funds is None:
                    return Turn("admitted")
                turn = await self._fund(token, parties, funds)
                if turn is not None:
                    return turn
            if time.monotonic() >= deadline:
                return Turn("in_flight")
            await asyncio.sleep(WAIT_POLL_S)
            standing = await self.standing(parties, voucher=voucher)

    async def _fund(self, token: str, parties: Sequence[Party], funds: Funds) -> Turn | None:
        """With the parties' places held: the balance read now, the amount held against it. Read
        only once the places are held, it shows the transfers of every settlement of theirs that
        held them before and left (landed or failed), never a balance read before one of them
        landed. None (the places given back) while other settlements in flight hold the funds."""
        held = await funds()
        if held is not None and await hold(self.store, [held], token, self.hold_ttl_ms):
            return Turn("admitted", held)
        await self.leave(token, parties)
        return Turn("insufficient_funds") if held is None else None

    async def leave(self, token: str, parties: Sequence[Party], funds: Hold | None = None) -> None:
        held = [p.in_flight_key for p in parties] + ([funds.key] if funds is not None else [])
        await unhold(self.store, held, token)

    async def landed(self, parties: Sequence[Party], once: Counted | None = None) -> bool:
        """A settlement of theirs landed: their record grows (it counts for ``record_window_s``).
        With ``once`` (its signature, for one side of its parties), only the first of the
        settles and follow-ups that hear of it counts it, on whichever replica; True when this
        call did."""
        if once is not None and not await self.store.claim(once.key, "1", COUNTED_TTL_MS):
            return False
        await self.store.add_counts({p.record_key: 1 for p in parties}, self.record_window_ms)
        return True

    async def failed(self, parties: Sequence[Party], once: Counted | None = None) -> bool:
        """A settlement of theirs failed on chain: they cool down, and their record is gone (one
        round trip). With ``once``, only the first to hear of it does this; True when this call
        did."""
        claims = [Entry(once.key, "1", COUNTED_TTL_MS)] if once is not None else []
        puts = [Entry(p.cooldown_key, "1", self.cooldown_ms) for p in parties]
        puts += [Entry(p.record_key, "0", self.record_window_ms) for p in parties]
        return await claim_then_put(self.store, claims, puts) == len(claims)


COUNTED_TTL_MS = 1_800_000
"""How long a settlement's outcome stays counted (30 min): longer than its settlement record
lives (15 min), after which no settle can hear of it again."""


@dataclass(frozen=True, slots=True)
class Counted:
    """A settlement's outcome, counted once for one ``side`` of its parties: ``payer`` (its owner
    and token account, counted by the facilitator) or ``client`` (its IP, counted by the gateway)."""

    side: Literal["payer", "client"]
    signature: str

    @property
    def key(self) -> str:
        return keys.fee_guard_counted(self.side, self.signature)


def account_funds(account: str, amount: int, balance: int) -> Hold:
    """``amount`` of a settlement held against ``account``'s observed ``balance``."""
    return Hold(keys.fee_guard_funds(account), amount, balance)


def _count(value: str | None) -> int:
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0
