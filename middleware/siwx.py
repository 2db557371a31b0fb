"""Sign-in-with-x for the asset-data routes (access ``siwx``): challenge, verify, validate, claim.

The order never changes: no ``SIGN-IN-WITH-X`` header -> 402 challenge before the body is read;
a header -> verify it (refused: 402 with a fresh challenge whose ``error`` is the reason) ->
validate path, query and body (400/413) -> in one store round trip, the nonce unused (replayed:
402), then the route's rate limits (429), then the nonce claimed -> the handler. Refusals count
against the per-IP challenge limit only; the wallet and upstream-key buckets are spent by
credible sign-ins alone, and a sign-in refused by a limit leaves its nonce unused, to be sent
again once the limit allows.
Nothing is paid and nothing is settled: the price is $0.00, so no payment header is ever asked for.

What it learned goes inward in the request's context: the :class:`VerifiedSignIn` as ``sign_in``
and the :class:`ValidatedInput` as ``input``.
"""

from __future__ import annotations

from urllib.parse import quote

import msgspec

from gateway.asgi import ASGIApp, RawHeaders, Receive, Scope, Send, header, read_body, replay_body, send_bytes
from gateway.context import request_context
from gateway.rate_limiter import RateLimiter
from gateway.routes import RouteSpec
from gateway.store import Entry, Store, StoreUnavailable
from gateway.validation import RequestValidator, ValidatedInput
from gateway.x402.headers import SIGN_IN_WITH_X, encode_header
from gateway.x402.siwx import SiwxError, SiwxIssuer, SiwxReason, VerifiedSignIn

REPLAY_KEY_PREFIX = "x402gw:siwx:"
_encoder = msgspec.json.Encoder()


class SignInWithX:
    """Pure-ASGI middleware guarding one siwx route; everything per route is computed here once."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        route: RouteSpec,
        issuer: SiwxIssuer,
        store: Store,
        limiter: RateLimiter,
        max_body: int,
    ) -> None:
        self.app = app
        self.description = route.description
        self.issuer = issuer
        self.store = store
        self.limiter = limiter
        self.validator = RequestValidator(route.input)
        self.max_body = max_body
        # Per-wallet buckets first: a wallet over its own limit is refused without spending the
        # allowance the whole upstream key shares with every other wallet.
        self.limits = sorted(route.rate_limits, key=lambda spec: spec.per != "wallet")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        resource = self.issuer.resource_url(_request_path(scope))
        signed = header(scope, SIGN_IN_WITH_X)
        if not signed:
            ctx.outcome = "challenged"
            await self._challenge(send, resource, None)
            return
        try:
            verified = self.issuer.verify(signed, resource)
        except SiwxError as refused:
            ctx.outcome, ctx.error = "refused", refused.reason.value
            await self.limiter.challenge(scope)  # a refused sign-in earns a challenge too
            await self._challenge(send, resource, refused.reason.value)
            return
        ctx.wallet = verified.address
        receive, validated = await self._validate(scope, receive)
        if not await self._use(verified):
            ctx.outcome, ctx.error = "refused", SiwxReason.REPLAYED.value
            await self.limiter.challenge(scope)
            await self._challenge(send, resource, SiwxReason.REPLAYED.value)
            return
        ctx.outcome = "signed_in"
        ctx.sign_in, ctx.input = verified, validated
        await self.app(scope, receive, send)

    async def _challenge(self, send: Send, resource: str, error: str | None) -> None:
        """A 402 with a fresh challenge, as JSON body and base64 ``PAYMENT-REQUIRED`` header."""
        challenge = self.issuer.challenge(
            resource, error=error, description=self.description, mime_type="application/json"
        )
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

    async def _use(self, verified: VerifiedSignIn) -> bool:
        """Use the nonce once across every replica, for as long as it could still verify: False
        when it was used already. Only a credible sign-in (signature, expiry and single use all
        passed) spends the wallet's buckets and the allowance the whole upstream key shares; over
        a limit raises the 429 and leaves the nonce unused. One round trip (``StoreUnavailable``
        is the 503 of every layer)."""
        key = REPLAY_KEY_PREFIX + verified.nonce
        found = await self.store.check_then_limit(
            [key],
            self.limiter.buckets(self.limits, verified.address),
            [Entry(key, verified.address, verified.replay_ttl_ms)],
        )
        if found.values[0] is not None:
            return False
        self.limiter.enforce(self.limits, found.decisions)
        if not found.written:
            raise StoreUnavailable("state store neither refused nor recorded the sign-in")
        return True


def _request_path(scope: Scope) -> str:
    """The path exactly as the client sent it (percent-encoded ASCII), for the signed resource URL.

    The decoded ``path`` may hold control characters that do not belong in a signed message, and
    the raw form is what an HTTP client reports as the URL it fetched.
    """
    raw = scope.get("raw_path")
    if raw:
        return str(raw.partition(b"?")[0].decode("latin-1"))
    return quote(scope["path"], safe="/")
