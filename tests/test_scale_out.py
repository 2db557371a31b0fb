"""Scale-out: four gateway processes sharing one real Redis hold one rate limit within 5 %.

Each process is ``x402-gateway serve`` as an operator runs it, with its own port; the limit is a
literal one in a test route table. The period is long (600 s, one token back every 3 s) so that
the GCRA refill during the burst stays far below the 5 % tolerance.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from gateway.store import Bucket
from gateway.store.limits import check_then_limit
from gateway.store.redis import MAX_CONNECTIONS, RedisStore
from tests.support.gateway_process import GatewayProcess, serve

pytestmark = pytest.mark.slow

LIMIT = 200
PROCESSES = 4
REQUESTS = 800
ROUTES_YAML = f"""
routes:
  - name: health
    path: /healthz
    method: GET
    access: public
    handler: health
    rate_limits: [{{scope: "scale-test", limit: {LIMIT}, period_seconds: 600}}]
"""


async def _fire(gateways: list[GatewayProcess]) -> tuple[Counter[int], set[str], float]:
    """REQUESTS concurrent GETs, round-robin over the gateways: statuses, Retry-After values, seconds."""
    retry_after: set[str] = set()
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def one(i: int) -> int:
            async with http.get(f"{gateways[i % len(gateways)].url}/healthz") as response:
                await response.read()
                if response.status == 429:
                    retry_after.add(response.headers.get("Retry-After", ""))
                return response.status

        started = time.monotonic()
        statuses = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
        return Counter(statuses), retry_after, time.monotonic() - started


async def test_four_processes_on_one_redis_hold_the_rate_limit_within_5_percent(
    clean_redis_url: str, tmp_path: Path
) -> None:
    routes_file = tmp_path / "routes.yaml"
    routes_file.write_text(ROUTES_YAML)
    env = {"STATE_STORE_REST_URL": clean_redis_url, "ROUTES_FILE": str(routes_file)}

    with contextlib.ExitStack() as stack:
        gateways = [stack.enter_context(serve(env)) for _ in range(PROCESSES)]
        statuses, retry_after, seconds = await _fire(gateways)

    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] + statuses[429] == REQUESTS
    assert abs(statuses[200] - LIMIT) <= LIMIT * 0.05, (statuses, seconds)
    assert retry_after and all(int(value) >= 1 for value in retry_after)


async def test_one_process_waits_for_a_pooled_connection_rather_than_failing(clean_redis_url: str) -> None:
    """More concurrent store calls than the pool holds queue for a connection; none is refused."""
    store = RedisStore(clean_redis_url)
    pool_test = Bucket("{x402gw}:rl:pool-test", LIMIT, 600_000)
    try:
        lookups = await asyncio.gather(
            *(check_then_limit(store, [], [pool_test]) for _ in range(3 * MAX_CONNECTIONS))
        )
    finally:
        await store.close()

    assert [lookup.decisions[0].allowed for lookup in lookups].count(True) == LIMIT
