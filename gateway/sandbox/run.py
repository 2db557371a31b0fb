"""``x402-gateway sandbox``: the whole gateway offline, in one process and one event loop.

Start-up order: the local chain (LiteSVM behind the JSON-RPC server, in a thread) with USDC at
the mainnet address, a funded demo payer (key file written), payTo's token account and an
airdropped facilitator wallet -> the asset-data sample (aiohttp, same loop) -> the gateway
(internal facilitator, memory store, every provider pointed at the local chain) under
``hypercorn.asyncio.serve``. SIGINT / SIGTERM stop it.

Without ``--state-dir`` everything lives in a temporary directory removed on exit. With it, the
directory keeps the demo wallet's key file and a snapshot of the chain (the keys of payTo and
the fee payer, and every account the chain knows: balances, token accounts); the next run with
the same directory restores them, so pasted commands keep working. The snapshot is written at
start, every few seconds while payments land, and at exit. Transaction history, sign-in nonces
and rate limits are not kept.
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
import msgspec
from solders.account import Account
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from gateway.config import PACKAGED_ROUTES_FILE, Settings, load_settings, upstream_variables
from gateway.payclient import PayError, load_keypair, usdc_text
from gateway.sandbox.chain import USDC_MAINNET_MINT, LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.sandbox.upstreams import AssetDataSample, das_methods
from gateway.x402.svm import TOKEN_PROGRAM
from gateway.x402.types import USDC_DECIMALS

DEMO_PAYER_USDC = 1_000  # whole USDC in the demo wallet
FACILITATOR_LAMPORTS = 100 * 10**9
STARTUP_TIMEOUT_S = 10.0
KEY_FILE_NAME = "demo-payer.json"
STATE_FILE_NAME = "sandbox-state.json"
STATE_VERSION = 1
AUTOSAVE_INTERVAL_S = 2.0
# Variables of the operator's environment the sandbox honours; everything else it sets itself.
PASSED_THROUGH = ("LOG_LEVEL", "ROUTES_FILE")


def write_key_file(keypair: Keypair, directory: Path) -> Path:
    """``keypair`` as solana-keygen writes it (a JSON array of the 64 secret-key bytes), mode 0600."""
    path = directory / KEY_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(list(bytes(keypair)), handle)
    return path


class ChainSnapshot(msgspec.Struct):
    """What ``--state-dir`` keeps of the chain; the demo payer's key is the key file beside it."""

    version: int
    fee_payer: str  # base58 of the 64-byte secret key
    pay_to: str
    accounts: dict[str, str]  # address -> solders Account JSON


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by the owner only (it holds secret keys)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def save_chain(state_dir: Path, chain: UsdcChain, rpc: LiteSvmRpcServer) -> None:
    """Snapshot every account the chain knows (programs excepted: LiteSVM brings its own)."""
    accounts = {str(address): account.to_json() for address, account in rpc.known_accounts()}
    snapshot = ChainSnapshot(
        version=STATE_VERSION,
        fee_payer=base58.b58encode(bytes(chain.fee_payer)).decode("ascii"),
        pay_to=str(chain.pay_to),
        accounts={k: v for k, v in accounts.items() if not Account.from_json(v).executable},
    )
    _write_private(state_dir / STATE_FILE_NAME, msgspec.json.encode(snapshot))


def load_chain(state_dir: Path) -> UsdcChain | None:
    """The chain saved in ``state_dir``, or None when there is none yet; OSError if unreadable."""
    path = state_dir / STATE_FILE_NAME
    if not path.exists():
        return None
    try:
        snapshot = msgspec.json.decode(path.read_bytes(), type=ChainSnapshot)
        if snapshot.version != STATE_VERSION:
            raise ValueError(f"version {snapshot.version}, expected {STATE_VERSION}")
        payer = load_keypair(state_dir / KEY_FILE_NAME)
        fee_payer = Keypair.from_bytes(base58.b58decode(snapshot.fee_payer))
        pay_to = Pubkey.from_string(snapshot.pay_to)
        svm = LiteSVM()
        for address, account in snapshot.accounts.items():
            svm.set_account(Pubkey.from_string(address), Account.from_json(account))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, PayError) as exc:
        raise OSError(f"cannot restore the sandbox from {path}: {exc}") from None
    mint = USDC_MAINNET_MINT
    return UsdcChain(
        svm=svm,
        mint=mint,
        decimals=USDC_DECIMALS,
        token_program=TOKEN_PROGRAM,
        payer=payer,
        payer_ata=get_associated_token_address(payer.pubkey(), mint),
        pay_to=pay_to,
        pay_to_ata=get_associated_token_address(pay_to, mint),
        fee_payer=fee_payer,
    )


@dataclass
class SandboxParts:
    """What is running besides the gateway (for the banner and for shutdown)."""

    chain: UsdcChain
    rpc: LiteSvmRpcServer
    assets: AssetDataSample
    key_file: Path
    state_dir: Path
    persistent: bool = False
    shown_host: str = "127.0.0.1"

    @property
    def chain_url(self) -> str:
        """The local chain's URL as the gateway and a client on this machine reach it."""
        return f"http://{self.shown_host}:{self.rpc.port_bound}"


def sandbox_env(parts: SandboxParts, base_url: str, port: int, asset_api_key: str) -> dict[str, str]:
    """The gateway's configuration for the sandbox (never read from the operator's environment)."""
    chain_url = parts.chain_url
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
    for variable in upstream_variables(PACKAGED_ROUTES_FILE).values():
        env.setdefault(variable, chain_url)  # every Solana provider is the local chain
    return env


def banner(parts: SandboxParts, settings: Settings) -> str:
    """The start-up message: where things are and three commands to try."""
    base = settings.base_url
    payer = str(parts.chain.payer.pubkey())
    held = parts.chain.balance(parts.chain.payer_ata) or 0
    tail = f"--keypair {shlex.quote(str(parts.key_file))} --rpc {parts.chain_url}"
    kept = "kept between runs" if parts.persistent else "temporary, removed on exit; --state-dir keeps it"
    rpc_body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [payer]})
    das_body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "getAsset", "params": [{"id": str(parts.chain.mint)}]}
    )
    return "\n".join(
        [
            "x402-gateway sandbox: everything below is local and offline (sample data, test USDC).",
            f"  gateway:        {base}",
            f"  local chain:    {parts.chain_url}  (LiteSVM; USDC mint {parts.chain.mint})",
            f"  demo wallet:    {payer}  ({usdc_text(held)})",
            f"  demo USDC account: {parts.chain.payer_ata}",
            f"  demo key file:  {parts.key_file}",
            f"  state:          {parts.state_dir}  ({kept})",
            f"  payTo:          {parts.chain.pay_to}",
            f"  facilitator:    internal, fee payer {parts.chain.fee_payer.pubkey()}",
            f"  sample asset-data API: {parts.assets.url}",
            "",
            "Balances (USDC and SOL of any wallet on the local chain):",
            f"  x402-gateway balance {payer} --rpc {parts.chain_url}",
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


def _start_chain(state_dir: Path, host: str, port: int) -> tuple[UsdcChain, LiteSvmRpcServer, Path]:
    """The chain saved in ``state_dir``, else a new one (and its key file), served on ``port``."""
    chain = load_chain(state_dir)
    restored = [] if chain is None else [Pubkey.from_string(a) for a in _saved_addresses(state_dir)]
    if chain is None:
        chain = setup_usdc_chain(
            payer_amount=DEMO_PAYER_USDC * 10**USDC_DECIMALS, fee_payer_lamports=FACILITATOR_LAMPORTS
        )
        write_key_file(chain.payer, state_dir)
    rpc = LiteSvmRpcServer(svm=chain.svm, host=host, port=port, extra_methods=das_methods())
    rpc.watch(*chain.addresses, *restored)
    rpc.start()
    save_chain(state_dir, chain, rpc)
    return chain, rpc, state_dir / KEY_FILE_NAME


def _saved_addresses(state_dir: Path) -> list[str]:
    snapshot = msgspec.json.decode((state_dir / STATE_FILE_NAME).read_bytes(), type=ChainSnapshot)
    return list(snapshot.accounts)


async def _autosave(parts: SandboxParts) -> None:
    """Save the chain whenever a transaction has landed since the last save."""
    saved = len(parts.rpc.sent)
    while True:
        await asyncio.sleep(AUTOSAVE_INTERVAL_S)
        if len(parts.rpc.sent) != saved:
            saved = len(parts.rpc.sent)
            await asyncio.to_thread(save_chain, parts.state_dir, parts.chain, parts.rpc)


async def run_sandbox(
    port: int,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    *,
    state_dir: Path | None = None,
    chain_port: int = 0,
    assets_port: int = 0,
) -> int:
    """Run the sandbox until SIGINT/SIGTERM; returns the exit code.

    ``state_dir`` keeps the wallet and chain between runs (default: a temporary directory);
    ``chain_port`` and ``assets_port`` fix the local chain's and the asset-data sample's ports
    on 127.0.0.1 (0: any free port).
    """
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from gateway.app import create_app

    out = out or sys.stdout
    operator_env = os.environ if env is None else env
    _check_port_free(host, port)
    if chain_port:
        _check_port_free(host, chain_port)
    if assets_port:
        _check_port_free("127.0.0.1", assets_port)
    persistent = state_dir is not None
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix="x402-sandbox-"))
    else:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    rpc: LiteSvmRpcServer | None = None
    assets: AssetDataSample | None = None
    parts: SandboxParts | None = None
    try:
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        chain, rpc, key_file = _start_chain(state_dir, host, chain_port)
        asset_key = secrets.token_urlsafe(24)
        assets = AssetDataSample(asset_key, assets_port)
        await assets.start()
        parts = SandboxParts(chain, rpc, assets, key_file, state_dir, persistent, shown_host)
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
        autosave = asyncio.create_task(_autosave(parts)) if persistent else None
        try:
            await _wait_listening(shown_host, port, server)
            print(banner(parts, settings), file=out, flush=True)
            await server
        finally:
            if autosave is not None:
                autosave.cancel()
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
        if not persistent:
            shutil.rmtree(state_dir, ignore_errors=True)
        elif parts is not None:
            save_chain(state_dir, parts.chain, parts.rpc)
