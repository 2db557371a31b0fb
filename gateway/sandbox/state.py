"""What a sandbox state directory holds, and reading and writing it.

* ``demo-payer.json``: the demo wallet's key (solana-keygen format), the file the banner names;
* ``sandbox-state.json``: the chain (:class:`ChainSnapshot`), kept by :mod:`gateway.sandbox.run`;
* ``sandbox-config.json``: the address and ports the banner's commands name, and the sample
  secrets (:class:`SandboxConfig`), so that those commands and ``sandbox --print-env`` stay true
  after a restart on the same directory;
* ``sandbox-credit.json``: every wallet's prepaid credit and when it lapses
  (:class:`CreditSnapshot`), kept by :mod:`gateway.sandbox.credit`: the sandbox sells credit on
  its in-memory store, which forgets it on exit;
* ``ledger/``: the ledger's PostgreSQL data directory, and ``ledger.log`` its server's log
  (:mod:`gateway.sandbox.postgres`): every sale and credit movement, journaled.

Every file holds a key, a secret or money owed: each is written with mode 0600.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypeVar

import msgspec
from solders.keypair import Keypair

KEY_FILE_NAME = "demo-payer.json"
STATE_FILE_NAME = "sandbox-state.json"
CONFIG_FILE_NAME = "sandbox-config.json"
CREDIT_FILE_NAME = "sandbox-credit.json"
STATE_VERSION = 1
CONFIG_VERSION = 1
CREDIT_VERSION = 1

_T = TypeVar("_T", bound=msgspec.Struct)


class ChainSnapshot(msgspec.Struct):
    """What ``--state-dir`` keeps of the chain; the demo payer's key is the key file beside it."""

    version: int
    fee_payer: str  # base58 of the 64-byte secret key
    pay_to: str
    accounts: dict[str, str]  # address -> solders Account JSON


class SandboxConfig(msgspec.Struct, frozen=True):
    """The last run's addresses (what its banner printed) and the secrets kept between runs."""

    version: int
    host: str  # the address the printed URLs name (127.0.0.1 when listening on every address)
    gateway_port: int
    chain_port: int
    assets_port: int
    asset_api_key: str  # the sample asset-data API's key, as ASSET_API_KEY
    internal_secret: str  # INTERNAL_SETTLEMENT_SECRET
    ledger_url: str = ""  # LEDGER_DATABASE_URL of the last run ("": it ran without a ledger)

    def url(self, port: int) -> str:
        return f"http://{self.host}:{port}"


class KeptCredit(msgspec.Struct, frozen=True):
    """One wallet's credit: its balance (micro-USDC) and when it lapses (Unix ms)."""

    balance: int
    lapses_at_ms: int


class CreditSnapshot(msgspec.Struct, frozen=True):
    """What ``--state-dir`` keeps of prepaid credit: each wallet that has some."""

    version: int
    wallets: dict[str, KeptCredit]
    journaled: bool = False
    """The ledger has every movement of this credit: it was kept beside a running ledger, or
    moved no more once kept (False: an earlier sandbox, ``--no-ledger``, or a ledger that could
    not start; the ledger then misses movements and must not be restored from)."""


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by the owner only (it holds secrets)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def write_key_file(keypair: Keypair, directory: Path) -> Path:
    """``keypair`` as solana-keygen writes it (a JSON array of the 64 secret-key bytes), mode 0600."""
    path = directory / KEY_FILE_NAME
    write_private(path, json.dumps(list(bytes(keypair))).encode())
    return path


def _read(path: Path, kind: type[_T], version: int) -> _T | None:
    """The struct saved at ``path``, None when there is none yet; OSError if it is unusable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise OSError(f"cannot read {path}: {exc}") from None
    found = getattr(value, "version", None)
    if found != version:
        raise OSError(f"cannot read {path}: version {found}, expected {version}")
    return value


def read_snapshot(state_dir: Path) -> ChainSnapshot | None:
    return _read(state_dir / STATE_FILE_NAME, ChainSnapshot, STATE_VERSION)


def read_config(state_dir: Path) -> SandboxConfig | None:
    return _read(state_dir / CONFIG_FILE_NAME, SandboxConfig, CONFIG_VERSION)


def save_config(state_dir: Path, config: SandboxConfig) -> None:
    write_private(state_dir / CONFIG_FILE_NAME, msgspec.json.encode(config))


def read_credit(state_dir: Path) -> CreditSnapshot | None:
    return _read(state_dir / CREDIT_FILE_NAME, CreditSnapshot, CREDIT_VERSION)


def save_credit(state_dir: Path, snapshot: CreditSnapshot) -> None:
    write_private(state_dir / CREDIT_FILE_NAME, msgspec.json.encode(snapshot))
