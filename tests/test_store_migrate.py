"""``x402-gateway store migrate-keys``: a store written by the release before the hash tag, or by
the one that kept every key on one slot, is brought under the current names, its credit
spendable again, on Redis and on Upstash."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.methods.credit.book import credit_account
from gateway.methods.credit.lapse import CreditSweeper
from gateway.store import keys, open_store
from gateway.store.credit import credit_state
from gateway.store.migrate import CreditMigrated, migrate_keys
from tests.support.redis_cluster import raw_client

WALLET = "Wa11et1111111111111111111111111111111111111"
OLD = "x402gw:"
"""How the release before the tag spelled the gateway's root (what the migration finds)."""
ONE = "{x402gw}:"
"""How the release that kept every key on one slot spelled it."""


@pytest.fixture
async def raw(clean_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(clean_redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def _write_old_release_state(raw: aioredis.Redis) -> None:
    """What the old release left: a wallet's credit (balance, lapse index entry), a delivered
    payment, a bucket, the internal facilitator's settlement record."""
    now_ms = int((await raw.time())[0]) * 1000
    await raw.set(f"{OLD}credit:{WALLET}", "5000", px=3_600_000)
    await raw.zadd(f"{OLD}credit-lapses", {WALLET: now_ms + 3_000_000})
    await raw.set(f"{OLD}delivered:{'ab' * 32}", "answer", px=600_000)
    await raw.set(f"{OLD}rl:das:203.0.113.7", "1", px=60_000)
    await raw.set(f"x402:svm:settle:{'cd' * 32}", "record", px=900_000)
    await raw.set(f"{OLD}usage:getSlot:paid", "41")
    await raw.set(f"{OLD}siwx:n1", WALLET, px=300_000)  # a nonce: named after the wallet it holds


async def _write_one_slot_release_state(raw: aioredis.Redis) -> None:
    """What the release that put every key on one slot left of a family that now spreads."""
    await raw.set("{x402gw}:usage:getSlot:settled", "40")
    await raw.set("{x402gw}:rlw:challenge:ip:203.0.113.7:9", "2", px=60_000)


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_old_keys_are_renamed_with_their_values_and_lifetimes_and_credit_spends_again(
    backend: str, raw: aioredis.Redis, clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    await _write_old_release_state(raw)
    await _write_one_slot_release_state(raw)
    await raw.set(keys.credit_balance("Other1"), "9")  # named as now: left alone
    url, token = upstash_url_and_token if backend == "upstash" else (clean_redis_url, None)

    done = await migrate_keys(url, token)

    assert (done.renamed, done.kept) == (9, [])
    assert await raw.keys(f"{OLD}*") == [] and await raw.keys("x402:svm:*") == []
    assert await raw.get(keys.sign_in_nonce(WALLET, "n1")) == WALLET
    assert await raw.keys("{x402gw}:usage:*") == [] and await raw.keys("{x402gw}:rlw:*") == []
    assert await raw.get(keys.usage("getSlot", "paid")) == "41"
    assert await raw.get(keys.usage("getSlot", "settled")) == "40"
    assert 0 < await raw.pttl(keys.limit_window("challenge:ip", "203.0.113.7", 9)) <= 60_000
    assert await raw.get(keys.credit_balance("Other1")) == "9"
    # A payment's keys do not say its payer: left under the one-slot name, to expire.
    assert 0 < await raw.pttl(f"{ONE}delivered:{'ab' * 32}") <= 600_000
    assert await raw.get(keys.settlement("cd" * 32)) == "record"
    assert 3_500_000 < await raw.pttl(keys.credit_balance(WALLET)) <= 3_600_000
    store = open_store(url, token)
    try:
        state = await credit_state(store, credit_account(WALLET))
    finally:
        await store.close()
    assert state.balance == 5000 and 2_900_000 < state.ttl_ms <= 3_000_000


async def test_a_key_the_new_release_wrote_already_is_kept_and_the_old_one_reported(
    raw: aioredis.Redis, clean_redis_url: str
) -> None:
    await raw.set(f"{OLD}credit:{WALLET}", "5000")
    await raw.set(keys.credit_balance(WALLET), "70")

    done = await migrate_keys(clean_redis_url, None)

    assert (done.renamed, done.kept) == (0, [f"{OLD}credit:{WALLET}"])
    assert await raw.get(keys.credit_balance(WALLET)) == "70"
    assert await raw.get(f"{OLD}credit:{WALLET}") == "5000"


def test_the_command_migrates_and_refuses_a_store_that_cannot_hold_old_keys(clean_redis_url: str) -> None:
    def run(url: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "STATE_STORE_REST_URL": url}
        command = [sys.executable, "-m", "gateway.cli", "store", "migrate-keys"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)

    migrated = run(clean_redis_url)
    refused = run("memory://")

    assert (migrated.returncode, migrated.stdout) == (0, "renamed 0 keys to their tagged names\n")
    assert refused.returncode == 2 and "only a Redis" in refused.stderr


async def test_on_a_cluster_the_spread_families_move_off_the_one_slot(clean_cluster_url: str) -> None:
    """The release that kept every key on one slot ran on clusters: its usage counters and limit
    windows are copied to their own slots (value and lifetime kept) and deleted; a key the new
    release wrote already is kept, the old one reported; every other key is left alone."""
    raw = raw_client(clean_cluster_url)
    try:
        await raw.set("{x402gw}:usage:getSlot:paid", "41")
        await raw.set("{x402gw}:rlw:challenge:ip:203.0.113.7:9", "2", px=60_000)
        await raw.set("{x402gw}:usage:getSlot:failed", "5")
        await raw.set(keys.usage("getSlot", "failed"), "3")
        await raw.set(keys.credit_balance(WALLET), "9")

        done = await migrate_keys(clean_cluster_url, None)

        assert (done.renamed, done.kept) == (2, ["{x402gw}:usage:getSlot:failed"])
        assert await raw.get(keys.usage("getSlot", "paid")) == "41"
        assert await raw.get("{x402gw}:usage:getSlot:paid") is None
        assert 0 < await raw.pttl(keys.limit_window("challenge:ip", "203.0.113.7", 9)) <= 60_000
        assert await raw.get(keys.usage("getSlot", "failed")) == "3"
        assert await raw.get(keys.credit_balance(WALLET)) == "9"
        assert (await migrate_keys(clean_cluster_url, None)).renamed == 0
    finally:
        await raw.aclose()


async def _write_one_slot_release_credit(raw: Any, now_ms: int) -> None:
    """What the release before per-wallet credit left: the lapse index as the only record of when
    a balance lapses, one hash of what top-ups found lapsed, one shared ledger mark, and sessions
    named by their token's digest alone."""
    await raw.set(f"{ONE}credit:{WALLET}", "5000", px=3_600_000)
    await raw.zadd(keys.credit_lapses(), {WALLET: now_ms + 3_000_000, "Gone1": now_ms - 5})
    await raw.hset(keys.LEGACY_CREDIT_LAPSED, mapping={"Lapsed1": "700", WALLET: "30"})
    await raw.set(keys.LEGACY_LEDGER_MARK, "41")
    await raw.hset(f"{ONE}credit-session:{'ee' * 32}", mapping={"wallet": WALLET, "cap": "9", "spent": "0"})
    await raw.hset(
        keys.credit_session(WALLET, "ff" * 32), mapping={"wallet": WALLET, "cap": "9", "spent": "0"}
    )


async def _assert_credit_brought_to_each_wallet(url: str, token: str | None, raw: Any, now_ms: int) -> None:
    assert int(await raw.get(keys.credit_lapse(WALLET))) == now_ms + 3_000_000
    assert 3_500_000 < await raw.pttl(keys.credit_lapse(WALLET)) <= 3_600_000  # as long as its balance
    assert await raw.get(keys.credit_lapse("Gone1")) is None  # no balance left: nothing to keep
    assert (await raw.get(keys.credit_lapsed("Lapsed1")), await raw.get(keys.credit_lapsed(WALLET))) == (
        "700",
        "30",
    )
    assert not await raw.exists(keys.LEGACY_CREDIT_LAPSED) and not await raw.exists(keys.LEGACY_LEDGER_MARK)
    assert not await raw.exists(f"{ONE}credit-session:{'ee' * 32}")  # ended: no token to name it anew
    assert await raw.exists(keys.credit_session(WALLET, "ff" * 32))
    store = open_store(url, token)
    try:
        state = await credit_state(store, credit_account(WALLET))
        # The sweeper counts the moved lapsed credit at its first sweep, once (the wallets are due).
        swept = [await CreditSweeper(store).sweep() for _ in range(2)]
    finally:
        await store.close()
    assert state.balance == 5000 and 2_900_000 < state.ttl_ms <= 3_000_000
    assert swept == [730, 0]


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_the_one_slot_releases_credit_is_brought_to_each_wallets_keys(
    backend: str, raw: aioredis.Redis, clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    now_ms = int((await raw.time())[0]) * 1000
    await _write_one_slot_release_credit(raw, now_ms)
    url, token = upstash_url_and_token if backend == "upstash" else (clean_redis_url, None)

    done = await migrate_keys(url, token)
    again = await migrate_keys(url, token)  # a run again (after a crash, say) moves nothing twice

    assert done.credit == CreditMigrated(lapse_times=1, lapsed=2, sessions_ended=1)
    assert again.credit == CreditMigrated()
    await _assert_credit_brought_to_each_wallet(url, token, raw, now_ms)


async def test_a_migration_cut_short_after_moving_lapsed_credit_counts_it_once(
    raw: aioredis.Redis, clean_redis_url: str
) -> None:
    """The old hash's field is deleted after its wallet's counter is set: a run cut between the two
    finds the field again and sets nothing twice (the counter is set only where absent)."""
    await raw.hset(keys.LEGACY_CREDIT_LAPSED, mapping={"Lapsed1": "700"})
    await raw.set(keys.credit_lapsed("Lapsed1"), "700")  # the cut run got this far

    done = await migrate_keys(clean_redis_url, None)

    assert done.credit == CreditMigrated(lapsed=1)
    assert await raw.get(keys.credit_lapsed("Lapsed1")) == "700"
    assert not await raw.exists(keys.LEGACY_CREDIT_LAPSED)


async def test_on_a_cluster_the_one_slot_releases_credit_is_brought_to_each_wallets_keys(
    clean_cluster_url: str,
) -> None:
    raw = raw_client(clean_cluster_url)
    try:
        now_ms = int(time.time() * 1000)
        await _write_one_slot_release_credit(raw, now_ms)

        done = await migrate_keys(clean_cluster_url, None)
        again = await migrate_keys(clean_cluster_url, None)

        assert done.credit == CreditMigrated(lapse_times=1, lapsed=2, sessions_ended=1)
        assert again.credit == CreditMigrated()
        await _assert_credit_brought_to_each_wallet(clean_cluster_url, None, raw, now_ms)
    finally:
        await raw.aclose()


async def _write_one_slot_release_tagged_state(raw: Any) -> None:
    """What the release that kept every key on one slot left of the families now on a wallet's,
    an IP's, a token account's or a payment's tag, and a payment, which stays."""
    await raw.set(f"{ONE}siwx:n0nce", WALLET, px=300_000)
    await raw.hset(f"{ONE}credit-holds:{WALLET}", mapping={"call": "10 99999999999999999"})
    await raw.set(f"{ONE}credit-holds:{WALLET}:taken:t1", "1", px=60_000)
    await raw.set(f"{ONE}credit-call:{WALLET}:n0nce", "answered", px=600_000)
    await raw.set(f"{ONE}fee-guard:cooling:ip:203.0.113.7", "1", px=600_000)
    await raw.set(f"{ONE}fee-guard:settled:owner:{WALLET}", "3", px=600_000)
    await raw.hset(f"{ONE}fee-guard:funds:Acct1", mapping={"t": "5 99999999999999999"})
    await raw.set(f"{ONE}fee-guard:counted:payer:Sig1", "1", px=600_000)
    await raw.set(f"{ONE}svm:settle:{'cd' * 32}", "record", px=900_000)
    await raw.set(f"{ONE}svm:settle:{'cd' * 32}:done", "Sig1", px=900_000)
    await raw.set(f"{ONE}pay:{'ab' * 32}", "claimant", px=900_000)
    await raw.set(f"{ONE}pending:{'ab' * 32}", '{"fingerprint":"f","claimant":"c"}', px=900_000)
    await raw.set(f"{ONE}pending:{'ef' * 32}", "", px=900_000)  # closed


async def _assert_tagged_state_moved(raw: Any) -> None:
    assert await raw.get(keys.sign_in_nonce(WALLET, "n0nce")) == WALLET
    assert 0 < await raw.pttl(keys.sign_in_nonce(WALLET, "n0nce")) <= 300_000
    assert await raw.hgetall(keys.credit_holds(WALLET)) == {"call": "10 99999999999999999"}
    assert await raw.get(keys.credit_holds(WALLET) + ":taken:t1") == "1"
    assert await raw.get(keys.credit_call(WALLET, "n0nce")) == "answered"
    assert await raw.get(keys.fee_guard_cooldown("ip", "203.0.113.7")) == "1"
    assert await raw.get(keys.fee_guard_record("owner", WALLET)) == "3"
    assert await raw.hgetall(keys.fee_guard_funds("Acct1")) == {"t": "5 99999999999999999"}
    assert await raw.get(keys.fee_guard_counted("payer", "Sig1")) == "1"
    assert await raw.get(keys.settlement("cd" * 32)) == "record"
    assert await raw.get(keys.settlement_reported(keys.settlement("cd" * 32))) == "Sig1"
    assert await raw.get(f"{ONE}pay:{'ab' * 32}") == "claimant"  # its payer is not in its name
    assert await raw.get(f"{ONE}siwx:n0nce") is None


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_the_one_slot_releases_keys_move_to_their_wallets_ips_accounts_and_payments_tags(
    backend: str, raw: aioredis.Redis, clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    await _write_one_slot_release_tagged_state(raw)
    url, token = upstash_url_and_token if backend == "upstash" else (clean_redis_url, None)

    done = await migrate_keys(url, token)

    assert (done.renamed, done.kept, done.settling) == (10, [], 1)
    await _assert_tagged_state_moved(raw)
    assert (await migrate_keys(url, token)).renamed == 0


async def test_on_a_cluster_the_one_slot_releases_keys_move_to_their_tags(clean_cluster_url: str) -> None:
    """Copied across slots (value and lifetime kept), then deleted from the one slot."""
    raw = raw_client(clean_cluster_url)
    try:
        await _write_one_slot_release_tagged_state(raw)

        done = await migrate_keys(clean_cluster_url, None)

        assert (done.renamed, done.kept, done.settling) == (10, [], 1)
        await _assert_tagged_state_moved(raw)
        assert (await migrate_keys(clean_cluster_url, None)).renamed == 0
    finally:
        await raw.aclose()
