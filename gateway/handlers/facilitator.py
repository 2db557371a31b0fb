"""The internal facilitator routes: ``/api/internal/facilitator/{supported,verify,settle}``.

Pure ASGI. The shared secret in ``x-gateway-internal-secret`` is compared in constant time
before anything else happens (no body read, no parsing, no method check): a missing or wrong
secret, or a facilitator that is not configured (secret or wallet unset), is a 401.

Mounting: the app mounts the three endpoint objects (``routes.supported``, ``routes.verify``,
``routes.settle``) at the paths routes.yaml gives them. They are callable objects, not
functions, so Starlette's ``Route`` passes them raw ASGI too (it would wrap a function or bound
method as a request/response endpoint).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable

import msgspec

from gateway.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, read_body, send_bytes, send_error
from gateway.errors import ErrorCode, GatewayError
from gateway.payments.facilitators import Facilitator, FacilitatorUnavailable
from gateway.router import without_body
from gateway.store.base import StoreUnavailable
from gateway.x402.types import FacilitatorRequest

SECRET_HEADER = b"x-gateway-internal-secret"
DEFAULT_BODY_LIMIT = 64 * 1024
"""A Solana transaction is at most 1232 bytes; 64 KiB leaves room for any requirements."""

_log = logging.getLogger("gateway.facilitator")
_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(FacilitatorRequest)
_RESPONSE_HEADERS = (JSON_CONTENT_TYPE, (b"cache-control", b"no-store"))

Operation = Callable[["InternalFacilitatorRoutes", Scope, Receive, Send], Awaitable[None]]


class _Endpoint:
    """One route as a plain ASGI callable: secret gate, method check, then the operation."""

    def __init__(self, routes: InternalFacilitatorRoutes, method: str, operation: Operation) -> None:
        self._routes = routes
        self._method = method
        self._allow = "GET, HEAD" if method == "GET" else method
        self._operation = operation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not self._routes.authorized(scope):
            await send_error(send, GatewayError(ErrorCode.UNAUTHORIZED, "missing or wrong internal secret"))
            return
        if scope["method"] == "HEAD" and self._method == "GET":
            send = without_body(send)  # HEAD wherever GET is accepted: same headers, no body
        elif scope["method"] != self._method:
            await send_error(
                send,
                GatewayError(
                    ErrorCode.METHOD_NOT_ALLOWED, f"use {self._allow}", headers={"allow": self._allow}
                ),
            )
            return
        try:
            await self._operation(self._routes, scope, receive, send)
        except GatewayError as exc:
            await send_error(send, exc)
        except FacilitatorUnavailable as exc:
            await send_error(send, GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, str(exc)))
        except StoreUnavailable:
            await send_error(send, GatewayError(ErrorCode.STORE_UNAVAILABLE, "state store unavailable"))
        except Exception as exc:  # never leak internals; the type name is enough to investigate
            _log.error("internal facilitator failed: %s", type(exc).__name__)
            await send_error(send, GatewayError(ErrorCode.INTERNAL_ERROR, "internal error"))


class InternalFacilitatorRoutes:
    """The three internal facilitator endpoints over one facilitator and one shared secret."""

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
        self.supported = _Endpoint(self, "GET", InternalFacilitatorRoutes._supported)
        self.verify = _Endpoint(self, "POST", InternalFacilitatorRoutes._verify)
        self.settle = _Endpoint(self, "POST", InternalFacilitatorRoutes._settle)

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

    def _require(self) -> Facilitator:
        if self._facilitator is None:  # unreachable: authorized() is False then
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

    async def _supported(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await self._require().supported()
        await send_bytes(send, 200, _encoder.encode(answer), _RESPONSE_HEADERS)

    async def _verify(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = await self._read_request(receive)
        answer = await self._require().verify(request.paymentPayload, request.paymentRequirements)
        await send_bytes(send, 200, _encoder.encode(answer), _RESPONSE_HEADERS)

    async def _settle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = await self._read_request(receive)
        answer = await self._require().settle(request.paymentPayload, request.paymentRequirements)
        await send_bytes(send, 200, _encoder.encode(answer), _RESPONSE_HEADERS)
