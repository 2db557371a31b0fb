"""Scenario (k) of bench/run.py: a JSON-RPC batch on credit against the same calls made one by one.

A gateway with credit on (``x402-gateway serve --workers 1``, pinned like the others) on the
run's Redis (a database of its own), with the zero-latency provider and facilitator stubs (the
provider answers a JSON-RPC batch with one result per call). Before the clock each measured run's
wallet (a fresh one) buys credit with a top-up and opens one credit session; then, at c=8 and in
the same interleaved rounds:

* 20 getBalance calls per request to ``POST /v1/x402/solana/mainnet/provider_a/rpc`` on the
  session (each call validated and priced, the batch's credit held in one store round trip, one
  upstream batch, the answered calls taken in one more);
* the same getBalance, one call per request, on a session (``X-CREDIT-SESSION``).

Target: at least 5x the calls/s of the separate session calls (calls/s of a batch row: its
requests/s x 20).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ACCOUNT, SERVER_CPU, Bench, Server, bench_routes_file, gateway_env, table
from bench.credit import session_job
from bench.procs import GATEWAY_ARGS, python_server, redis_url, started

BATCH = "batch"
CALLS = 20
CONCURRENCY = 8
BATCH_PATH = "/v1/x402/solana/mainnet/provider_a/rpc"
IN_BATCHES = f"gateway, credit session: {CALLS} getBalance calls per request ({BATCH_PATH})"
ONE_BY_ONE = "gateway, credit session: one getBalance call per request"
REDIS_DATABASE = 10
"""A database of the run's Redis server that no other scenario uses."""
SPEEDUP_TARGET = 5.0


def batch_body() -> str:
    return json.dumps(
        [{"jsonrpc": "2.0", "id": i, "method": "getBalance", "params": [ACCOUNT]} for i in range(CALLS)]
    )


def run_batch(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    p = bench.profile
    c = CONCURRENCY
    print(f"(k) {CALLS} calls per request on credit against one call per request (c={c})", flush=True)
    gateway = python_server("batch gateway", GATEWAY_ARGS, SERVER_CPU if bench.pin else None, hypercorn=True)
    with tempfile.TemporaryDirectory(prefix="x402-bench-batch-routes-") as tmp:
        env = gateway_env(gateway.port, stubs, bench_routes_file(Path(tmp)), "WARNING")
        env.update(CREDITS_ENABLED="true", STATE_STORE_REST_URL=redis_url(servers, REDIS_DATABASE))
        gateway.env = env
        with started(bench, [gateway], ["/healthz"]):
            warmup, count = p.paid_throughput
            batches = (max(c, warmup // CALLS), max(4 * c, count // 4))
            batched = {**session_job(gateway.url, c, batches, "session"), "path": BATCH_PATH}
            specs: list[tuple[dict[str, Any], str, str, Server | None]] = [
                (
                    {**batched, "body": batch_body()},
                    BATCH,
                    IN_BATCHES,
                    gateway,
                ),
                (session_job(gateway.url, c, (warmup, count), "session"), BATCH, ONE_BY_ONE, gateway),
            ]
            bench.load_rounds(specs, p.rounds)


def batch_summary(bench: Bench) -> list[str]:
    """The summary table's line for (k) (nothing when it did not run)."""
    batched, single = bench.find(BATCH, IN_BATCHES, CONCURRENCY), bench.find(BATCH, ONE_BY_ONE, CONCURRENCY)
    if batched is None or single is None:
        return []
    calls = batched["rps"] * CALLS
    speedup = calls / single["rps"]
    found = "met" if speedup >= SPEEDUP_TARGET else "**NOT met**"
    if any(r["foreign_cpu_pct"] > 5 for r in (batched, single)):
        found += " (disturbed measurement)"
    return [
        f"| JSON-RPC batch (k): getBalance calls/s, {CALLS} per request / one per request, credit session "
        f"(c={CONCURRENCY}) | {speedup:.1f} ({calls:.0f} vs {single['rps']:.0f}) "
        f"| >= {SPEEDUP_TARGET:.0f}x: {found} |"
    ]


def batch_report(bench: Bench) -> list[str]:
    """The report's section for (k) (nothing when it did not run)."""
    if bench.find(BATCH, ONE_BY_ONE, CONCURRENCY) is None:
        return []
    return [
        "",
        "## (k) a JSON-RPC batch on credit",
        "",
        f"`x402-gateway serve --workers 1` with `CREDITS_ENABLED=true` on Redis (its own database), the "
        f"zero-latency stubs. Each measured run's wallet (a fresh one) buys credit and opens a credit "
        f"session before the clock. The batch row's requests each carry {CALLS} getBalance calls to the "
        f"provider's JSON-RPC endpoint (its calls/s are its req/s x {CALLS}); the other row's carry one, "
        "to the per-method route.",
        "",
        *table(bench, BATCH, None),
    ]
