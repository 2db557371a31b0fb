"""/metrics under ``serve --workers 2``: every worker's requests are counted (multiprocess mode)."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp

from tests.support.gateway_process import GatewayProcess, serve

BATCH = 20
MAX_BATCHES = 20


def _health_count(text: str) -> float:
    found = re.search(r'^x402_requests_total\{method="GET",route="health",status="200"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _health_pids(gateway: GatewayProcess) -> set[int]:
    lines = [json.loads(line) for line in gateway.stdout().splitlines() if line.startswith("{")]
    return {line["pid"] for line in lines if line.get("route") == "health"}


async def test_metrics_with_two_workers_count_the_requests_of_both(clean_redis_url: str) -> None:
    with serve(
        {"STATE_STORE_REST_URL": clean_redis_url, "ROUTE_GROUPS": "none"}, "--workers", "2"
    ) as gateway:
        sent = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

            async def health() -> None:
                async with http.get(f"{gateway.url}/healthz") as r:
                    assert r.status == 200

            # Concurrent fresh connections until both workers have served some (bounded).
            for _ in range(MAX_BATCHES):
                await asyncio.gather(*(health() for _ in range(BATCH)))
                sent += BATCH
                await asyncio.sleep(0.05)
                if len(_health_pids(gateway)) == 2:
                    break
            assert len(_health_pids(gateway)) == 2, "both workers must serve for this test to mean anything"
            for _ in range(6):
                async with http.get(f"{gateway.url}/metrics") as r:
                    text = await r.text()
                    assert r.status == 200
                    # Whichever worker answers, it reports all workers' requests.
                    assert _health_count(text) == sent
    assert "x402_usage" in text
