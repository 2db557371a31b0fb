"""The journal for an accountant: one row per settlement and per credit movement, CSV or JSON.

Rows are written as the journal is read, a page at a time, so a journal of any size streams in
constant memory; a writer whose reader left (``export | head``) stops reading the journal.
Amounts are exact: integer micro-USDC, and USDC as a decimal string with all six decimals (no
float ever holds money). Times are ISO-8601 in UTC with milliseconds.
"""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Literal, Protocol

import msgspec

from gateway.ledger.journal import Recorded

Format = Literal["csv", "json"]
MICRO_PER_USDC = 1_000_000


class Row(msgspec.Struct, frozen=True):
    """One exported entry; the CSV's columns are these fields, in this order."""

    id: int
    occurred_at: str
    kind: str
    wallet: str
    route: str | None
    amount_micro_usdc: int
    amount_usdc: str
    signature: str | None
    facilitator: str | None
    ref: str


COLUMNS = Row.__struct_fields__


class Sink(Protocol):
    def write(self, text: str, /) -> int: ...


def usdc_text(micro: int) -> str:
    """``1234567`` -> ``"1.234567"``, ``5`` -> ``"0.000005"``: exact, always six decimals (a
    column an accountant's tools read as one fixed-point number; the CLI's display trims them)."""
    sign = "-" if micro < 0 else ""
    whole, fraction = divmod(abs(micro), MICRO_PER_USDC)
    return f"{sign}{whole}.{fraction:06d}"


def iso_utc(ms: int) -> str:
    """Unix ms -> ``2026-11-27T04:05:06.123Z``."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def row_of(entry: Recorded) -> Row:
    return Row(
        id=entry.id,
        occurred_at=iso_utc(entry.occurred_at_ms),
        kind=entry.kind.value,
        wallet=entry.wallet,
        route=entry.route,
        amount_micro_usdc=entry.amount_micro,
        amount_usdc=usdc_text(entry.amount_micro),
        signature=entry.signature,
        facilitator=entry.facilitator,
        ref=entry.ref,
    )


def _gone(out: Sink) -> bool:
    """True once the reader left (a :class:`gateway.pipes.PipeGuard` marks its stream broken)."""
    return bool(getattr(out, "broken", False))


async def write_export(entries: AsyncIterator[Recorded], out: Sink, form: Format) -> int:
    """Write ``entries`` to ``out`` as ``form``; answer how many rows were written."""
    written = 0
    if form == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        async for entry in entries:
            row = row_of(entry)
            writer.writerow(["" if value is None else value for value in msgspec.structs.astuple(row)])
            written += 1
            if _gone(out):
                break
        return written
    encoder = msgspec.json.Encoder()
    out.write("[")
    async for entry in entries:
        out.write(("\n" if not written else ",\n") + encoder.encode(row_of(entry)).decode())
        written += 1
        if _gone(out):
            break
    out.write("\n]\n" if written else "]\n")
    return written
