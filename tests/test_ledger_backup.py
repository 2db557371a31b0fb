"""The ledger's backup, as deploy/README.md tells the operator to take and restore it, on a real
PostgreSQL: the README's own ``pg_dump`` and ``pg_restore`` options (its compose and Kubernetes
lines agree on them), the dump streamed through a pipe as ``docker compose exec -T`` and
``kubectl exec`` stream it. The restored ledger holds what the dump held, still refuses edits,
takes new entries, and brings an empty store back to every balance it records."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest
import yaml
from solders.keypair import Keypair

from gateway.ledger import Entry, Journal
from gateway.ledger.entries import SettledPayment, credit_spent, sale, top_up
from gateway.ledger.restore import StoreRestorer
from gateway.methods.credit.book import CreditBook
from gateway.sandbox.postgres import binaries
from gateway.store.memory import MemoryStore
from tests.support.postgres_server import create_database

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ALICE, BOB = str(Keypair().pubkey()), str(Keypair().pubkey())


def _pg_bin(tool: str) -> str:
    """The client beside the server the suite runs, so that their versions match."""
    path = binaries() / tool
    assert path.is_file(), path
    return str(path)


def _readme_commands() -> list[str]:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
    lines = [line.strip() for b in blocks for line in re.sub(r"\\\n\s*", "", b).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _ledger_database() -> tuple[str, str]:
    """The user and database compose and Kubernetes create for the ledger (one pair for both)."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    env = compose["services"]["postgres"]["environment"]
    docs = yaml.safe_load_all((DEPLOY / "k8s" / "postgres.yaml").read_text(encoding="utf-8"))
    (statefulset,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    k8s_env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["POSTGRES_USER"], env["POSTGRES_DB"]) == (k8s_env["POSTGRES_USER"], k8s_env["POSTGRES_DB"])
    return env["POSTGRES_USER"], env["POSTGRES_DB"]


def _readme_options(tool: str) -> list[str]:
    """The options deploy/README.md runs ``tool`` with, its connection (``-U``/``-d``, which name
    the ledger's user and database) left out: the test connects to its own database."""
    found = []
    for command in _readme_commands():
        if f" {tool} " not in command:
            continue
        words = shlex.split(command)
        redirect = ">" if tool == "pg_dump" else "<"
        start, end = words.index(tool) + 1, words.index(redirect)
        assert words[end + 1] == "ledger.dump"
        found.append(words[start:end])
    assert {tuple(options) for options in found} and len({tuple(o) for o in found}) == 1, found
    assert len(found) == 2, "one line for compose, one for Kubernetes"
    options = list(found[0])
    user, database = _ledger_database()
    for flag, value in (("-U", user), ("-d", database)):
        i = options.index(flag)
        assert options[i + 1] == value, (flag, options)
        del options[i : i + 2]
    return options


def _dump(url: str) -> bytes:
    done = subprocess.run(
        [_pg_bin("pg_dump"), *_readme_options("pg_dump"), "-d", url],
        capture_output=True,  # the dump through a pipe, as `exec` streams it
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def _restore(url: str, dump: bytes) -> None:
    done = subprocess.run(
        [_pg_bin("pg_restore"), *_readme_options("pg_restore"), "-d", url],
        input=dump,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


def _books(now_ms: int) -> list[Entry]:
    return [
        top_up(
            SettledPayment(
                route="credits.top-up.5",
                payer=ALICE,
                amount_micro=5_000_000,
                signature="sigA",
                facilitator="internal",
                at_ms=now_ms - 3_000,
                payment_key="keyA",
            )
        ),
        top_up(
            SettledPayment(
                route="credits.top-up.1",
                payer=BOB,
                amount_micro=1_000_000,
                signature="sigB",
                facilitator="internal",
                at_ms=now_ms - 2_000,
                payment_key="keyB",
            )
        ),
        credit_spent(
            ref="hold1", route="rpc.getBalance", wallet=ALICE, amount_micro=1_200, at_ms=now_ms - 1_000
        ),
        sale(
            SettledPayment(
                route="rpc.getBalance",
                payer=BOB,
                amount_micro=3_300,
                signature="sigC",
                facilitator="internal",
                at_ms=now_ms - 500,
            )
        ),
    ]


async def _snapshot(journal: Journal) -> tuple[list[tuple[str, str, int, str]], dict[str, int]]:
    entries = [(e.ref, str(e.kind), e.amount_micro, e.wallet) async for e in journal.entries()]
    return entries, await journal.owed()


async def test_the_readmes_dump_and_restore_bring_the_ledger_back_and_an_empty_store_with_it(
    postgres_url: str,
) -> None:
    now_ms = int(time.time() * 1000)
    url = await create_database(postgres_url)
    journal = await Journal.open(url)
    try:
        assert await journal.record(_books(now_ms)) == 4
        backed_up = await _snapshot(journal)
        assert backed_up[1] == {ALICE: 5_000_000 - 1_200, BOB: 1_000_000}
        dump = _dump(url)
        # Written after the backup: a restore of that backup does not hold it.
        late = credit_spent(ref="hold2", route="rpc.getBalance", wallet=BOB, amount_micro=1_200, at_ms=now_ms)
        assert await journal.record([late]) == 1
    finally:
        await journal.close()

    # Over the ledger it was taken from (--clean), and on a new server's empty database.
    for target in (url, await create_database(postgres_url)):
        _restore(target, dump)
        restored = await Journal.open(target)  # what a gateway does at start-up
        try:
            assert await _snapshot(restored) == backed_up
            # Still append-only, and new entries follow the restored ones.
            connection = await asyncpg.connect(target)
            try:
                with pytest.raises(asyncpg.RaiseError, match="append-only"):
                    await connection.execute("UPDATE ledger_postings SET amount_micro = 0")
            finally:
                await connection.close()
            assert await restored.record([late]) == 1
            assert (await restored.owed())[BOB] == 1_000_000 - 1_200
            entries = [e.ref async for e in restored.entries()]
            assert entries == [*(ref for ref, *_ in backed_up[0]), late.ref]

            # The store was lost too and starts empty: restored from the ledger, every balance.
            store = MemoryStore()
            book = CreditBook(store, lapse_days=365, upstream_timeout_s=15.0)
            restorer = StoreRestorer(store, restored, lapse_ms=book.lapse_ms, grace_ms=book.grace_ms)
            assert await restorer.check() is True
            assert (await book.balance(ALICE)).balance == 5_000_000 - 1_200
            assert (await book.balance(BOB)).balance == 1_000_000 - 1_200
            assert await restorer.check() is False  # once
        finally:
            await restored.close()


def test_the_readme_restores_the_ledger_in_one_transaction_over_what_is_there() -> None:
    """A restore that fails half-way leaves the ledger as it was; one over a ledger that is
    still there replaces it, which the journal's own triggers (no UPDATE, DELETE, TRUNCATE)
    allow: pg_restore drops and recreates the tables."""
    options = _readme_options("pg_restore")
    assert {"--single-transaction", "--clean", "--if-exists", "--no-owner"} <= set(options)
    assert "--format=custom" in _readme_options("pg_dump")
