"""The ledger of record: every movement of money, in an append-only double-entry journal in
PostgreSQL. The store (Redis) stays the hot path for holds, limits and replay protection; the
ledger is what money was received, earned and is owed, and survives the store."""

from gateway.ledger.entries import Entry, EntryKind, Posting, credit_account
from gateway.ledger.journal import Journal, LedgerUnavailable, Recorded
from gateway.ledger.writer import JournalWriter

__all__ = [
    "Entry",
    "EntryKind",
    "Journal",
    "JournalWriter",
    "LedgerUnavailable",
    "Posting",
    "Recorded",
    "credit_account",
]
