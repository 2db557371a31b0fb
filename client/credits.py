"""``x402-gateway credits`` and ``x402-gateway pay --top-up``: a wallet's prepaid credit at a gateway.

A credit session (``--open-session CAP``) is opened by one sign-in and printed (its token goes
in ``X-CREDIT-SESSION``; ``--session-file`` keeps it for ``pay``); ``--revoke-session`` ends one
and prints what it spent.

Credit is bought with an exact payment (``POST {base}/v1/x402/credits/top-up/{AMOUNT}``, priced at
exactly the AMOUNT of USDC it sells) and spent by signing in on any paid route, which is what
``pay`` does first (:mod:`client.pay`). The balance (``GET {base}/v1/x402/credits``) is
read by signing in, so it costs nothing and needs no RPC node.

A top-up is a payment like any other and obeys the same :class:`SpendPolicy`: its limit is
``--max-amount`` when given, else the AMOUNT asked for (naming the amount is the consent to pay
it; a challenge asking more is refused before anything is signed). An AMOUNT the gateway does
not sell answers 404: one line says so, with the amounts it does sell when its catalog tells.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp
import msgspec

from client.challenge import PayError
from client.pay import (
    DEFAULT_TIMEOUT_S,
    UNTRUSTED_CHARS,
    PayResult,
    default_rpc_url,
    failure_reason,
    load_keypair,
    one_line,
    pay,
    report,
    report_refusal,
    session_cap,
    sign_in_request,
    spend_policy,
    usdc_text,
)
from client.sessions import SessionCache, SessionError, open_session, revoke_session
from gateway.methods.credit.wire import BalanceResult, Movement, TopUpResult, result_of
from gateway.x402.types import USDC_DECIMALS

TOP_UP_PATH = "/v1/x402/credits/top-up/"
CREDITS_PATH = "/v1/x402/credits"
CATALOG_PATH = "/v1/catalog"
WHOLE_USDC = re.compile(r"[1-9][0-9]{0,8}")
"""A top-up's AMOUNT: whole USDC, as the gateway's top-up routes are named."""
OFFERED = re.compile(re.escape(TOP_UP_PATH) + r"([1-9][0-9]*)$")


def base_url(text: str) -> str:
    """The gateway's base URL without a trailing slash; PayError (usage) if it is not one."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise PayError(
            f"{one_line(text, 64)!r} is not a gateway base URL such as http://127.0.0.1:8080", "usage"
        )
    return text.strip().rstrip("/")


def top_up_amount(text: str) -> int:
    """AMOUNT of ``--top-up`` in whole USDC; PayError (usage) when it is not a whole number."""
    if not WHOLE_USDC.fullmatch(text.strip()):
        raise PayError(f"--top-up {one_line(text, 30)!r} must be a whole number of USDC, such as 5", "usage")
    return int(text)


def lapse_text(expires_at: int) -> str:
    """Unix seconds as a UTC date and time; ``-`` for none (a wallet without credit)."""
    if expires_at <= 0:
        return "-"
    return datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _micro(text: str) -> int:
    return int(text) if text.isascii() and text.isdigit() else 0


async def offered_top_ups(base: str) -> list[int] | None:
    """The top-up amounts (whole USDC) the gateway's catalog lists; None when it cannot be read."""
    try:
        timeout = aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(base + CATALOG_PATH, allow_redirects=False) as resp,
        ):
            if resp.status != 200:
                return None
            catalog = msgspec.json.decode(await resp.read(), type=dict[str, Any])
    except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    routes = catalog.get("routes")
    if not isinstance(routes, list):
        return None
    found = (OFFERED.search(str(r.get("path", ""))) for r in routes if isinstance(r, dict))
    return sorted({int(m[1]) for m in found if m})


async def not_offered(base: str, amount: int) -> PayError:
    """The refusal of a top-up the gateway answered 404: what it sells instead, if it says."""
    offered = await offered_top_ups(base)
    if offered is None:
        also = ""
    elif offered:
        also = f" (it sells {', '.join(map(str, offered))} USDC)"
    else:
        also = " (it sells no prepaid credit)"
    return PayError(f"{base} offers no top-up of {amount} USDC{also}", "top_up_not_offered")


def bought(result: PayResult) -> list[str]:
    """The narration of a top-up answered: the balance it leaves and when it lapses."""
    answer = result_of(result.body, TopUpResult) if result.ok else None
    if answer is None:
        return []
    return [
        f"credit of {answer.wallet}: {usdc_text(_micro(answer.balanceMicroUsdc))}, "
        f"lapses {lapse_text(answer.expiresAt)}"
    ]


async def run_top_up(
    amount: str,
    base: str,
    *,
    keypair_file: str,
    rpc_url: str | None = None,
    max_amount: str | None = None,
    usdc_mint: str | None = None,
    output: str = "text",
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``pay --top-up AMOUNT BASE_URL``: buy AMOUNT USDC of credit, output as ``pay`` does."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        usdc = top_up_amount(amount)
        base = base_url(base)
        policy = spend_policy(max_amount, usdc_mint, default_max=usdc * 10**USDC_DECIMALS)
        keypair = load_keypair(keypair_file)
        url = f"{base}{TOP_UP_PATH}{usdc}"
        result = await pay("POST", url, keypair, rpc_url=rpc_url or default_rpc_url(), policy=policy)
        if result.status == 404:
            raise await not_offered(base, usdc)
    except PayError as exc:
        return report_refusal(exc, output, out, err)
    return report(result, output, out, err, lines=bought(result))


async def run_credits(
    base: str,
    *,
    keypair_file: str,
    as_json: bool = False,
    movements: int | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``credits BASE_URL``: sign in and print the wallet's credit (and its ``movements`` latest
    movements, when asked); 0 when read, else 1."""
    out, err = out or sys.stdout, err or sys.stderr
    output = "json" if as_json else "text"
    query = f"?movements={movements}" if movements is not None else ""
    try:
        base = base_url(base)
        keypair = load_keypair(keypair_file)
        result = await sign_in_request("GET", base + CREDITS_PATH + query, keypair)
        if result.status == 404:
            raise PayError(f"{base} sells no prepaid credit (404 at {CREDITS_PATH})", "no_credit")
        answer = result_of(result.body, BalanceResult) if result.ok else None
        if answer is None:
            why = failure_reason(result) if not result.ok else "HTTP 200 but not a credit balance"
            raise PayError(one_line(why, UNTRUSTED_CHARS * 2), "credits_failed")
    except PayError as exc:
        return report_refusal(exc, output, out, err, command="credits")
    if as_json:
        print(json.dumps({"ok": True, **msgspec.to_builtins(answer)}), file=out)
        return 0
    print(f"wallet:         {answer.wallet}", file=out)
    print(f"credit:         {usdc_text(_micro(answer.balanceMicroUsdc))}", file=out)
    print(f"held:           {usdc_text(_micro(answer.heldMicroUsdc))}  (by calls in flight)", file=out)
    print(f"lapses:         {lapse_text(answer.expiresAt)}", file=out)
    if answer.movements is not None:
        print(f"movements:      {len(answer.movements)} latest, newest first", file=out)
        for moved in answer.movements:
            print(movement_line(moved), file=out)
    return 0


def _session_refused(exc: SessionError | PayError, output: str, out: TextIO, err: TextIO) -> int:
    """A session command refused; a SessionError carries the gateway's words, cut to one line."""
    if isinstance(exc, SessionError):
        exc = PayError(one_line(str(exc), UNTRUSTED_CHARS), "session_failed")
    return report_refusal(exc, output, out, err, command="credits")


async def run_open_session(
    base: str,
    cap_usdc: str,
    *,
    keypair_file: str,
    ttl_s: int = 3600,
    session_file: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``credits BASE_URL --open-session CAP``: sign in once, print the session's token."""
    out, err = out or sys.stdout, err or sys.stderr
    output = "json" if as_json else "text"
    try:
        base = base_url(base)
        cap = session_cap(cap_usdc, "--open-session")
        if not 0 < ttl_s <= 3600:
            raise PayError(f"--session-ttl {ttl_s} must be from 1 to 3600 seconds", "usage")
        keypair = load_keypair(keypair_file)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)) as http:
            opened = await open_session(http, base, keypair, cap, ttl_s)
    except (SessionError, PayError) as exc:
        return _session_refused(exc, output, out, err)
    if session_file:
        SessionCache(session_file).put(opened)
    if as_json:
        found = {"wallet": opened.wallet, "token": opened.token, "capMicroUsdc": str(opened.cap)}
        print(json.dumps({"ok": True, **found, "expiresAt": opened.expires_at}), file=out)
        return 0
    print(f"wallet:         {opened.wallet}", file=out)
    print(f"session:        {opened.token}", file=out)
    print(f"cap:            {usdc_text(opened.cap)}", file=out)
    print(f"expires:        {lapse_text(opened.expires_at)}", file=out)
    print("send it as X-CREDIT-SESSION; revoke it with credits --revoke-session TOKEN", file=err)
    return 0


async def run_revoke_session(
    base: str,
    token: str,
    *,
    keypair_file: str,
    session_file: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``credits BASE_URL --revoke-session [TOKEN]``: end a session, print what it spent."""
    out, err = out or sys.stdout, err or sys.stderr
    output = "json" if as_json else "text"
    try:
        base = base_url(base)
        cache = SessionCache(session_file) if session_file else None
        if not token:
            wallet = str(load_keypair(keypair_file).pubkey())
            kept = cache.get(base, wallet) if cache is not None else None
            if kept is None:
                raise PayError("give the session's TOKEN, or a --session-file holding one", "usage")
            token = kept.token
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)) as http:
            revoked = await revoke_session(http, base, token)
    except (SessionError, PayError) as exc:
        return _session_refused(exc, output, out, err)
    if cache is not None:
        cache.drop(base, revoked.wallet)
    if as_json:
        print(json.dumps({"ok": True, "revoked": True, **msgspec.to_builtins(revoked)}), file=out)
        return 0
    print(f"wallet:         {revoked.wallet}", file=out)
    spent, cap = usdc_text(_micro(revoked.spentMicroUsdc)), usdc_text(_micro(revoked.capMicroUsdc))
    print(f"revoked:        spent {spent} of {cap}", file=out)
    return 0


def movement_line(moved: Movement) -> str:
    """One movement as ``credits`` prints it: when, what, how much, where (the gateway's words
    are untrusted: cut to one line)."""
    when = datetime.fromtimestamp(moved.at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    fields = [when, f"{one_line(moved.kind, 16):<13}", f"{usdc_text(_micro(moved.amountMicroUsdc)):>16}"]
    fields.append(one_line(moved.route or "-", UNTRUSTED_CHARS))
    if moved.signature:
        fields.append(one_line(moved.signature, 100))
    return "  " + "  ".join(fields)
