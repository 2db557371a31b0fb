"""The internal facilitator routes: ``/api/internal/facilitator/{supported,verify,settle}``.

Three plain ASGI handlers over one facilitator, and the shared secret that guards them. The app
mounts each on its path behind a :class:`~gateway.web.router.MethodDispatcher` that is given
:meth:`InternalFacilitatorRoutes.require_secret` as its gate: the secret in
``x-gateway-internal-secret`` is compared in constant time before anything else happens (no body
read, no parsing, no method check), and a missing or wrong secret, or a facilitator that is not
configured (secret or wallet unset), is a 401. From there on these routes are like any other:
the dispatcher checks the method (HEAD wherever GET) and turns every expected failure (a bad
body, the facilitator or the store unreachable) into the one error shape, once.

A facilitator's answer is the x402 wire body (``isValid``/``invalidReason``,
``success``/``errorReason``) with 200, whatever it says: a refused payment is the protocol's
answer, not an error of ours.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators.http import Facilitator
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, read_body, send_bytes
from gateway.x402.types import FacilitatorRequest

SECRET_HEADER = b"x-gateway-internal-secret"
DEFAULT_BODY_LIMIT = 64 * 1024
"""A Solana transaction is at most 1232 bytes; 64 KiB leaves room for any requirements."""

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(FacilitatorRequest)
_RESPONSE_HEADERS = (JSON_CONTENT_TYPE, (b"cache-control", b"no-store"))

Answer = Callable[[Receive], Awaitable[msgspec.Struct]]
"""One operation: the request's body in, the facilitator's wire answer out."""


class _Operation:
    """One route's handler: the facilitator's answer with 200. A callable object, so a Starlette
    ``Route`` would pass it raw ASGI too (it wraps a function or bound method as an endpoint)."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await self._answer(receive)
        await send_bytes(send, 200, _encoder.encode(answer), _RESPONSE_HEADERS)


class InternalFacilitatorRoutes:
    """The three internal facilitator handlers over one facilitator and one shared secret."""

    def __init__(
        self,
        facilitator: Facilitator | None,
        secret: str | None,
        *,
        body_limit: int = DEFAULT_BODY_LIMIT,
    ) -> None:
        self._facilitator = facilitator
        # Unset secret or wallet: keep a gate that nothing can pass.
        self._secret = secret.encode("utf-8") if secret and facilitator is not None else None
        self._secret_digest = hashlib.sha256(self._secret or b"").digest()
        self._body_limit = body_limit
        self.supported = _Operation(self._supported)
        self.verify = _Operation(self._verify)
        self.settle = _Operation(self._settle)

    def authorized(self, scope: Scope) -> bool:
        """Constant-time comparison of the secret header; False whenever the routes are disabled."""
        provided = b""
        for name, value in scope["headers"]:
            if name == SECRET_HEADER:
                provided = bytes(value)
                break
        if self._secret is None:
            return False
        # Digests first, so the comparison does not even reveal the secret's length.
        return hmac.compare_digest(hashlib.sha256(provided).digest(), self._secret_digest)

    def require_secret(self, scope: Scope) -> None:
        """The gate of these routes' dispatchers: 401 unless :meth:`authorized`."""
        if not self.authorized(scope):
            raise GatewayError(ErrorCode.UNAUTHORIZED, "missing or wrong internal secret")

    def _require(self) -> Facilitator:
        if self._facilitator is None:  # unreachable behind the gate: authorized() is False then
            raise GatewayError(ErrorCode.UNAUTHORIZED, "internal facilitator not configured")
        return self._facilitator

    async def _read_request(self, receive: Receive) -> FacilitatorRequest:
        body = await read_body(receive, self._body_limit)
        try:
            return _request_decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"invalid facilitator request: {exc}") from None
        except (msgspec.DecodeError, RecursionError):
            raise GatewayError(ErrorCode.INVALID_REQUEST, "request body is not valid JSON") from None

    async def _supported(self, receive: Receive) -> msgspec.Struct:
        return await self._require().supported()

    async def _verify(self, receive: Receive) -> msgspec.Struct:
        request = await self._read_request(receive)
        return await self._require().verify(request.paymentPayload, request.paymentRequirements)

    async def _settle(self, receive: Receive) -> msgspec.Struct:
        request = await self._read_request(receive)
        return await self._require().settle(request.paymentPayload, request.paymentRequirements)
