"""The load generator: one process, one aiohttp session, a fixed concurrency, bounded work.

``python -m bench.load JOB_JSON`` prints one JSON :class:`Result` on stdout. A job names a
request kind, the server URL, the concurrency, how many requests warm up (not measured) and how
many are measured, and a time cap for each phase. Requests that need credentials are prepared
before the clock starts:

* ``static``: the same request every time (402 challenges, direct-to-provider calls);
* ``paid``: one UNIQUE exact payment per request, built with the gateway's own client-side
  builder (``client.svm_payer``) against a fixed blockhash and the mint's decimals, each
  with its own memo so every transaction signature differs and replay protection never refuses;
* ``siwx``: one fresh SIGN-IN-WITH-X header per request, signed (``client.siwx_signer``)
  over a challenge fetched from the server just before the run (nonces live 300 s); on a paid
  route (a POST with its body) each sign-in spends the wallet's prepaid credit. With ``top_up``
  (a top-up route's path) the wallet is a fresh one that first buys credit there with one exact
  payment, so every run starts from a wallet with no calls behind it;
* ``siwx_live``: the same, but each request is the whole per-call sign-in as a client makes it,
  timed as one: the route's 402, a signature over its challenge, the call;
* ``session``: a fresh wallet buys credit (``top_up``) and opens one credit session
  (``session_path``, its cap ``session_cap``) before the clock; every request then carries its
  token in ``X-CREDIT-SESSION``: no 402, no signature.

When ``cpu_pids`` are given (the server's worker processes), the CPU time they spent during the
measured phase is reported, in total and per request, so a reader can tell whether the server or
the load generator was the bottleneck and project a bigger machine; ``store_pid`` (the Redis
server) is reported apart.
``own_pids`` (every process of the benchmark) lets it report how much CPU other processes on
the machine took meanwhile: a test suite running alongside skews any figure.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import msgspec
from solders.hash import Hash
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentRequirements, ResourceInfo

BLOCKHASH = Hash.from_bytes(hashlib.sha256(b"x402-gateway-bench-blockhash").digest())
"""Fixed: the zero-latency facilitator accepts any payment, so no RPC is needed to build one."""
USDC_DECIMALS = 6
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    signer: Keypair | None = None
    """Sign in per call, on the clock: ask the 402, sign its challenge, then call."""


@dataclass
class Result:
    """One measured phase. Latencies are in milliseconds, per request, at the client."""

    requests: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    server_cpu_pct: float | None = None
    server_cpu_ms_per_request: float | None = None
    store_cpu_pct: float | None = None
    foreign_cpu_pct: float = 0.0
    prepare_s: float = 0.0
    capped: bool = False
    sample_error: str = ""


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def machine_busy_s() -> float:
    """CPU-seconds all cores spent busy since boot (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def own_ticks(pids: Sequence[int]) -> int:
    """CPU ticks of ``pids`` (those that still exist) plus this process."""
    total = 0
    for pid in (*pids, os.getpid()):
        with contextlib.suppress(OSError):  # a process that has exited
            total += cpu_ticks(pid)
    return total


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (from /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


# --- request preparation ---------------------------------------------------------------------


def static_calls(job: dict[str, Any], count: int) -> list[Call]:
    call = Call(job["method"], job["path"], job.get("headers", {}), job.get("body", "").encode())
    return [call] * count


def paid_calls(job: dict[str, Any], count: int) -> list[Call]:
    """``count`` distinct signed payments of the challenge's ``accepts[0]``."""
    requirements = msgspec.convert(job["accepted"], PaymentRequirements)
    resource = msgspec.convert(job["resource"], ResourceInfo) if job.get("resource") else None
    payer = Keypair.from_seed(hashlib.sha256(job.get("payer_seed", "bench-payer").encode()).digest())
    mint = MintInfo(address=requirements.asset, decimals=USDC_DECIMALS)
    body = job["body"].encode()
    run_tag = os.urandom(4).hex()
    calls = []
    for i in range(count):
        memo = f"bench-{run_tag}-{i}".encode()
        tx = build_exact_transaction(requirements, payer, mint, BLOCKHASH, memo=memo)
        payload = build_payment_payload(requirements, tx, resource=resource)
        headers = {
            "content-type": "application/json",
            job.get("header", "payment-signature"): encode_header(payload),
        }
        calls.append(Call("POST", job["path"], headers, body))
    return calls


async def buy_credit(session: aiohttp.ClientSession, job: dict[str, Any], seed: str) -> None:
    """Pay the top-up route ``job["top_up"]`` once from the wallet of ``seed``: it holds credit."""
    url = job["url"] + job["top_up"]
    async with session.post(url) as resp:
        await resp.read()
        challenge = json.loads(base64.b64decode(resp.headers["payment-required"]))
    buy = {"accepted": challenge["accepts"][0], "resource": challenge.get("resource"), "payer_seed": seed}
    call = paid_calls({**buy, "path": job["top_up"], "body": ""}, 1)[0]
    async with session.post(url, headers=call.headers) as resp:
        answer = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"top-up refused: {resp.status} {answer[:300]!r}")


async def siwx_calls(session: aiohttp.ClientSession, job: dict[str, Any], count: int) -> list[Call]:
    """Fetch ``count`` challenges (fresh nonces) and sign each with one wallet. A job with a
    ``method`` and ``body`` (a paid route's POST) asks and calls with them: its sign-ins spend
    prepaid credit."""
    seed = job.get("wallet_seed", "bench-wallet")
    if job.get("top_up"):
        seed = f"{seed}-{os.urandom(8).hex()}"
        await buy_credit(session, job, seed)
    signer = Keypair.from_seed(hashlib.sha256(seed.encode()).digest())
    url = job["url"] + job["path"]
    method, body = job.get("method", "GET"), job.get("body", "").encode()
    headers = {"content-type": "application/json"} if body else {}
    queue = iter(range(count))
    signed: list[Call] = []

    async def fetch() -> None:
        for _ in queue:
            async with session.request(method, url, data=body or None, headers=headers) as resp:
                await resp.read()
                required = json.loads(base64.b64decode(resp.headers["payment-required"]))
            value = sign_in(required["extensions"]["sign-in-with-x"], signer)
            signed.append(Call(method, job["path"], {**headers, "sign-in-with-x": value}, body))

    await asyncio.gather(*(fetch() for _ in range(min(32, count) or 1)))
    return signed


def _fresh_wallet(job: dict[str, Any]) -> str:
    return f"{job.get('wallet_seed', 'bench-wallet')}-{os.urandom(8).hex()}"


async def live_calls(session: aiohttp.ClientSession, job: dict[str, Any], count: int) -> list[Call]:
    """``count`` calls that each sign in on the clock, by a fresh wallet holding credit."""
    seed = _fresh_wallet(job)
    await buy_credit(session, job, seed)
    signer = Keypair.from_seed(hashlib.sha256(seed.encode()).digest())
    method, body = job.get("method", "POST"), job.get("body", "").encode()
    headers = {"content-type": "application/json"} if body else {}
    return [Call(method, job["path"], headers, body, signer)] * count


async def session_calls(session: aiohttp.ClientSession, job: dict[str, Any], count: int) -> list[Call]:
    """``count`` calls on one credit session of a fresh wallet holding credit."""
    seed = _fresh_wallet(job)
    await buy_credit(session, job, seed)
    signer = Keypair.from_seed(hashlib.sha256(seed.encode()).digest())
    url = f"{job['url']}{job['session_path']}?capMicroUsdc={job['session_cap']}"
    async with session.post(url) as resp:
        await resp.read()
        required = json.loads(base64.b64decode(resp.headers["payment-required"]))
    signed = sign_in(required["extensions"]["sign-in-with-x"], signer)
    async with session.post(url, headers={"sign-in-with-x": signed}) as resp:
        opened = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"session refused: {resp.status} {opened[:300]!r}")
    token = json.loads(opened)["result"]["token"]
    method, body = job.get("method", "POST"), job.get("body", "").encode()
    headers = {"content-type": "application/json", "x-credit-session": token}
    return [Call(method, job["path"], headers, body)] * count


async def signed_headers(session: aiohttp.ClientSession, base_url: str, call: Call) -> dict[str, str]:
    """The per-call sign-in's first half: the route's 402, and its challenge signed."""
    assert call.signer is not None
    url = base_url + call.path
    async with session.request(call.method, url, headers=call.headers, data=call.body or None) as resp:
        await resp.read()
        required = json.loads(base64.b64decode(resp.headers["payment-required"]))
    return {**call.headers, "sign-in-with-x": sign_in(required["extensions"]["sign-in-with-x"], call.signer)}


# --- driving ---------------------------------------------------------------------------------


async def drive(
    session: aiohttp.ClientSession,
    base_url: str,
    calls: Sequence[Call],
    concurrency: int,
    expect: int,
    cap_s: float,
    latencies: list[float] | None,
) -> tuple[Counter[int], float, bool, str]:
    """Send ``calls`` with ``concurrency`` workers; returns statuses, elapsed s, capped, an error."""
    statuses: Counter[int] = Counter()
    index = 0
    deadline = time.perf_counter() + cap_s
    capped = False
    sample_error = ""

    async def worker() -> None:
        nonlocal index, capped, sample_error
        while index < len(calls):
            if time.perf_counter() > deadline:
                capped = True
                return
            call = calls[index]
            index += 1
            started = time.perf_counter()
            try:
                headers = (
                    call.headers if call.signer is None else await signed_headers(session, base_url, call)
                )
                async with session.request(
                    call.method, base_url + call.path, headers=headers, data=call.body or None
                ) as resp:
                    body = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, KeyError, ValueError) as exc:
                status, body = 0, repr(exc).encode()
            elapsed = time.perf_counter() - started
            statuses[status] += 1
            if status != expect and not sample_error:
                sample_error = f"{status}: {body[:300].decode(errors='replace')}"
            if latencies is not None:
                latencies.append(elapsed * 1000.0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, time.perf_counter() - started, capped, sample_error


async def run_job(job: dict[str, Any]) -> Result:
    concurrency = int(job["concurrency"])
    warmup, count = int(job["warmup"]), int(job["count"])
    local = (job["local_ip"], 0) if job.get("local_ip") else None
    connector = aiohttp.TCPConnector(limit=concurrency, local_addr=local)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        prepared = time.perf_counter()
        kind = job["kind"]
        if kind == "static":
            calls = static_calls(job, warmup + count)
        elif kind == "paid":
            calls = paid_calls(job, warmup + count)
        elif kind == "siwx":
            calls = await siwx_calls(session, job, warmup + count)
        elif kind == "siwx_live":
            calls = await live_calls(session, job, warmup + count)
        elif kind == "session":
            calls = await session_calls(session, job, warmup + count)
        else:
            raise ValueError(f"unknown job kind {kind!r}")
        prepare_s = time.perf_counter() - prepared
        expect = int(job["expect"])
        cap_s = float(job.get("cap_s", 60.0))
        await drive(session, job["url"], calls[:warmup], concurrency, expect, cap_s, None)
        pids = [int(p) for p in job.get("cpu_pids", [])]
        store_pid = job.get("store_pid")
        own_pids = [int(p) for p in job.get("own_pids", [])]
        ticks = sum(cpu_ticks(p) for p in pids)
        store_ticks = cpu_ticks(store_pid) if store_pid else 0
        busy, ours = machine_busy_s(), own_ticks(own_pids)
        print("measuring", file=sys.stderr, flush=True)  # a profiler may attach now
        latencies: list[float] = []
        statuses, seconds, capped, sample_error = await drive(
            session, job["url"], calls[warmup:], concurrency, expect, cap_s, latencies
        )
        server_cpu_s = (sum(cpu_ticks(p) for p in pids) - ticks) / CLK_TCK if pids else None
        store_cpu_s = (cpu_ticks(store_pid) - store_ticks) / CLK_TCK if store_pid else None
        foreign = (machine_busy_s() - busy) - (own_ticks(own_pids) - ours) / CLK_TCK
    latencies.sort()
    n = len(latencies)
    return Result(
        requests=n,
        seconds=round(seconds, 3),
        rps=round(n / seconds, 1) if seconds else 0.0,
        p50_ms=round(percentile(latencies, 50), 3),
        p90_ms=round(percentile(latencies, 90), 3),
        p99_ms=round(percentile(latencies, 99), 3),
        mean_ms=round(sum(latencies) / n, 3) if n else 0.0,
        statuses={str(k): v for k, v in sorted(statuses.items())},
        unexpected=sum(v for k, v in statuses.items() if k != expect),
        server_cpu_pct=round(server_cpu_s / seconds * 100, 1)
        if server_cpu_s is not None and seconds
        else None,
        server_cpu_ms_per_request=round(server_cpu_s * 1000 / n, 4)
        if server_cpu_s is not None and n
        else None,
        store_cpu_pct=round(store_cpu_s / seconds * 100, 1) if store_cpu_s is not None and seconds else None,
        foreign_cpu_pct=round(max(foreign, 0.0) / seconds * 100, 1) if seconds else 0.0,
        prepare_s=round(prepare_s, 2),
        capped=capped,
        sample_error=sample_error,
    )


def main() -> None:
    job = json.loads(sys.argv[1])
    result = asyncio.run(run_job(job))
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
