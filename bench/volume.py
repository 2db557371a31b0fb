"""Scenario (i) of bench/run.py: one agent on one IP calling in volume from credit, at the
gateway's default limits.

A gateway with credit on (``x402-gateway serve --workers 1`` on the run's Redis, a database of
its own), the packaged routes.yaml and every ``RATE_LIMIT_*`` at its default (50 calls/s per RPC
scope and per wallet, 120 unpaid challenges a minute per IP), the zero-latency stubs. One fresh
wallet buys credit with a top-up, then calls getBalance the way the reference sign-in hook does,
one call at a time per slot: the request without a credential (its 402), a sign-in signed over
that 402's challenge, the request again with it. Calls start at a fixed rate whether or not the
earlier ones answered (an open loop, as independent tasks of one agent would), all from one
source address. Target: 50 calls/s for 10 s with no 429: each 402 answered with an admitted
sign-in is handed back to the challenge limit, so only the route's own limits bound the agent.

``python -m bench.volume JOB_JSON`` is the load generator (one process, pinned like
``bench.load``); it prints one JSON result.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
from solders.keypair import Keypair

from bench.common import (
    CLIENT_CPU,
    PAID_PATH,
    REPO,
    RPC_BODY,
    SERVER_CPU,
    Bench,
    Row,
    Server,
    base_env,
    gateway_env,
    pinner,
)
from bench.load import CLK_TCK, buy_credit, machine_busy_s, own_ticks, percentile
from bench.procs import GATEWAY_ARGS, python_server, redis_url, started
from client.siwx_signer import sign_in

VOLUME = "volume"
TARGET = "one IP, from credit, 402 + sign-in per call"
RATE = 50
SECONDS = 10
REDIS_DATABASE = 10
"""A database of the run's Redis server that no other scenario uses."""
TOP_UP_PATH = "/v1/x402/credits/top-up/1"


# --- the load generator (its own process) ----------------------------------------------------


async def paced_sign_ins(job: dict[str, Any]) -> dict[str, Any]:
    local = (job["local_ip"], 0) if job.get("local_ip") else None
    connector = aiohttp.TCPConnector(limit=0, local_addr=local)
    timeout = aiohttp.ClientTimeout(total=30)
    seed = f"bench-volume-{os.urandom(8).hex()}"
    signer = Keypair.from_seed(hashlib.sha256(seed.encode()).digest())
    url, body = job["url"] + job["path"], job["body"].encode()
    headers = {"content-type": "application/json"}
    rate, n = int(job["rate"]), int(job["rate"]) * int(job["seconds"])
    challenges: Counter[int] = Counter()
    calls: Counter[int] = Counter()
    latencies: list[float] = []
    sample = ""

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await buy_credit(session, {"url": job["url"], "top_up": job["top_up"]}, seed)

        async def call(i: int, start: float) -> None:
            nonlocal sample
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            began = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                answer = await resp.read()
                challenges[resp.status] += 1
                required = resp.headers.get("payment-required")
            if required is None:
                sample = sample or f"{resp.status}: {answer[:300].decode(errors='replace')}"
                return
            extension = json.loads(base64.b64decode(required))["extensions"]["sign-in-with-x"]
            signed = {**headers, "sign-in-with-x": sign_in(extension, signer)}
            async with session.post(url, data=body, headers=signed) as resp:
                answer = await resp.read()
                calls[resp.status] += 1
            latencies.append((time.perf_counter() - began) * 1000.0)
            if resp.status != 200:
                sample = sample or f"{resp.status}: {answer[:300].decode(errors='replace')}"

        own_pids = [int(p) for p in job.get("own_pids", [])]
        busy, ours = machine_busy_s(), own_ticks(own_pids)
        start = time.perf_counter()
        await asyncio.gather(*(call(i, start) for i in range(n)))
        seconds = time.perf_counter() - start
        foreign = (machine_busy_s() - busy) - (own_ticks(own_pids) - ours) / CLK_TCK

    latencies.sort()
    refused = challenges[429] + calls[429]
    return {
        "calls": n,
        "answered": calls[200],
        "seconds": round(seconds, 2),
        "rps": round(calls[200] / seconds, 1),
        "too_many": refused,
        "first_step": {str(k): v for k, v in sorted(challenges.items())},
        "second_step": {str(k): v for k, v in sorted(calls.items())},
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "sample_error": sample,
        "unexpected": n - calls[200],
        "foreign_cpu_pct": round(max(foreign, 0.0) / seconds * 100, 1),
    }


def main() -> None:
    print(json.dumps(asyncio.run(paced_sign_ins(json.loads(sys.argv[1])))))


# --- the scenario (called by bench/run.py) ---------------------------------------------------


def run_volume(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    print(f"(i) one IP from credit, 402 + sign-in per call, {RATE}/s for {SECONDS} s", flush=True)
    gateway = python_server("volume gateway", GATEWAY_ARGS, SERVER_CPU if bench.pin else None, hypercorn=True)
    env = gateway_env(gateway.port, stubs, REPO / "gateway" / "routes.yaml", "WARNING")
    for name in [k for k in env if k.startswith("RATE_LIMIT_")]:
        del env[name]  # every limit at its default
    env.update(CREDITS_ENABLED="true", STATE_STORE_REST_URL=redis_url(servers, REDIS_DATABASE))
    gateway.env = env
    with started(bench, [gateway], ["/healthz"]):
        job = {
            "url": gateway.url,
            "path": PAID_PATH,
            "body": RPC_BODY,
            "rate": RATE,
            "seconds": SECONDS,
            "top_up": TOP_UP_PATH,
            "local_ip": bench.next_ip(),
            "own_pids": bench.own_pids,
        }
        proc = subprocess.run(
            [sys.executable, "-m", "bench.volume", json.dumps(job)],
            cwd=REPO,
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=SECONDS + 120,
            preexec_fn=pinner(CLIENT_CPU if bench.pin else None),
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"volume load generator failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    print(
        f"  {VOLUME:<9} {result['answered']}/{result['calls']} answered in {result['seconds']} s "
        f"({result['rps']:.1f}/s), 429: {result['too_many']}, p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms {result['sample_error'][:160]}",
        flush=True,
    )
    bench.rows.append(Row(VOLUME, TARGET, 1, result))


def volume_summary(bench: Bench) -> list[str]:
    """The summary table's line for (i) (nothing when it did not run)."""
    found = bench.find(VOLUME, TARGET, 1)
    if found is None:
        return []
    ok = found["too_many"] == 0 and found["answered"] == found["calls"]
    return [
        f"| one IP from credit, 402 + sign-in per call, default limits (i) "
        f"| {found['answered']} of {found['calls']} answered at {found['rps']:.1f}/s, "
        f"{found['too_many']} x 429 | {RATE}/s for {SECONDS} s, 0 x 429: {'met' if ok else '**NOT met**'} |"
    ]


def volume_report(bench: Bench) -> list[str]:
    """The report's section for (i) (nothing when it did not run)."""
    found = bench.find(VOLUME, TARGET, 1)
    if found is None:
        return []
    return [
        "",
        "## (i) one IP in volume from credit",
        "",
        f"`x402-gateway serve --workers 1`, credit on, Redis, every limit at its default. One wallet "
        f"buys credit, then {RATE} calls a second start for {SECONDS} s from one source address, each "
        "as the reference sign-in hook makes it: the 402, a sign-in over its challenge, the call.",
        "",
        "| calls | answered | seconds | calls/s | 429 | first step | second step | p50 ms | p99 ms |",
        "|---:|---:|---:|---:|---:|---|---|---:|---:|",
        f"| {found['calls']} | {found['answered']} | {found['seconds']} | {found['rps']} "
        f"| {found['too_many']} | {found['first_step']} | {found['second_step']} "
        f"| {found['p50_ms']} | {found['p99_ms']} |",
    ]


if __name__ == "__main__":
    main()
