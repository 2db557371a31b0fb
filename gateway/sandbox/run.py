"""``x402-gateway sandbox``: the whole gateway offline, in one process and one event loop.

Start-up order: the local chain (LiteSVM behind the JSON-RPC server, in a thread) with USDC at
the mainnet address, a funded demo payer (key file written), payTo's token account and an
airdropped facilitator wallet -> the asset-data sample (aiohttp, same loop) -> the gateway
(internal facilitator, memory store, every provider pointed at the local chain) under
``hypercorn.asyncio.serve``. SIGINT / SIGTERM stop it; the key file's directory is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import base58
from solders.keypair import Keypair

from gateway.config import UPSTREAM_ENV, Settings, load_settings
from gateway.sandbox.chain import LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.sandbox.upstreams import AssetDataSample, das_methods
from gateway.x402.types import USDC_DECIMALS

DEMO_PAYER_USDC = 1_000  # whole USDC in the demo wallet
FACILITATOR_LAMPORTS = 100 * 10**9
STARTUP_TIMEOUT_S = 10.0
KEY_FILE_NAME = "demo-payer.json"
# Variables of the operator's environment the sandbox honours; everything else it sets itself.
PASSED_THROUGH = ("LOG_LEVEL", "ROUTES_FILE")


def write_key_file(keypair: Keypair, directory: Path) -> Path:
    """``keypair`` as solana-keygen writes it (a JSON array of the 64 secret-key bytes), mode 0600."""
    path = directory / KEY_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(list(bytes(keypair)), handle)
    return path


@dataclass
class SandboxParts:
    """What is running besides the gateway (for the banner and for shutdown)."""

    chain: UsdcChain
    rpc: LiteSvmRpcServer
    assets: AssetDataSample
    key_file: Path
    state_dir: Path


def sandbox_env(parts: SandboxParts, base_url: str, port: int, asset_api_key: str) -> dict[str, str]:
    """The gateway's configuration for the sandbox (never read from the operator's environment)."""
    chain_url = parts.rpc.url
    env = {
        "GATEWAY_BASE_URL": base_url,
        "PORT": str(port),
        "FACILITATOR_URL": "internal",
        "FACILITATOR_WALLET_BASE58": base58.b58encode(bytes(parts.chain.fee_payer)).decode("ascii"),
        "INTERNAL_SETTLEMENT_SECRET": secrets.token_urlsafe(32),
        "SOLANA_MAINNET_RPC_URL": chain_url,
        "SOLANA_DEVNET_RPC_URL": chain_url,
        "X402_PAY_TO_WALLET": str(parts.chain.pay_to),
        "X402_USDC_MINT": str(parts.chain.mint),
        "ASSET_API_BASE_URL": parts.assets.url,
        "ASSET_API_KEY": asset_api_key,
        "STATE_STORE_REST_URL": "memory://",
    }
    for name, variable in UPSTREAM_ENV.items():
        if name.startswith("provider_"):
            env[variable] = chain_url
    return env


def banner(parts: SandboxParts, settings: Settings) -> str:
    """The start-up message: where things are and three commands to try."""
    base = settings.base_url
    payer = str(parts.chain.payer.pubkey())
    tail = f"--keypair {shlex.quote(str(parts.key_file))} --rpc {parts.rpc.url}"
    rpc_body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [payer]})
    das_body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "getAsset", "params": [{"id": str(parts.chain.mint)}]}
    )
    return "\n".join(
        [
            "x402-gateway sandbox: everything below is local and offline (sample data, test USDC).",
            f"  gateway:        {base}",
            f"  local chain:    {parts.rpc.url}  (LiteSVM; USDC mint {parts.chain.mint})",
            f"  demo wallet:    {payer}  ({DEMO_PAYER_USDC} USDC)",
            f"  demo key file:  {parts.key_file}",
            f"  payTo:          {parts.chain.pay_to}",
            f"  facilitator:    internal, fee payer {parts.chain.fee_payer.pubkey()}",
            "",
            "Try (a paid RPC call, a paid DAS call, a sign-in asset-data call):",
            f"  x402-gateway pay POST {base}/v1/x402/solana/mainnet/provider_a/rpc/getBalance "
            f"--data {shlex.quote(rpc_body)} {tail}",
            f"  x402-gateway pay POST {base}/v1/x402/solana/mainnet/provider_a/das/getAsset "
            f"--data {shlex.quote(das_body)} {tail}",
            f"  x402-gateway pay GET '{base}/v1/x402/tokens/assets/search?q=sol' {tail}",
            "",
            "Ctrl-C stops it.",
        ]
    )


async def _wait_listening(host: str, port: int, server: asyncio.Task[None]) -> None:
    deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
    while asyncio.get_running_loop().time() < deadline:
        if server.done():
            server.result()  # re-raise why it stopped
            raise RuntimeError("the gateway stopped during start-up")
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise TimeoutError(f"the gateway did not listen on {host}:{port} within {STARTUP_TIMEOUT_S} s")


def _check_port_free(host: str, port: int) -> None:
    """Fail fast (OSError) when something already listens there, before anything is started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _start_chain(state_dir: Path) -> tuple[UsdcChain, LiteSvmRpcServer, Path]:
    chain = setup_usdc_chain(
        payer_amount=DEMO_PAYER_USDC * 10**USDC_DECIMALS, fee_payer_lamports=FACILITATOR_LAMPORTS
    )
    rpc = LiteSvmRpcServer(svm=chain.svm, extra_methods=das_methods())
    rpc.watch(*chain.addresses)
    rpc.start()
    return chain, rpc, write_key_file(chain.payer, state_dir)


async def run_sandbox(
    port: int, host: str = "127.0.0.1", env: Mapping[str, str] | None = None, out: TextIO | None = None
) -> int:
    """Run the sandbox until SIGINT/SIGTERM; returns the exit code."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from gateway.app import create_app

    out = out or sys.stdout
    operator_env = os.environ if env is None else env
    _check_port_free(host, port)
    state_dir = Path(tempfile.mkdtemp(prefix="x402-sandbox-"))
    rpc: LiteSvmRpcServer | None = None
    assets: AssetDataSample | None = None
    try:
        chain, rpc, key_file = _start_chain(state_dir)
        asset_key = secrets.token_urlsafe(24)
        assets = AssetDataSample(asset_key)
        await assets.start()
        parts = SandboxParts(chain, rpc, assets, key_file, state_dir)
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        config_env = sandbox_env(parts, f"http://{shown_host}:{port}", port, asset_key)
        config_env.update({k: operator_env[k] for k in PASSED_THROUGH if operator_env.get(k)})
        settings = load_settings(config_env)
        app = create_app(settings)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        config.errorlog = "-"
        config.graceful_timeout = 5.0
        config.keep_alive_timeout = settings.client_header_timeout_s
        server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        try:
            await _wait_listening(shown_host, port, server)
            print(banner(parts, settings), file=out, flush=True)
            await server
        finally:
            stop.set()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if not server.done():
                await server
        return 0
    finally:
        if assets is not None:
            await assets.stop()
        if rpc is not None:
            rpc.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
