"""``x402-gateway ledger export`` and ``ledger reconcile``: the journal read back by an operator.

Both only read: the journal is opened without bringing its schema up to date, so a read-only
database role will do. Exit codes: export 0 (written) or 1 (the database failed); reconcile 0
(chain and journal agree), 1 (a difference was found), 3 (the database or the node failed, so
nothing can be said). Usage errors are 2, in one line, as everywhere in the CLI.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Final, TextIO
from urllib.parse import urlsplit

import msgspec
from solders.pubkey import Pubkey

from client.pay import usdc_text
from gateway.ledger.export import Format, iso_utc, write_export
from gateway.ledger.journal import Journal, LedgerUnavailable
from gateway.ledger.reconcile import Difference, Finding, Reconciliation, reconcile
from gateway.outbound.solana_rpc import SolanaRpc, SolanaRpcError
from gateway.x402.svm import TOKEN_PROGRAMS, associated_token_address
from gateway.x402.types import USDC_MAINNET_MINT

EXIT_DIFFERENCES: Final = 1
EXIT_UNAVAILABLE: Final = 3
MAX_UNIX_S: Final = 253_402_300_799  # 9999-12-31T23:59:59Z
_UNIX = re.compile(r"\d{1,12}(\.\d{1,3})?")


def moment_ms(text: str) -> int:
    """``--since``/``--until``: Unix seconds (``1764201600``, up to ms) or an ISO-8601 date or time
    (``2026-11-27``, ``2026-11-27T04:00:00Z``; without an offset it is UTC) -> Unix ms."""
    value = text.strip()
    if _UNIX.fullmatch(value):
        whole, _, fraction = value.partition(".")
        if int(whole) > MAX_UNIX_S:
            raise argparse.ArgumentTypeError(f"{value[:30]} is beyond the year 9999")
        return int(whole) * 1000 + int(fraction.ljust(3, "0") or 0)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        try:
            moment = datetime.combine(date.fromisoformat(value), datetime.min.time())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value[:30]!r} is neither Unix seconds nor an ISO-8601 date or time"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def database_url(text: str) -> str:
    if urlsplit(text).scheme not in ("postgres", "postgresql"):
        raise argparse.ArgumentTypeError("the ledger's database must be a postgresql:// URL")
    return text


def address(text: str) -> Pubkey:
    try:
        return Pubkey.from_string(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:50]!r} is not a base58 Solana address") from None


def env_address(name: str, env: Mapping[str, str]) -> Pubkey | None:
    """The address in ``env[name]``, None when unset."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        return address(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def usdc_mint_of(env: Mapping[str, str]) -> Pubkey:
    """``$X402_USDC_MINT``, as the gateway reads it, else the mainnet USDC mint."""
    return env_address("X402_USDC_MINT", env) or Pubkey.from_string(USDC_MAINNET_MINT)


async def _open(url: str) -> Journal:
    return await Journal.open(url, migrate=False, max_connections=1, timeout_s=30.0)


async def run_export(url: str, *, since_ms: int, until_ms: int | None, form: Format, out: TextIO) -> int:
    """Write the journal's entries of ``[since_ms, until_ms)`` to ``out``."""
    try:
        journal = await _open(url)
    except LedgerUnavailable as failed:
        print(f"x402-gateway ledger export: {failed}", file=sys.stderr)
        return 1
    try:
        await write_export(journal.entries(since_ms, until_ms), out, form)
    except LedgerUnavailable as failed:
        print(f"x402-gateway ledger export: {failed}", file=sys.stderr)
        return 1
    finally:
        await journal.close()
    out.flush()
    return 0


async def run_reconcile(
    url: str,
    rpc_url: str,
    *,
    pay_to: Pubkey,
    usdc_mint: Pubkey,
    since_ms: int | None,
    as_json: bool,
) -> int:
    """Reconcile the journal with the chain; print what differs."""
    rpc = SolanaRpc(rpc_url, timeout_s=30.0)
    journal: Journal | None = None
    try:
        mint = await rpc.get_account_info(str(usdc_mint))
        if mint is None or Pubkey.from_string(mint.owner) not in TOKEN_PROGRAMS:
            print(
                f"x402-gateway ledger reconcile: {usdc_mint} is no token mint on this chain", file=sys.stderr
            )
            return EXIT_UNAVAILABLE
        account = associated_token_address(pay_to, usdc_mint, Pubkey.from_string(mint.owner))
        journal = await _open(url)
        result = await reconcile(journal, rpc, pay_to=pay_to, token_account=account, since_ms=since_ms)
    except (LedgerUnavailable, SolanaRpcError) as failed:
        print(f"x402-gateway ledger reconcile: {failed}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        await rpc.close()
        if journal is not None:
            await journal.close()
    print(msgspec.json.encode(result).decode() if as_json else report(result))
    return 0 if result.clean else EXIT_DIFFERENCES


def _usdc(micro: int | None) -> str:
    return usdc_text(micro or 0)  # as every other command shows an amount


def _line(finding: Finding) -> str:
    entry = f"{finding.entryKind} {finding.entryRef}" if finding.entryRef else ""
    when = f" at {iso_utc(finding.occurredAtMs)}" if finding.occurredAtMs is not None else ""
    payers = ", ".join(finding.chainPayers or []) or "(none)"
    match finding.difference:
        case Difference.UNJOURNALED:
            amount = _usdc(finding.chainAmountMicroUsdc)
            return f"transfer without an entry: {finding.signature}: {amount} from {payers}"
        case Difference.MISSING:
            where = "not on chain" if finding.slot is None else "its transaction pays nothing into payTo"
            return (
                f"entry without its transfer: {entry}{when}: {_usdc(finding.journalAmountMicroUsdc)} "
                f"from {finding.journalWallet}; {where}"
            )
        case Difference.FAILED:
            amount = _usdc(finding.journalAmountMicroUsdc)
            return f"entry whose transfer failed on chain: {entry}{when}: {amount}"
        case Difference.AMOUNT:
            return (
                f"amount differs: {entry}{when}: journal {_usdc(finding.journalAmountMicroUsdc)}, "
                f"chain {_usdc(finding.chainAmountMicroUsdc)}"
            )
        case Difference.PAYER:
            return f"payer differs: {entry}{when}: journal {finding.journalWallet}, chain {payers}"
    return f"{finding.difference}: {finding.signature}"  # pragma: no cover - every kind is above


def report(result: Reconciliation) -> str:
    """The human-readable reconciliation: a summary line, then one line per difference."""
    since = f" since {iso_utc(result.sinceMs)}" if result.sinceMs is not None else ""
    summary = (
        f"payTo {result.payTo} (token account {result.tokenAccount}){since}: {result.transfers} transfers "
        f"on chain, {result.entries} sales and top-ups journaled, {result.matched} matched"
    )
    if result.clean:
        return f"{summary}; no difference"
    return "\n".join([f"{summary}; {len(result.findings)} differences:", *map(_line, result.findings)])
