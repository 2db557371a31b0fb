"""The journal in PostgreSQL: append entries, read balances and movements back.

One statement records a whole batch, entries and postings together, in the order given; an
entry whose ``ref`` is already in the journal is skipped, so a batch sent again after its answer
was lost, or a movement recorded by two replicas, lands once. Every failure to reach or use the
database is :class:`LedgerUnavailable`, for the caller to decide what it means (a top-up refuses
to answer without its entry; a spend is written again later).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from gateway.ledger.entries import CREDIT_PREFIX, Entry, EntryKind, credit_account
from gateway.ledger.metrics import LEDGER_WRITE_ERRORS, LEDGER_WRITE_SECONDS
from gateway.ledger.schema import MIGRATION


class LedgerUnavailable(Exception):
    """The ledger's database could not be reached, or refused the write."""


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """An entry as the journal holds it: its position and when it was written."""

    id: int
    ref: str
    kind: EntryKind
    occurred_at_ms: int
    recorded_at_ms: int
    amount_micro: int
    wallet: str
    route: str | None
    facilitator: str | None
    signature: str | None
    payment_key: str | None


class Owed(msgspec.Struct, frozen=True):
    """What the operator owes one wallet, and when its last top-up settled (its credit lapses
    from there)."""

    wallet: str
    owed_micro: int
    last_top_up_ms: int
    last_top_up_id: int = 0
    """The journal id of its newest top-up (0: none)."""


_RECORD = """
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[], $5::text[],
                         $6::text[], $7::text[], $8::text[], $12::text[])
        WITH ORDINALITY AS b(ref, kind, occurred_at, amount_micro, wallet, route, facilitator, signature,
                             payment_key, n)
), added AS (
    INSERT INTO ledger_entries (ref, kind, occurred_at, amount_micro, wallet, route, facilitator, signature,
                                payment_key)
    SELECT ref, kind, occurred_at, amount_micro, wallet, route, facilitator, signature, payment_key
    FROM batch ORDER BY n
    ON CONFLICT (ref) DO NOTHING
    RETURNING id, ref
)
INSERT INTO ledger_postings (entry_id, account, amount_micro)
SELECT added.id, p.account, p.amount_micro
FROM added JOIN unnest($9::text[], $10::text[], $11::bigint[]) AS p(ref, account, amount_micro)
    ON p.ref = added.ref
RETURNING entry_id
"""

_COLUMNS = ", ".join(
    [
        *("id", "ref", "kind", "occurred_at", "recorded_at", "amount_micro", "wallet", "route"),
        *("facilitator", "signature", "payment_key"),
    ]
)

# ``InternalClientError`` is the pool's own state error; a database going away mid-acquire can
# surface as one, and it means the same to a caller: the ledger cannot answer now.
_DATABASE_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _recorded(row: Any) -> Recorded:
    return Recorded(
        id=row["id"],
        ref=row["ref"],
        kind=EntryKind(row["kind"]),
        occurred_at_ms=_ms(row["occurred_at"]),
        recorded_at_ms=_ms(row["recorded_at"]),
        amount_micro=row["amount_micro"],
        wallet=row["wallet"],
        route=row["route"],
        facilitator=row["facilitator"],
        signature=row["signature"],
        payment_key=row["payment_key"],
    )


class Journal:
    """The ledger of record: an append-only, double-entry journal in PostgreSQL."""

    def __init__(self, pool: asyncpg.Pool, timeout_s: float) -> None:
        self._pool = pool
        self.timeout_s = timeout_s

    @classmethod
    async def open(
        cls, url: str, *, timeout_s: float = 5.0, max_connections: int = 4, migrate: bool = True
    ) -> Journal:
        """Connect to ``url`` and bring the schema up to date (``migrate=False``: only read, as a
        role that may not create tables reads, e.g. the CLI's export and reconcile)."""
        try:
            pool = await asyncpg.create_pool(
                # No connection floor: asyncpg's background floor upkeep races acquirers while the
                # database refuses connections; connections open on demand instead.
                url,
                min_size=0,
                max_size=max_connections,
                timeout=timeout_s,
                command_timeout=timeout_s,
            )
        except _DATABASE_ERRORS as failed:
            raise LedgerUnavailable(f"ledger database unavailable: {type(failed).__name__}") from None
        try:
            async with pool.acquire() as connection:
                if migrate:
                    await connection.execute("SELECT pg_advisory_lock(402402)")
                    try:
                        await connection.execute(MIGRATION)
                    finally:
                        await connection.execute("SELECT pg_advisory_unlock(402402)")
        except _DATABASE_ERRORS as failed:
            pool.terminate()
            raise LedgerUnavailable(f"ledger database unavailable: {type(failed).__name__}") from None
        return cls(pool, timeout_s)

    async def close(self) -> None:
        """Close the connections, giving queries in flight a moment (shutdown must not hang)."""
        try:
            await asyncio.wait_for(self._pool.close(), timeout=self.timeout_s)
        except TimeoutError:
            self._pool.terminate()

    async def record(self, entries: Sequence[Entry]) -> int:
        """Append ``entries`` in order, in one transaction; answer how many were new."""
        return len(await self._append(entries))

    async def record_one(self, entry: Entry) -> int:
        """Append ``entry`` (if its ref is new) and answer its journal id, new or found: one
        statement when it is new, a second to find it when it was recorded before."""
        for new in await self._append([entry]):
            return new
        found = await self._fetchval("SELECT id FROM ledger_entries WHERE ref = $1", entry.ref)
        if found is None:
            raise LedgerUnavailable(f"ledger entry {entry.ref} recorded but not found")
        return int(found)

    async def _append(self, entries: Sequence[Entry]) -> set[int]:
        """The one write: ``entries`` in order, each skipped when its ref is known; the ids of
        the new ones that carry postings (a memo without postings is written, not answered)."""
        unique = list({entry.ref: entry for entry in entries}.values())
        if not unique:
            return set()
        postings = [(e.ref, p.account, p.amount_micro) for e in unique for p in e.postings]
        arguments = (
            [e.ref for e in unique],
            [e.kind.value for e in unique],
            [_when(e.occurred_at_ms) for e in unique],
            [e.amount_micro for e in unique],
            [e.wallet for e in unique],
            [e.route for e in unique],
            [e.facilitator for e in unique],
            [e.signature for e in unique],
            [ref for ref, _, _ in postings],
            [account for _, account, _ in postings],
            [amount for _, _, amount in postings],
            [e.payment_key for e in unique],
        )
        with LEDGER_WRITE_SECONDS.time():
            try:
                rows = await self._pool.fetch(_RECORD, *arguments, timeout=self.timeout_s)
            except _DATABASE_ERRORS as failed:
                LEDGER_WRITE_ERRORS.inc()
                raise LedgerUnavailable(f"ledger write failed: {type(failed).__name__}") from None
        return {int(row["entry_id"]) for row in rows}

    async def owed_to(self, wallet: str) -> int:
        """The credit the operator owes ``wallet``, in micro-USDC, by the journal."""
        total = await self._fetchval(
            "SELECT coalesce(-sum(amount_micro), 0) FROM ledger_postings WHERE account = $1",
            credit_account(wallet),
        )
        return int(total)

    async def owed(self) -> dict[str, int]:
        """Every wallet the operator owes credit to, and how much (micro-USDC)."""
        rows = await self._fetch(
            "SELECT substr(account, $2) AS wallet, -sum(amount_micro) AS owed FROM ledger_postings "
            "WHERE account LIKE $1 GROUP BY account HAVING sum(amount_micro) <> 0",
            CREDIT_PREFIX + "%",
            len(CREDIT_PREFIX) + 1,
        )
        return {row["wallet"]: int(row["owed"]) for row in rows}

    async def owed_since_top_ups(self) -> list[Owed]:
        """Every wallet that ever had credit, with what it is owed now (0 included) and its last
        top-up's time: what a lost store is restored to."""
        rows = await self._fetch(
            "SELECT e.wallet, -sum(p.amount_micro) AS owed, "
            "max(e.occurred_at) FILTER (WHERE e.kind = 'top_up') AS last_top_up, "
            "coalesce(max(e.id) FILTER (WHERE e.kind = 'top_up'), 0) AS last_top_up_id "
            "FROM ledger_postings p JOIN ledger_entries e ON e.id = p.entry_id "
            "WHERE p.account LIKE $1 GROUP BY e.wallet ORDER BY e.wallet",
            CREDIT_PREFIX + "%",
        )
        return [
            Owed(
                row["wallet"],
                int(row["owed"]),
                _ms(row["last_top_up"]) if row["last_top_up"] else 0,
                int(row["last_top_up_id"]),
            )
            for row in rows
        ]

    async def newest_top_ups_owed(self, before_ms: int, since_ms: int | None = None) -> dict[str, int]:
        """Every wallet still owed credit (with ``since_ms``: only those with a top-up settled
        since then), with the journal id of its newest top-up that settled before ``before_ms``
        (wallets with none left out): how far its credit in the store must go."""
        recent = ""
        arguments: list[object] = [CREDIT_PREFIX + "%", _when(before_ms)]
        if since_ms is not None:
            recent = (
                "AND e.wallet IN (SELECT wallet FROM ledger_entries "
                "WHERE kind = 'top_up' AND occurred_at >= $3) "
            )
            arguments.append(_when(since_ms))
        rows = await self._fetch(
            "SELECT e.wallet, max(e.id) FILTER (WHERE e.kind = 'top_up' AND e.occurred_at < $2) AS newest "
            "FROM ledger_postings p JOIN ledger_entries e ON e.id = p.entry_id "
            f"WHERE p.account LIKE $1 {recent}"
            "GROUP BY e.wallet HAVING sum(p.amount_micro) < 0 ORDER BY e.wallet",
            *arguments,
        )
        return {row["wallet"]: int(row["newest"]) for row in rows if row["newest"] is not None}

    async def top_ups_of(self, wallet: str, after_id: int, before_ms: int) -> list[Recorded]:
        """``wallet``'s top-ups journaled after ``after_id`` that settled before ``before_ms``, in
        order."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM ledger_entries WHERE kind = 'top_up' AND wallet = $1 AND id > $2 "
            "AND occurred_at < $3 ORDER BY id",
            wallet,
            after_id,
            _when(before_ms),
        )
        return [_recorded(row) for row in rows]

    async def top_ups(self, since_ms: int, until_ms: int) -> list[Recorded]:
        """The top-ups that settled in ``[since_ms, until_ms)``, in journal order."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM ledger_entries WHERE kind = 'top_up' AND occurred_at >= $1 "
            "AND occurred_at < $2 ORDER BY id",
            _when(since_ms),
            _when(until_ms),
        )
        return [_recorded(row) for row in rows]

    async def movements(self, wallet: str, limit: int = 20) -> list[Recorded]:
        """``wallet``'s latest entries, newest first."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM ledger_entries WHERE wallet = $1 ORDER BY id DESC LIMIT $2",
            wallet,
            limit,
        )
        return [_recorded(row) for row in rows]

    async def entries(
        self,
        since_ms: int = 0,
        until_ms: int | None = None,
        page: int = 1000,
        kinds: Sequence[EntryKind] | None = None,
    ) -> AsyncIterator[Recorded]:
        """Every entry (of ``kinds``, default all) that occurred in ``[since_ms, until_ms)``, in
        journal order, a page at a time: a journal of any size is read in constant memory."""
        after = 0
        until = _when(until_ms) if until_ms is not None else datetime.max.replace(tzinfo=UTC)
        wanted = [kind.value for kind in kinds] if kinds is not None else None
        while True:
            rows = await self._fetch(
                f"SELECT {_COLUMNS} FROM ledger_entries WHERE id > $1 AND occurred_at >= $2 "
                "AND occurred_at < $3 AND ($5::text[] IS NULL OR kind = ANY($5::text[])) "
                "ORDER BY id LIMIT $4",
                after,
                _when(since_ms),
                until,
                page,
                wanted,
            )
            for row in rows:
                yield _recorded(row)
            if len(rows) < page:
                return
            after = rows[-1]["id"]

    async def settled(self, signatures: Sequence[str]) -> dict[str, Recorded]:
        """The sales and top-ups journaled under ``signatures``, by signature, whenever they
        occurred."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM ledger_entries WHERE signature = ANY($1::text[]) "
            "AND kind IN ('sale', 'top_up') ORDER BY id",
            list(signatures),
        )
        return {row["signature"]: _recorded(row) for row in rows}

    async def _fetch(self, query: str, *arguments: object) -> list[Any]:
        try:
            return list(await self._pool.fetch(query, *arguments, timeout=self.timeout_s))
        except asyncpg.UndefinedTableError:
            raise LedgerUnavailable("the database holds no ledger (no ledger_entries table)") from None
        except _DATABASE_ERRORS as failed:
            raise LedgerUnavailable(f"ledger read failed: {type(failed).__name__}") from None

    async def _fetchval(self, query: str, *arguments: object) -> Any:
        try:
            return await self._pool.fetchval(query, *arguments, timeout=self.timeout_s)
        except _DATABASE_ERRORS as failed:
            raise LedgerUnavailable(f"ledger read failed: {type(failed).__name__}") from None
