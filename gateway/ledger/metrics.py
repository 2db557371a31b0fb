"""The ledger in Prometheus: how long its writes take, how many fail, and how far the journal
runs behind the store (entries waiting in this process to be written)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LEDGER_WRITE_SECONDS = Histogram(
    "x402_ledger_write_seconds",
    "Time to write one batch of entries to the ledger (PostgreSQL), in seconds.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
LEDGER_WRITE_ERRORS = Counter(
    "x402_ledger_write_errors_total",
    "Ledger writes that failed (the entries are kept and written again).",
)
LEDGER_BACKLOG = Gauge(
    "x402_ledger_backlog_entries",
    "Entries recorded in the store and waiting in this process to be written to the ledger.",
    multiprocess_mode="livesum",  # a dead worker's backlog is not left standing
)
LEDGER_LAG_SECONDS = Gauge(
    "x402_ledger_lag_seconds",
    "Age of the oldest entry waiting in this process to be written to the ledger, in seconds.",
    multiprocess_mode="livemax",  # a dead worker's lag is not left firing the alert
)
LEDGER_DROPPED = Counter(
    "x402_ledger_entries_dropped_total",
    "Credit spends never written to the ledger because the backlog was full (each favours its client).",
)
