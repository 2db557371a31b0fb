"""``x402-gateway sandbox fund WALLET``: test USDC and SOL for any wallet on a running sandbox.

The sandbox's local chain answers one JSON-RPC method no Solana node has, ``sandboxFund``
(:func:`fund_method`; only :mod:`gateway.sandbox.run` registers it, and ``serve`` never runs a
chain). It adds USDC to the wallet's associated token account (made when missing) and lamports
to the wallet, and makes both accounts known to the chain's listings, so the state directory
keeps them. USDC's mint has no authority on the local chain (mainnet's is not ours either), so
the funds are written into LiteSVM's accounts, not minted by a transaction. The client side
(:func:`run_fund`) finds the chain by ``--rpc``, ``--state-dir`` or ``$SOLANA_RPC_URL``, never
a default: a node that does not know the method is not a sandbox, and says so.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, TextIO

import aiohttp
import msgspec
from solders.account import Account
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address
from solders.token.state import Mint, TokenAccount

from client.challenge import PayError
from client.pay import DEFAULT_TIMEOUT_S, rpc_failure, sol_text, usdc_text
from gateway.outbound.solana_rpc import RpcResponseError, SolanaRpc, SolanaRpcError
from gateway.sandbox.chain import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    MINT_SIZE,
    TOKEN_ACCOUNT_SIZE,
    ExtraMethod,
    LiteSvmRpcServer,
    RpcError,
    UsdcChain,
    set_token_account,
)
from gateway.sandbox.state import read_config
from gateway.telemetry.redact import redact_url
from gateway.x402.types import USDC_DECIMALS

FUND_METHOD = "sandboxFund"
MAX_FUND_USDC = 1_000_000
"""Whole USDC one call may add."""
MAX_FUND_SOL = 1_000
"""Whole SOL one call may add."""
LAMPORTS_PER_SOL = 10**9
SYSTEM_PROGRAM = Pubkey.from_string("11111111111111111111111111111111")


class FundRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``params[1]`` of ``sandboxFund``: what to add (micro-USDC, lamports)."""

    usdcMicro: Annotated[int, msgspec.Meta(ge=0, le=MAX_FUND_USDC * 10**USDC_DECIMALS)] = 0
    lamports: Annotated[int, msgspec.Meta(ge=0, le=MAX_FUND_SOL * LAMPORTS_PER_SOL)] = 0


class FundAnswer(msgspec.Struct):
    """The ``result`` of ``sandboxFund``: the wallet's balances after it."""

    wallet: str
    usdcAccount: str
    usdcMicro: str
    lamports: int


def fund_method(chain: UsdcChain, rpc: LiteSvmRpcServer) -> ExtraMethod:
    """``sandboxFund [wallet, {usdcMicro, lamports}]`` on ``chain``, served by ``rpc``."""

    def fund(params: Any) -> Any:
        if not isinstance(params, list) or len(params) != 2 or not isinstance(params[0], str):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected [wallet, {usdcMicro, lamports}]")
        try:
            wallet = Pubkey.from_string(params[0])
            request = msgspec.convert(params[1], FundRequest)
        except (ValueError, msgspec.ValidationError) as exc:
            raise RpcError(INVALID_PARAMS, f"Invalid params: {exc}") from None
        account = _add_usdc(chain, wallet, request.usdcMicro)
        _add_lamports(chain, wallet, request.lamports)
        rpc.watch(wallet, account)
        return msgspec.to_builtins(
            FundAnswer(
                wallet=str(wallet),
                usdcAccount=str(account),
                usdcMicro=str(chain.balance(account) or 0),
                lamports=chain.lamports(wallet),
            )
        )

    return fund


def _add_usdc(chain: UsdcChain, wallet: Pubkey, amount: int) -> Pubkey:
    """Add ``amount`` micro-USDC to ``wallet``'s associated token account (and to the mint's
    supply, so the chain still adds up); returns the account's address."""
    address = get_associated_token_address(wallet, chain.mint, chain.token_program)
    if amount == 0:
        return address
    existing = chain.svm.get_account(address)
    if existing is None or len(existing.data) < TOKEN_ACCOUNT_SIZE:
        set_token_account(chain.svm, wallet, chain.mint, amount, token_program=chain.token_program)
    else:
        held = TokenAccount.from_bytes(bytes(existing.data[:TOKEN_ACCOUNT_SIZE]))
        grown = TokenAccount(
            mint=held.mint,
            owner=held.owner,
            amount=held.amount + amount,
            delegate=held.delegate,
            state=held.state,
            is_native=held.is_native,
            delegated_amount=held.delegated_amount,
            close_authority=held.close_authority,  # type: ignore[arg-type]  # the stub says int
        )
        data = bytes(grown) + bytes(existing.data[TOKEN_ACCOUNT_SIZE:])
        chain.svm.set_account(
            address,
            Account(existing.lamports, data, existing.owner, existing.executable, existing.rent_epoch),
        )
    mint_account = chain.svm.get_account(chain.mint)
    if mint_account is not None and len(mint_account.data) >= MINT_SIZE:
        mint = Mint.from_bytes(bytes(mint_account.data[:MINT_SIZE]))
        supplied = Mint(
            mint_authority=mint.mint_authority,
            supply=mint.supply + amount,
            decimals=mint.decimals,
            is_initialized=mint.is_initialized,
            freeze_authority=mint.freeze_authority,
        )
        chain.svm.set_account(
            chain.mint,
            Account(
                mint_account.lamports, bytes(supplied), mint_account.owner, False, mint_account.rent_epoch
            ),
        )
    return address


def _add_lamports(chain: UsdcChain, wallet: Pubkey, lamports: int) -> None:
    if lamports == 0:
        return
    account = chain.svm.get_account(wallet)
    if account is None:
        account = Account(0, b"", SYSTEM_PROGRAM, False)
    chain.svm.set_account(
        wallet,
        Account(
            account.lamports + lamports, account.data, account.owner, account.executable, account.rent_epoch
        ),
    )


# --- the command ------------------------------------------------------------------------------


def parse_amount(text: str, decimals: int, most: int, unit: str) -> int:
    """``"2.5"`` whole ``unit`` -> base units (``decimals`` places); ValueError saying why."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"{text[:30]!r} is not an amount of {unit} such as 100") from None
    if not value.is_finite() or not 0 <= value <= most or (value * 10**decimals) % 1:
        raise ValueError(
            f"{text[:30]} is out of range: {unit} from 0 to {most}, with at most {decimals} decimals"
        )
    return int(value * 10**decimals)


def chain_url(rpc: str | None, state_dir: Path | None, env_rpc: str | None) -> str:
    """The sandbox chain to fund on: ``--rpc``, else the chain of ``--state-dir``, else
    ``$SOLANA_RPC_URL`` (the banner's export line sets it); PayError (usage) when none is given."""
    if rpc:
        return rpc
    if state_dir is not None:
        try:
            config = read_config(state_dir)
        except OSError as exc:
            raise PayError(str(exc), "usage") from None
        if config is None:
            raise PayError(
                f"{state_dir} holds no sandbox (start `x402-gateway sandbox --state-dir` first)", "usage"
            )
        return config.url(config.chain_port)
    if env_rpc:
        return env_rpc
    raise PayError(
        "which sandbox? give --rpc URL (the banner's `local chain`), --state-dir DIR or set SOLANA_RPC_URL",
        "usage",
    )


def check_wallet(wallet: str) -> None:
    try:
        Pubkey.from_string(wallet)
    except ValueError:
        raise PayError(f"{wallet[:64]!r} is not a Solana address", "usage") from None


async def fund(url: str, wallet: str, usdc_micro: int, lamports: int) -> FundAnswer:
    """Ask the sandbox chain at ``url`` to fund ``wallet``; PayError when it cannot."""
    check_wallet(wallet)
    params = [wallet, msgspec.to_builtins(FundRequest(usdcMicro=usdc_micro, lamports=lamports))]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)) as session:
        try:
            answer: FundAnswer = await SolanaRpc(url, session).call(FUND_METHOD, params, FundAnswer)
        except RpcResponseError as exc:
            if exc.code == METHOD_NOT_FOUND:
                raise PayError(
                    f"{redact_url(url)} is not a sandbox's chain (it does not know {FUND_METHOD}): only "
                    "`x402-gateway sandbox` hands out test funds",
                    "not_a_sandbox",
                ) from None
            raise rpc_failure("cannot fund", exc, url) from None
        except SolanaRpcError as exc:
            raise rpc_failure("cannot fund", exc, url) from None
    return answer


async def run_fund(
    wallet: str,
    *,
    usdc_micro: int,
    lamports: int,
    rpc: str | None = None,
    state_dir: Path | None = None,
    env_rpc: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``sandbox fund``: 0 with the balances after on ``out``, 1 with one line on ``err``."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        if usdc_micro == 0 and lamports == 0:
            raise PayError("nothing to add: give --usdc N and/or --sol N above 0", "usage")
        check_wallet(wallet)
        url = chain_url(rpc, state_dir, env_rpc)
        answer = await fund(url, wallet, usdc_micro, lamports)
    except PayError as exc:
        print(f"x402-gateway sandbox fund: {exc}", file=err)
        return 1
    added = [f"{usdc_text(usdc_micro)}" if usdc_micro else "", sol_text(lamports) if lamports else ""]
    print(
        f"funded {answer.wallet} on the sandbox chain {url}: added {' and '.join(a for a in added if a)}",
        file=out,
    )
    print(
        f"USDC:           {usdc_text(int(answer.usdcMicro))}  (token account {answer.usdcAccount})", file=out
    )
    print(f"SOL:            {sol_text(answer.lamports)}", file=out)
    return 0
