"""``x402-gateway ledger export``: the journal for an accountant, exact and streamed.

The journal is written by a served gateway settling real payments (top-ups, a sale, spends of
credit) on the test's LiteSVM chain, or, for size, by the journal's own ``record``; the CLI runs
as a process of its own against the real PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import subprocess

import pytest
import pytest_asyncio

from gateway.ledger import Journal, Recorded, entries
from gateway.ledger.commands import moment_ms
from gateway.ledger.export import COLUMNS, iso_utc, usdc_text
from tests.support.gateway_process import run_cli
from tests.support.ledger_served import LedgerGateway, settle_activity
from tests.support.postgres_server import create_schema
from tests.test_cli import run_cli_into_closed_pipe, run_cli_into_head

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")

BIG = 2_500
"""Entries of the large journal: more than two of the journal's pages of 1,000."""
T0_MS = 1_764_201_600_000  # 2025-11-27T00:00:00Z


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def big_journal(postgres_url: str) -> str:
    """A journal of ``BIG`` spends, one a second from ``T0_MS``, amounts 1..BIG micro-USDC."""
    url = await create_schema(postgres_url)
    journal = await Journal.open(url)
    try:
        made = [
            entries.credit_spent(
                ref=f"hold-{n}",
                route="solana.mainnet.provider_a.rpc.getBalance",
                wallet="So11111111111111111111111111111111111111112",
                amount_micro=n + 1,
                at_ms=T0_MS + n * 1000,
            )
            for n in range(BIG)
        ]
        assert await journal.record(made) == BIG
    finally:
        await journal.close()
    return url


async def _export(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, {}, "ledger", "export", "--database", url, *args, timeout=60)


def _expected(entry: Recorded) -> dict[str, object]:
    return {
        "id": entry.id,
        "occurred_at": iso_utc(entry.occurred_at_ms),
        "kind": entry.kind.value,
        "wallet": entry.wallet,
        "route": entry.route,
        "amount_micro_usdc": entry.amount_micro,
        "amount_usdc": usdc_text(entry.amount_micro),
        "signature": entry.signature,
        "facilitator": entry.facilitator,
        "ref": entry.ref,
    }


@pytest.mark.asyncio(loop_scope="session")
async def test_csv_and_json_hold_every_entry_exactly_in_journal_order(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)
    journal = await ledger.entries()

    as_csv = await _export(ledger.journal_url, "--since", "0")
    as_json = await _export(ledger.journal_url, "--since", "0", "--format", "json")

    assert (as_csv.returncode, as_csv.stderr, as_json.returncode, as_json.stderr) == (0, "", 0, "")
    expected = [_expected(entry) for entry in journal]
    assert json.loads(as_json.stdout) == expected
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert tuple(rows[0]) == COLUMNS
    as_text = [{k: "" if v is None else str(v) for k, v in row.items()} for row in expected]
    assert [dict(zip(COLUMNS, row, strict=True)) for row in rows[1:]] == as_text
    assert [row["kind"] for row in expected] == ["top_up", "top_up", "sale", "credit_spent", "credit_spent"]
    top_up = expected[0]
    assert (top_up["amount_micro_usdc"], top_up["amount_usdc"]) == (1_000_000, "1.000000")
    assert [e.occurred_at_ms for e in journal] == [moment_ms(str(row["occurred_at"])) for row in expected]


@pytest.mark.asyncio(loop_scope="session")
async def test_since_and_until_select_a_window_however_they_are_written(big_journal: str) -> None:
    by_iso = await _export(
        big_journal, "--since", "2025-11-27T00:00:10Z", "--until", "2025-11-27T00:00:13", "--format", "json"
    )
    by_unix = await _export(
        big_journal, "--since", "1764201610", "--until", "1764201613.000", "--format", "json"
    )
    by_offset = await _export(
        big_journal, "--since", "2025-11-27T01:00:10+01:00", "--until", "1764201613", "--format", "json"
    )

    rows = json.loads(by_iso.stdout)
    assert [row["amount_micro_usdc"] for row in rows] == [11, 12, 13]
    assert [row["occurred_at"] for row in rows] == [f"2025-11-27T00:00:{s}.000Z" for s in (10, 11, 12)]
    assert by_unix.stdout == by_offset.stdout == by_iso.stdout
    empty = await _export(big_journal, "--since", "2030-01-01", "--format", "json")
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])
    header_only = await _export(big_journal, "--since", "2030-01-01")
    assert header_only.stdout == ",".join(COLUMNS) + "\n"


@pytest.mark.asyncio(loop_scope="session")
async def test_a_journal_larger_than_a_page_streams_whole_and_in_order(big_journal: str) -> None:
    done = await _export(big_journal, "--since", "2025-11-27")

    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert done.returncode == 0 and len(rows) == BIG
    assert [int(row["amount_micro_usdc"]) for row in rows] == list(range(1, BIG + 1))
    assert [int(row["id"]) for row in rows] == sorted(int(row["id"]) for row in rows)
    assert rows[-1]["amount_usdc"] == "0.002500"


@pytest.mark.asyncio(loop_scope="session")
async def test_a_closed_pipe_ends_the_export_quietly(big_journal: str) -> None:
    args = ("ledger", "export", "--database", big_journal, "--since", "0")

    closed = await asyncio.to_thread(run_cli_into_closed_pipe, {}, *args)
    code, stderr, head = await asyncio.to_thread(run_cli_into_head, {}, *args, "--format", "json", count=20)

    assert (closed.returncode, closed.stderr) == (0, "")
    assert (code, stderr) == (0, "")
    assert head == b'[\n{"id":1,"occurred_'


@pytest.mark.asyncio(loop_scope="session")
async def test_bad_arguments_are_one_line_never_a_traceback(big_journal: str) -> None:
    cases = {
        (): "the following arguments are required: --since",
        ("--since", "last week"): "'last week' is neither Unix seconds nor an ISO-8601 date or time",
        ("--since", "99999999999999"): "is neither Unix seconds",
        ("--since", "2026-02-30"): "'2026-02-30' is neither",
        ("--since", "2026-01-02", "--until", "2026-01-01"): "--until must be later than --since",
        ("--since", "0", "--format", "xlsx"): "invalid choice: 'xlsx'",
    }
    for args, said in cases.items():
        done = await _export(big_journal, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""
    no_database = await asyncio.to_thread(run_cli, {}, "ledger", "export", "--since", "0")
    assert (no_database.returncode, no_database.stderr.split(": ", 1)[1]) == (
        2,
        "give --database URL or set LEDGER_DATABASE_URL (see x402-gateway ledger export --help)\n",
    )
    from_env = await asyncio.to_thread(
        run_cli, {"LEDGER_DATABASE_URL": big_journal}, "ledger", "export", "--since", "2025-11-27T00:41:39Z"
    )
    assert (from_env.returncode, from_env.stdout.count("\n")) == (0, 2)  # the header and the last spend


@pytest.mark.asyncio(loop_scope="session")
async def test_a_database_it_cannot_read_is_one_line_without_its_password(postgres_url: str) -> None:
    unreachable = await _export("postgresql://ledger:hunter2@127.0.0.1:9/ledger", "--since", "0")
    no_ledger = await _export(await create_schema(postgres_url), "--since", "0")

    assert unreachable.returncode == 1 and "hunter2" not in unreachable.stderr
    assert unreachable.stderr.startswith("x402-gateway ledger export: ledger database unavailable: ")
    assert unreachable.stdout == "" and len(unreachable.stderr.splitlines()) == 1
    assert no_ledger.returncode == 1
    assert no_ledger.stderr == (
        "x402-gateway ledger export: the database holds no ledger (no ledger_entries table)\n"
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1764201600", T0_MS),
        ("1764201600.5", T0_MS + 500),
        ("1764201600.123", T0_MS + 123),
        ("2025-11-27", T0_MS),
        ("2025-11-27T00:00:00Z", T0_MS),
        ("2025-11-27T00:00:00.250", T0_MS + 250),
        ("2025-11-27T02:00:00+02:00", T0_MS),
    ],
)
def test_moments_are_unix_seconds_or_iso_8601_in_utc(text: str, ms: int) -> None:
    assert moment_ms(text) == ms


@pytest.mark.parametrize("text", ["", "yesterday", "-1", "1e9", "1764201600.1234", "2025-13-01", "nan"])
def test_other_moments_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        moment_ms(text)
