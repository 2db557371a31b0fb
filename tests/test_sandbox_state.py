"""What a sandbox state directory keeps (its prepaid credit too), and which port each part takes on
a restart (in-process; the restarts themselves are in test_sandbox_e2e.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import msgspec
import pytest

from gateway.config import load_settings
from gateway.methods.credit.book import CreditBook, credit_account
from gateway.routing.plan import route_plan
from gateway.routing.routes import load_routes, named_limits
from gateway.sandbox.credit import CreditKeepingStore, keep_credit, load_credit, unjournaled_credit
from gateway.sandbox.ports import PortChoice, check_free
from gateway.sandbox.state import (
    CONFIG_FILE_NAME,
    CREDIT_FILE_NAME,
    CREDIT_VERSION,
    CreditSnapshot,
    KeptCredit,
    SandboxConfig,
    read_config,
    read_credit,
    save_config,
    save_credit,
)
from gateway.store import Entry, keys
from gateway.store.claims import claim_then_put
from gateway.store.credit import credit_state, restore_credit
from tests.support.gateway_server import FULL_ENV


def _config(version: int = 1) -> SandboxConfig:
    return SandboxConfig(
        version=version,
        host="127.0.0.1",
        gateway_port=8080,
        chain_port=41000,
        assets_port=41001,
        asset_api_key="k" * 32,
        internal_secret="s" * 43,
    )


def test_a_port_asked_for_wins_then_the_kept_one_then_the_default() -> None:
    assert PortChoice("the gateway", "--port", 9000, 8081, 8080).port == 9000
    assert PortChoice("the gateway", "--port", None, 8081, 8080).port == 8081
    assert PortChoice("the gateway", "--port", None, None, 8080).port == 8080
    assert PortChoice("the local chain", "--chain-port", None, None, 0).port == 0


def test_a_port_that_moved_is_said_once_bound() -> None:
    moved = PortChoice("the local chain", "--chain-port", 0, 41000, 0)
    assert moved.moved_note(41234) == (
        "the local chain moved from port 41000 to 41234 (--chain-port): "
        "commands printed by earlier runs name the old port"
    )
    assert PortChoice("the local chain", "--chain-port", None, 41000, 0).moved_note(41000) is None
    assert PortChoice("the local chain", "--chain-port", None, None, 0).moved_note(41234) is None


def test_a_taken_port_is_one_line_naming_the_part_and_how_to_move_it(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError) as asked:
            check_free("127.0.0.1", PortChoice("the gateway", "--port", port, None, 8080), tmp_path)
        with pytest.raises(OSError) as kept:
            check_free("127.0.0.1", PortChoice("the gateway", "--port", None, port, 8080), tmp_path)
    assert str(asked.value) == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use "
        "(the gateway's port; pass --port to use another)"
    )
    assert f"(the gateway's port, kept in {tmp_path} so that printed commands" in str(kept.value)
    assert "\n" not in str(kept.value)
    check_free("127.0.0.1", PortChoice("the gateway", "--port", port, None, 8080), tmp_path)  # free again


def test_the_config_is_kept_private_and_refused_when_unreadable(tmp_path: Path) -> None:
    assert read_config(tmp_path) is None
    save_config(tmp_path, _config())
    assert read_config(tmp_path) == _config()
    assert (tmp_path / CONFIG_FILE_NAME).stat().st_mode & 0o077 == 0
    save_config(tmp_path, _config(version=7))
    with pytest.raises(OSError, match="version 7, expected 1"):
        read_config(tmp_path)
    (tmp_path / CONFIG_FILE_NAME).write_text("{", encoding="utf-8")
    with pytest.raises(OSError, match=f"cannot read {tmp_path / CONFIG_FILE_NAME}"):
        read_config(tmp_path)


# --- prepaid credit -------------------------------------------------------------------------

WALLET = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
OTHER = "EbneCQKhz4kcoXntehtSQvpBRQBP8h1sGX353s8EhptM"
DAY_MS = 86_400_000


async def _top_up(store: CreditKeepingStore, wallet: str, amount: int, lapse_ms: int = 30 * DAY_MS) -> None:
    """Credit ``wallet`` as a top-up's delivery does: its claim and its credit in one write."""
    book = CreditBook(store, lapse_days=1, lapse_ms=lapse_ms, upstream_timeout_s=1.0)
    claim = Entry(keys.delivery(wallet, f"{amount:064x}"), "1", 60_000)
    assert await claim_then_put(store, [claim], (), book.credits(wallet, amount)) == 1


async def test_credit_is_saved_private_and_restored_with_its_lapse_time(tmp_path: Path) -> None:
    first = CreditKeepingStore()
    await _top_up(first, WALLET, 1_000_000)
    await _top_up(first, OTHER, 5)
    book = CreditBook(first, lapse_days=1, upstream_timeout_s=1.0)
    spent = await book.hold(WALLET, 2205)
    assert spent is not None and await book.take(spent) is not None
    held = await book.hold(WALLET, 1000)  # a call in flight at exit: its hold is not kept
    assert held is not None
    spent_all = await book.hold(OTHER, 5)
    assert spent_all is not None and await book.take(spent_all) is not None  # nothing left to keep
    before = await credit_state(first, credit_account(WALLET))

    saved = await load_credit(tmp_path, first, 1.0)  # a start over an empty directory saves too
    second = CreditKeepingStore()
    await load_credit(tmp_path, second, 1.0)

    assert list(saved.wallets) == [WALLET] and saved.wallets[WALLET].balance == 1_000_000 - 2205
    assert (tmp_path / CREDIT_FILE_NAME).stat().st_mode & 0o077 == 0
    after = await credit_state(second, credit_account(WALLET))
    assert (after.balance, after.held) == (1_000_000 - 2205, 0)
    assert abs(after.ttl_ms - before.ttl_ms) < 2_000  # the same lapse time, not a renewed one
    assert (await credit_state(second, credit_account(OTHER))).balance == 0
    assert await second.credited() == {WALLET}


async def test_credit_that_lapsed_while_stopped_is_not_restored(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    save_credit(
        tmp_path,
        CreditSnapshot(
            version=CREDIT_VERSION,
            wallets={
                WALLET: KeptCredit(balance=700, lapses_at_ms=now_ms - 1),
                OTHER: KeptCredit(balance=300, lapses_at_ms=now_ms + DAY_MS),
            },
        ),
    )
    store = CreditKeepingStore()

    kept = await load_credit(tmp_path, store, 1.0)

    assert list(kept.wallets) == [OTHER] and read_credit(tmp_path) == kept
    assert (await credit_state(store, credit_account(WALLET))).balance == 0
    assert (await credit_state(store, credit_account(OTHER))).balance == 300


async def test_credit_is_saved_again_only_once_it_moved(tmp_path: Path) -> None:
    store = CreditKeepingStore()
    await _top_up(store, WALLET, 1_000)
    saved = await keep_credit(tmp_path, store, None)
    (tmp_path / CREDIT_FILE_NAME).write_text("{}", encoding="utf-8")  # a stand-in: untouched unless saved

    assert await keep_credit(tmp_path, store, saved) == saved
    assert (tmp_path / CREDIT_FILE_NAME).read_text(encoding="utf-8") == "{}"
    await _top_up(store, WALLET, 1)
    moved = await keep_credit(tmp_path, store, saved)
    assert read_credit(tmp_path) == moved and moved.wallets[WALLET].balance == 1_001


def test_an_unreadable_credit_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / CREDIT_FILE_NAME).write_text('{"version": 2, "wallets": {}}', encoding="utf-8")
    with pytest.raises(OSError, match="version 2, expected 1"):
        read_credit(tmp_path)


def test_credit_on_the_memory_store_is_allowed_to_the_sandbox_only() -> None:
    env = {**FULL_ENV, "GATEWAY_BASE_URL": "https://gw.example", "CREDITS_ENABLED": "true"}
    settings = load_settings(env)
    routes = load_routes(settings.routes_file, named_limits(settings))

    refused = route_plan(routes, settings)
    kept = route_plan(routes, msgspec.structs.replace(settings, credit_kept_in_state_dir=True))

    assert [p for p in refused.problems if p.startswith("CREDITS_ENABLED needs")]
    assert kept.problems == [] and [r.name for r in kept.mounted if r.group == "credits"]


# --- credit and the ledger --------------------------------------------------------------------


async def test_credit_restored_from_the_ledger_is_kept_in_the_file_too(tmp_path: Path) -> None:
    store = CreditKeepingStore(journaled=True)
    lapse_at = int(time.time() * 1000) + DAY_MS
    await restore_credit(
        store, credit_account(WALLET), keys.credit_lapses(), 700, lapse_at, DAY_MS
    )  # as StoreRestorer does

    kept = await keep_credit(tmp_path, store, None)

    assert await store.credited() == {WALLET}
    assert kept.journaled and kept.wallets[WALLET].balance == 700
    assert abs(kept.wallets[WALLET].lapses_at_ms - lapse_at) < 2_000


async def test_the_file_says_journaled_once_a_ledger_runs_and_unjournaled_only_once_credit_moves(
    tmp_path: Path,
) -> None:
    old = CreditSnapshot(version=CREDIT_VERSION, wallets={})  # as written before the ledger
    save_credit(tmp_path, old)
    assert not read_credit(tmp_path).journaled  # type: ignore[union-attr]
    with_ledger = CreditKeepingStore(journaled=True)
    upgraded = await load_credit(tmp_path, with_ledger, 1.0)  # nothing moved: saved anyway
    assert upgraded.journaled and read_credit(tmp_path) == upgraded

    without = CreditKeepingStore(journaled=False)
    unmoved = await load_credit(tmp_path, without, 1.0)
    assert unmoved.journaled and read_credit(tmp_path) == unmoved  # the ledger still has it all
    await _top_up(without, WALLET, 1_000)
    moved = await keep_credit(tmp_path, without, unmoved)
    assert not moved.journaled and read_credit(tmp_path) == moved


def test_the_ledger_stays_off_where_credit_moved_without_it(tmp_path: Path) -> None:
    ledger_dir = tmp_path / "ledger"
    some = {WALLET: KeptCredit(balance=5, lapses_at_ms=int(time.time() * 1000) + DAY_MS)}

    assert not unjournaled_credit(tmp_path, ledger_dir)  # a new state directory
    save_credit(tmp_path, CreditSnapshot(version=CREDIT_VERSION, wallets={}))
    assert not unjournaled_credit(tmp_path, ledger_dir)  # no credit, no ledger to disagree
    save_credit(tmp_path, CreditSnapshot(version=CREDIT_VERSION, wallets=some))
    assert unjournaled_credit(tmp_path, ledger_dir)  # credit the ledger never saw
    save_credit(tmp_path, CreditSnapshot(version=CREDIT_VERSION, wallets=some, journaled=True))
    assert not unjournaled_credit(tmp_path, ledger_dir)
    ledger_dir.mkdir()
    (ledger_dir / "PG_VERSION").write_text("18\n")
    save_credit(tmp_path, CreditSnapshot(version=CREDIT_VERSION, wallets={}))
    assert unjournaled_credit(tmp_path, ledger_dir)  # spent down to nothing behind the ledger's back
