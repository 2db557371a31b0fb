"""What a tool call at ``/mcp`` costs over the same HTTP call, on the sandbox.

Not a test and not part of ``bench/run.py``: a small timing script. It starts ``x402-gateway
sandbox`` (its local chain is the provider), buys 1 USDC of prepaid credit with the demo wallet
and opens a credit session, then times, interleaved call by call, one client at a time (c=1):

getBalance paid from the session: ``POST /v1/x402/.../getBalance`` with ``X-CREDIT-SESSION``,
against ``tools/call`` of the same tool with the token in ``_meta``; and, for the floor, a bare
MCP ``ping`` against ``GET /healthz``: what the SDK's stateless transport costs a request by
itself. (Unpaid calls are left out: the sandbox keeps its per-IP limit on 402s, which a timing
loop would run into.)

Both MCP requests are the JSON-RPC a Streamable-HTTP client POSTs (stateless: no session set-up
per call), so the difference is the gateway's MCP handling alone. Prints p50 and mean latency per
path and the overhead in milliseconds.

    python -m bench.mcp_overhead [--calls 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from client.pay import SpendPolicy, load_keypair, pay
from client.sessions import open_session
from gateway.config import PACKAGED_ROUTES_FILE

ROUTE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
TOOL = "solana.mainnet.provider_a.rpc.getBalance"
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _unlimited(state: Path) -> Path:
    """The packaged table with the RPC routes' per-second limits lifted: one client calls as fast
    as it can, and the limits would time the 429s instead (the sandbox passes ROUTES_FILE on)."""
    text = PACKAGED_ROUTES_FILE.read_text()
    for name in ("rpc_wallet", "rpc"):
        text = text.replace(f"limit: {name}}}", "limit: 1000000, period_seconds: 1}")
    path = state / "routes.yaml"
    path.write_text(text)
    return path


def _start(state: Path, port: int, chain_port: int) -> subprocess.Popen[bytes]:
    ports = ["--port", str(port), "--chain-port", str(chain_port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "sandbox", *ports, "--state-dir", str(state), "--no-ledger"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={
            **os.environ,
            "LOG_LEVEL": "WARNING",
            "RATE_LIMIT_CHALLENGE_PER_MINUTE": "1000000",
            "ROUTES_FILE": str(_unlimited(state)),
        },
        start_new_session=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if b"Ctrl-C stops it." in line:
            return process
    raise RuntimeError(f"sandbox exited with {process.wait()}")


async def _time(calls: int, send: Any) -> list[float]:
    taken = []
    for _ in range(calls):
        started = time.perf_counter()
        await send()
        taken.append((time.perf_counter() - started) * 1000)
    return taken


async def measure(base: str, chain: str, key_file: Path, calls: int, rounds: int) -> dict[str, list[float]]:
    keypair = load_keypair(key_file)
    top_up = f"{base}/v1/x402/credits/top-up/1"
    bought = await pay("POST", top_up, keypair, rpc_url=chain, policy=SpendPolicy(max_amount=1_000_000))
    assert bought.status == 200, bought.body
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [str(keypair.pubkey())]})
    arguments = {"params": [str(keypair.pubkey())]}
    timings: dict[str, list[float]] = {}
    async with aiohttp.ClientSession() as http:
        session = await open_session(http, base, keypair, 1_000_000)

        def rpc(headers: dict[str, str], expected: int) -> Any:
            async def send() -> None:
                async with http.post(base + ROUTE, data=body, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == expected, resp.status

            return send

        def tool(meta: dict[str, Any] | None, error: bool) -> Any:
            params: dict[str, Any] = {"name": TOOL, "arguments": arguments}
            if meta:
                params["_meta"] = meta
            request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})

            async def send() -> None:
                async with http.post(base + "/mcp", data=request, headers=MCP_HEADERS) as resp:
                    answer = await resp.json()
                    assert answer["result"]["isError"] is error, answer

            return send

        async def health() -> None:
            async with http.get(base + "/healthz") as resp:
                await resp.read()

        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})

        async def mcp_ping() -> None:
            async with http.post(base + "/mcp", data=ping, headers=MCP_HEADERS) as resp:
                assert "result" in await resp.json()

        paths = {
            "paid, HTTP": rpc({"content-type": "application/json", "X-CREDIT-SESSION": session.token}, 200),
            "paid, MCP": tool({"x402-gateway/x-credit-session": session.token}, False),
            "floor, HTTP (GET /healthz)": health,
            "floor, MCP (ping)": mcp_ping,
        }
        for send in paths.values():  # warm up
            await _time(20, send)
        for _ in range(rounds * calls):  # call by call, so a burst of other work hits every path alike
            for name, send in paths.items():
                timings.setdefault(name, []).extend(await _time(1, send))
    return timings


def report(timings: dict[str, list[float]]) -> str:
    lines = ["| path | p50 ms | mean ms |", "|---|---|---|"]
    for name, taken in timings.items():
        lines.append(f"| {name} | {statistics.median(taken):.2f} | {statistics.fmean(taken):.2f} |")
    for kind in ("paid", "floor"):
        [http] = [taken for name, taken in timings.items() if name.startswith(f"{kind}, HTTP")]
        [mcp] = [taken for name, taken in timings.items() if name.startswith(f"{kind}, MCP")]
        mcp_p50, http_p50 = statistics.median(mcp), statistics.median(http)
        lines.append(
            f"\nMCP over HTTP, {kind}: +{mcp_p50 - http_p50:.2f} ms at p50 ({mcp_p50 / http_p50:.2f}x)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port, chain_port = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as state:
        process = _start(Path(state), port, chain_port)
        try:
            timings = asyncio.run(
                measure(
                    f"http://127.0.0.1:{port}",
                    f"http://127.0.0.1:{chain_port}",
                    Path(state) / "demo-payer.json",
                    args.calls,
                    args.rounds,
                )
            )
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
    print(report(timings))


if __name__ == "__main__":
    main()
