"""``x402-gateway store migrate-keys``: a store written by the release before the hash tag is
brought under the tagged names, its credit spendable again, on Redis and on Upstash."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.methods.credit.book import credit_account
from gateway.store import keys, open_store
from gateway.store.credit import credit_state
from gateway.store.migrate import migrate_keys

WALLET = "Wa11et1111111111111111111111111111111111111"
OLD = "x402gw:"
"""How the release before the tag spelled the gateway's root (what the migration finds)."""


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


@pytest.mark.parametrize("backend", ["redis", "upstash"])
async def test_old_keys_are_renamed_with_their_values_and_lifetimes_and_credit_spends_again(
    backend: str, raw: aioredis.Redis, clean_redis_url: str, upstash_url_and_token: tuple[str, str]
) -> None:
    await _write_old_release_state(raw)
    url, token = upstash_url_and_token if backend == "upstash" else (clean_redis_url, None)

    done = await migrate_keys(url, token)

    assert (done.renamed, done.kept) == (5, [])
    assert await raw.keys(f"{OLD}*") == [] and await raw.keys("x402:svm:*") == []
    assert await raw.get(keys.delivery("ab" * 32)) == "answer"
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
