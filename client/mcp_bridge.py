"""``x402-gateway mcp``: a local stdio MCP server that pays a gateway's MCP tools from a wallet.

For MCP clients that cannot pay (desktop assistants): it lists the tools of the gateway's
``/mcp`` endpoint as its own and, when a call is answered with payment requirements, answers
them the way ``pay`` does, from the same parts (:mod:`client.pay`, :mod:`client.sessions`,
:mod:`client.siwx_signer`): a sign-in on a sign-in route; on a paid route prepaid credit first,
through one credit session (a sign-in per call where the gateway opens none), and, when the
wallet has too little credit, an exact USDC payment. It never spends more than ``--max-amount``
on one call (its exact price or its credit price, as the tool's listing states it) nor more than
``--max-session-amount`` in all while it runs: a call that would pass either is refused, as a
tool error, before anything is signed.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from solders.keypair import Keypair

from client.challenge import Challenge, PayError, siwx_extension
from client.pay import (
    UNTRUSTED_CHARS,
    SpendPolicy,
    _check_funds,
    _resource,
    choose_requirement,
    default_rpc_url,
    load_keypair,
    one_line,
    parse_usdc,
    spend_policy,
    usdc_text,
)
from client.sessions import MAX_SESSION_CAP, RENEWED, SessionCache, SessionError, open_session
from client.siwx_signer import sign_in
from client.svm_payer import create_exact_payment
from gateway.mcp.meta import PAYMENT_META, PRICE_META, SESSION_META, SIGN_IN_META
from gateway.outbound.solana_rpc import SolanaRpc, SolanaRpcError

DEFAULT_SESSION_AMOUNT = 1_000_000
"""micro-USDC (1 USDC): the most one run may spend unless ``--max-session-amount`` says otherwise."""
PENDING = 503
"""The one refusal after which a payment sent may still settle (its settlement is not known yet)."""


@dataclass
class Budget:
    """What this run may still spend, in micro-USDC."""

    limit: int
    spent: int = 0

    @property
    def left(self) -> int:
        return self.limit - self.spent

    def hold(self, amount: int, what: str) -> None:
        if amount > self.left:
            raise PayError(
                f"refusing to pay: {what} {usdc_text(amount)}, more than the {usdc_text(self.left)} "
                f"left of --max-session-amount {usdc_text(self.limit)}",
                "session_amount_spent",
            )
        self.spent += amount

    def release(self, amount: int) -> None:
        self.spent -= amount


class PayingBridge:
    """Calls the gateway's tools, answering their payment requirements from the wallet."""

    def __init__(
        self,
        gateway: ClientSession,
        http: aiohttp.ClientSession,
        origin: str,
        keypair: Keypair,
        *,
        rpc_url: str,
        policy: SpendPolicy,
        budget: Budget,
    ) -> None:
        self.gateway = gateway
        self.http = http
        self.origin = origin
        self.keypair = keypair
        self.wallet = str(keypair.pubkey())
        self.rpc_url = rpc_url
        self.policy = policy
        self.budget = budget
        self.sessions = SessionCache()
        self.tools: dict[str, types.Tool] = {}

    async def list_tools(self) -> list[types.Tool]:
        listed = (await self.gateway.list_tools()).tools
        self.tools = {tool.name: tool for tool in listed}
        return listed

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if self.sessions.get(self.origin, self.wallet) is not None:  # no 402 first: the listed price
            on_session = await self._on_credit(name, arguments, None)
            if on_session is not None:
                return on_session
        first = await self.gateway.call_tool(name, arguments)
        challenge = _challenge(first)
        if challenge is None:
            return first
        try:
            return await self._answer(name, arguments, challenge)
        except PayError as exc:
            return refused(exc)

    async def _answer(
        self, name: str, arguments: dict[str, Any], challenge: Challenge
    ) -> types.CallToolResult:
        siwx = siwx_extension(challenge)
        if not challenge.accepts:
            if siwx is None:
                reason = f" ({one_line(challenge.error, UNTRUSTED_CHARS)})" if challenge.error else ""
                raise PayError(
                    f"payment required{reason}: nothing this wallet can answer", "unsupported_scheme"
                )
            return await self._call(name, arguments, {SIGN_IN_META: self._sign_in(siwx)})
        if siwx is not None:
            on_credit = await self._on_credit(name, arguments, siwx)
            if on_credit is not None:
                return on_credit
        return await self._pay(name, arguments, challenge)

    def _sign_in(self, extension: dict[str, Any]) -> str:
        try:
            return sign_in(extension, self.keypair, request_url=self.origin)
        except ValueError as exc:
            raise PayError(f"cannot sign in: {exc}", "siwx_refused") from None

    async def _on_credit(
        self, name: str, arguments: dict[str, Any], extension: dict[str, Any] | None
    ) -> types.CallToolResult | None:
        """The call on prepaid credit, within both caps, on the credit session (opened with the
        challenge's sign-in ``extension`` when there is none yet); None when the wallet has too
        little (or the tool states no credit price): the caller pays instead."""
        price = self._credit_price(name)
        if price is None or price > self.policy.max_amount or price > self.budget.left:
            return None
        meta = await self._credit_credential(extension)
        if meta is None:
            return None
        self.budget.hold(price, "the call takes")
        result = await self._call(name, arguments, meta)
        refusal = _challenge(result)
        if refusal is None and not result.isError:
            return result
        self.budget.release(price)  # credit is taken only from an answered call
        if refusal is None:
            return result  # answered, not paid: the gateway's error, nothing taken
        if refusal.error in RENEWED:
            self.sessions.drop(self.origin, self.wallet)
        return None

    async def _credit_credential(self, extension: dict[str, Any] | None) -> dict[str, str] | None:
        """The credit session's token (opened on the first call, capped at what this run may
        still spend), or a sign-in where the gateway opens none; None with neither at hand."""
        credit = self.sessions.get(self.origin, self.wallet)
        if credit is not None:
            return {SESSION_META: credit.token}
        if extension is None:
            return None
        try:
            credit = await open_session(
                self.http, self.origin, self.keypair, min(self.budget.left, MAX_SESSION_CAP)
            )
        except SessionError:
            return {SIGN_IN_META: self._sign_in(extension)}
        self.sessions.put(credit)
        return {SESSION_META: credit.token}

    def _credit_price(self, name: str) -> int | None:
        price = _listed_price(self.tools.get(name))
        text = price.get("creditMicroUsdc") if price else None
        return int(text) if isinstance(text, str) and text.isdigit() else None

    async def _pay(self, name: str, arguments: dict[str, Any], challenge: Challenge) -> types.CallToolResult:
        requirement = choose_requirement(challenge, self.policy, self.wallet)  # within --max-amount
        amount = int(requirement.amount)
        self.budget.hold(amount, "the call asks")  # before anything is signed
        rpc = SolanaRpc(self.rpc_url, self.http)
        try:
            mint = await _check_funds(rpc, requirement, self.keypair)
            payload = await create_exact_payment(
                rpc, requirement, self.keypair, resource=_resource(challenge), mint=mint
            )
        except (PayError, SolanaRpcError, ValueError) as exc:
            self.budget.release(amount)
            if isinstance(exc, PayError):
                raise
            code = "rpc_unavailable" if isinstance(exc, SolanaRpcError) else "invalid_payment_requirements"
            raise PayError(f"cannot build the payment: {exc}", code) from None
        result = await self._call(name, arguments, {PAYMENT_META: msgspec.to_builtins(payload)})
        if result.isError and _status(result) != PENDING:
            self.budget.release(amount)  # refused or not answered: nothing was settled
        return result

    async def _call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
        return await self.gateway.call_tool(name, arguments, meta=meta)


def _listed_price(tool: types.Tool | None) -> dict[str, Any] | None:
    price = (tool.meta or {}).get(PRICE_META) if tool is not None else None
    return price if isinstance(price, dict) else None


def _challenge(result: types.CallToolResult) -> Challenge | None:
    """The payment requirements of a tool error (the x402 MCP transport's), else None."""
    content = result.structuredContent
    if not result.isError or not isinstance(content, dict) or "x402Version" not in content:
        return None
    try:
        return msgspec.convert(content, Challenge)
    except msgspec.ValidationError:
        return None


def _status(result: types.CallToolResult) -> int | None:
    status = (result.structuredContent or {}).get("status")
    return status if isinstance(status, int) else None


def refused(exc: PayError) -> types.CallToolResult:
    """The bridge's own refusal, as a tool error naming why (nothing was signed or sent)."""
    message = str(exc)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)],
        structuredContent={"error": {"code": exc.code, "message": message}},
        isError=True,
    )


@asynccontextmanager
async def gateway_session(url: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url.rstrip("/") + "/mcp") as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def serve(bridge: PayingBridge) -> None:
    """The bridge's tools over stdio until the client closes it."""
    server: Server[Any, Any] = Server("x402-gateway-mcp")
    tools = await bridge.list_tools()

    async def list_tools() -> list[types.Tool]:
        return tools

    server.list_tools()(list_tools)  # type: ignore[no-untyped-call]  # the SDK's decorator
    server.call_tool(validate_input=False)(bridge.call)  # the gateway validates, as for HTTP
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def run_bridge(
    gateway: str,
    *,
    keypair_file: str,
    rpc_url: str | None = None,
    max_amount: str | None = None,
    max_session_amount: str | None = None,
    usdc_mint: str | None = None,
) -> int:
    """The ``mcp`` command: 0 once the client closed the session, 2 on bad options."""
    try:
        policy = spend_policy(max_amount, usdc_mint)
        keypair = load_keypair(keypair_file)
        limit = (
            DEFAULT_SESSION_AMOUNT
            if max_session_amount is None
            else parse_usdc(max_session_amount, "--max-session-amount")
        )
    except PayError as exc:
        print(f"x402-gateway mcp: {exc}", file=sys.stderr)
        return 2
    origin = gateway.rstrip("/")
    try:
        async with aiohttp.ClientSession() as http, gateway_session(origin) as session:
            bridge = PayingBridge(
                session,
                http,
                origin,
                keypair,
                rpc_url=rpc_url or default_rpc_url(),
                policy=policy,
                budget=Budget(limit),
            )
            await serve(bridge)
    except Exception as exc:  # the SDK's task groups raise groups: the first cause is the reason
        cause = _first_cause(exc)
        print(f"x402-gateway mcp: {origin}/mcp: {type(cause).__name__}: {cause}", file=sys.stderr)
        return 1
    return 0


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
