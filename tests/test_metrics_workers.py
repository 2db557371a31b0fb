"""/metrics under ``serve --workers 2``: every worker's requests are counted (multiprocess mode)."""

from __future__ import annotations

import json
import re

import aiohttp

from tests.support.gateway_process import serve

REQUESTS = 40


def _health_count(text: str) -> float:
    found = re.search(r'^x402_requests_total\{method="GET",route="health",status="200"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_metrics_with_two_workers_count_the_requests_of_both(clean_redis_url: str) -> None:
    with serve({"STATE_STORE_REST_URL": clean_redis_url}, "--workers", "2") as gateway:
        async with aiohttp.ClientSession() as http:
            for _ in range(REQUESTS):
                # A fresh connection each time, so the kernel spreads them over both workers.
                async with http.get(f"{gateway.url}/healthz", headers={"connection": "close"}) as r:
                    assert r.status == 200
            for _ in range(6):
                async with http.get(f"{gateway.url}/metrics", headers={"connection": "close"}) as r:
                    text = await r.text()
                    assert r.status == 200
                    # Whichever worker answers, it reports all workers' requests.
                    assert _health_count(text) == REQUESTS
        lines = [json.loads(line) for line in gateway.stdout().splitlines() if line.startswith("{")]
    workers = {line["pid"] for line in lines if line.get("route") == "health"}
    assert len(workers) == 2, "both workers must have served requests for this test to mean anything"
    assert "x402_usage" in text
