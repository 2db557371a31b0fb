"""Sign-in-with-x for the asset-data routes (access ``siwx``): challenge, verify, validate, admit.

The order never changes: no ``SIGN-IN-WITH-X`` header -> 402 challenge before the body is read
(a challenge has no side effect: it is not counted against any limit); a header -> verify it
(refused: 402 with a fresh challenge whose ``error`` is the reason) -> validate path, query and
body (400/413) -> :class:`~gateway.methods.sign_in.SignInGate` admits it (replayed: 402; over a limit:
429) -> the handler. Every refusal, a 429 included, counts against the client IP's challenge
limit, so re-sending a refused sign-in is not free; the wallet, IP and upstream-key buckets are
spent by credible sign-ins alone.
Nothing is paid and nothing is settled: the price is $0.00, so no payment header is ever asked for.

What it learned goes inward in the request's context: the :class:`VerifiedSignIn` as ``sign_in``
and the :class:`ValidatedInput` as ``input``.

A route whose sign-in authorises terms given in its query (a credit session's cap and lifetime:
:class:`SignedTerms`) validates the query first (400 before any challenge), and its challenge's
resource URL carries the terms, so the wallet's signature covers them, and its statement names
them; a sign-in whose signed statement is not that one is refused (``siwx_statement_mismatch``),
so a relay cannot show the wallet other words for the same terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from gateway.limits.rate_limiter import Limited, RateLimiter
from gateway.methods.credit.sessions import STATEMENT_MISMATCH, signed_statement, with_statement
from gateway.methods.sign_in import Replayed, SignInGate
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import RequestValidator, ValidatedInput
from gateway.routing.vocabulary import Outcome
from gateway.web.asgi import (
    ASGIApp,
    RawHeaders,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    replay_body,
    request_path,
    send_bytes,
    send_error,
)
from gateway.web.context import request_context
from gateway.x402.headers import SIGN_IN_WITH_X, encode_header
from gateway.x402.siwx import SiwxError, SiwxIssuer, SiwxReason

_encoder = msgspec.json.Encoder()


class SignedTerms(Protocol):
    def signed(self, resource: str, query: Mapping[str, Any]) -> tuple[str, str]:
        """The resource URL the wallet signs for ``query`` (the terms in it) and the statement
        naming them."""
        ...


class SignInWithX:
    """Pure-ASGI middleware guarding one siwx route; everything per route is computed here once."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        route: RouteSpec,
        issuer: SiwxIssuer,
        gate: SignInGate,
        limiter: RateLimiter,
        max_body: int,
        terms: SignedTerms | None = None,
    ) -> None:
        self.app = app
        self.terms = terms
        self.description = route.description
        self.issuer = issuer
        self.gate = gate
        self.limiter = limiter
        self.validator = RequestValidator(route.input)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        resource = self.issuer.resource_url(request_path(scope))
        statement = None
        if self.terms is not None:
            query = self.validator.query(scope.get("query_string", b""))
            resource, statement = self.terms.signed(resource, query)
        signed = header(scope, SIGN_IN_WITH_X)
        if not signed:
            ctx.outcome = Outcome.CHALLENGED
            await self._challenge(send, resource, None, statement)
            return
        try:
            verified = self.issuer.verify(signed, resource)
        except SiwxError as refused:
            await self._refuse(scope, send, resource, refused.reason.value, statement)
            return
        if statement is not None and signed_statement(signed) != statement:
            await self._refuse(scope, send, resource, STATEMENT_MISMATCH, statement)
            return
        ctx.wallet = verified.address
        receive, validated = await self._validate(scope, receive)
        match await self.gate.admit(verified, self.limiter.client_ip(scope)):
            case Replayed():
                await self._refuse(scope, send, resource, SiwxReason.REPLAYED.value, statement)
            case Limited(error=error):
                await self.limiter.challenge(scope)
                await send_error(send, error)
            case _:
                ctx.outcome = Outcome.SIGNED_IN
                ctx.sign_in, ctx.input = verified, validated
                await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, send: Send, resource: str, reason: str, statement: str | None
    ) -> None:
        """A fresh challenge naming the reason; a refusal counts against the IP's challenge limit."""
        ctx = request_context(scope)
        ctx.outcome, ctx.error = Outcome.REFUSED, reason
        await self.limiter.challenge(scope)
        await self._challenge(send, resource, reason, statement)

    async def _challenge(self, send: Send, resource: str, error: str | None, statement: str | None) -> None:
        """A 402 with a fresh challenge, as JSON body and base64 ``PAYMENT-REQUIRED`` header."""
        challenge = self.issuer.challenge(
            resource, error=error, description=self.description, mime_type="application/json"
        )
        if statement is not None:
            challenge = with_statement(challenge, statement)
        headers: RawHeaders = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            (b"payment-required", encode_header(challenge).encode("ascii")),
        ]
        await send_bytes(send, 402, _encoder.encode(challenge), headers)

    async def _validate(self, scope: Scope, receive: Receive) -> tuple[Receive, ValidatedInput]:
        """The route's declared input; ``InvalidInput`` (400 naming the parameter) or 413 for an
        oversized body."""
        path = self.validator.path(scope.get("path_params") or {})
        query = self.validator.query(scope.get("query_string", b""))
        body = None
        if self.validator.has_body:
            raw = await read_body(receive, self.max_body)
            receive = replay_body(raw)
            body = self.validator.body(raw)
        return receive, ValidatedInput(path=path, query=query, body=body)
