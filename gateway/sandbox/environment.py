"""The environments the sandbox hands out: the gateway's, and what clients of it read.

:func:`serve_env` is one function for two readers: the sandbox configures its own gateway with
it, and ``sandbox --print-env`` prints it for an operator's ``x402-gateway check`` / ``serve``
beside a running sandbox. Both are built from the state directory alone (its config and chain
snapshot), so what is printed is what the sandbox runs, whichever process prints it.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping
from pathlib import Path

from gateway.config import PACKAGED_ROUTES_FILE, upstream_variables
from gateway.sandbox.state import ChainSnapshot, SandboxConfig, read_config, read_snapshot
from gateway.x402.types import USDC_MAINNET_MINT

HOST_STATE_DIR_VARIABLE = "SANDBOX_HOST_STATE_DIR"
"""Where the host sees ``--state-dir`` when the sandbox runs in a container (a bind mount): the
banner then prints host paths, which work where its commands are pasted."""


def routes_file(operator_env: Mapping[str, str]) -> Path:
    """The route table the gateway will load (``ROUTES_FILE`` is passed through to it)."""
    return Path(operator_env.get("ROUTES_FILE") or PACKAGED_ROUTES_FILE)


def serve_env(config: SandboxConfig, snapshot: ChainSnapshot, *, port: int, routes: Path) -> dict[str, str]:
    """A complete ``serve`` environment on the sandbox's chain and asset-data sample, on ``port``.

    Sandbox-only keys, printed on purpose: the internal facilitator's fee payer, the sample
    API's key, the internal routes' secret. Every Solana provider of ``routes`` is the chain.
    Prepaid credit is left off: on this in-memory store only the sandbox itself may sell it (it
    keeps the credit in its state directory), so ``serve`` would refuse it. The sandbox's ledger,
    when it runs one, is ``LEDGER_DATABASE_URL``: ``serve`` journals its sales beside the
    sandbox's.
    """
    chain_url = config.url(config.chain_port)
    env = {
        "GATEWAY_BASE_URL": config.url(port),
        "PORT": str(port),
        "FACILITATOR_URL": "internal",
        "FACILITATOR_WALLET_BASE58": snapshot.fee_payer,
        "INTERNAL_SETTLEMENT_SECRET": config.internal_secret,
        "SOLANA_MAINNET_RPC_URL": chain_url,
        "SOLANA_DEVNET_RPC_URL": chain_url,
        "X402_PAY_TO_WALLET": snapshot.pay_to,
        "X402_USDC_MINT": USDC_MAINNET_MINT,
        "ASSET_API_BASE_URL": config.url(config.assets_port),
        "ASSET_API_KEY": config.asset_api_key,
        "STATE_STORE_REST_URL": "memory://",
    }
    if config.ledger_url:  # the sandbox's own PostgreSQL: serve journals its sales there too
        env["LEDGER_DATABASE_URL"] = config.ledger_url
    for variable in upstream_variables(routes).values():
        env.setdefault(variable, chain_url)
    return env


def env_lines(env: Mapping[str, str]) -> str:
    """``KEY=value`` lines, values shell-quoted (for ``set -a; . FILE`` or ``eval``)."""
    return "\n".join(f"{key}={shlex.quote(value)}" for key, value in env.items())


def sdk_exports(key_file: Path, chain_url: str, gateway_url: str) -> str:
    """The ``export`` line for the README's SDK examples (and ``pay``'s ``$SOLANA_RPC_URL``)."""
    pairs = {"X402_KEYPAIR": str(key_file), "SOLANA_RPC_URL": chain_url, "GATEWAY": gateway_url}
    return "export " + " ".join(f"{key}={shlex.quote(value)}" for key, value in pairs.items())


def print_env(state_dir: Path, port: int | None, operator_env: Mapping[str, str]) -> tuple[str, list[str]]:
    """``--print-env``: the ``serve`` environment lines, and notes for stderr.

    ``serve`` listens on ``port``, by default the sandbox gateway's port + 1 (both run at once).
    OSError when ``state_dir`` holds no sandbox.
    """
    config, snapshot = read_config(state_dir), read_snapshot(state_dir)
    if config is None or snapshot is None:
        raise OSError(
            f"{state_dir} holds no sandbox: start `x402-gateway sandbox --state-dir {state_dir}` first"
        )
    serve_port = port if port is not None else config.gateway_port + 1
    env = serve_env(config, snapshot, port=serve_port, routes=routes_file(operator_env))
    notes = []
    if not _listening(config.host, config.chain_port):
        notes.append(
            f"nothing answers at {config.url(config.chain_port)} yet: these work while "
            f"`x402-gateway sandbox --state-dir {state_dir}` runs"
        )
    return env_lines(env), notes


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
