"""CORS for public, paid and sign-in routes, in the style of Starlette's own.

Every header is precomputed in ``__init__``; ``__call__`` answers a preflight or adds the
simple-response headers and gets out of the way. The payment headers are the registered
methods' own (:data:`gateway.routing.vocabulary.PAYMENT_METHODS`): a browser may send every
method's credential headers and read every method's receipts.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.vocabulary import HANDLERS, PAYMENT_METHODS
from gateway.web.asgi import ASGIApp, Message, RawHeaders, Receive, Scope, Send, send_bytes


def allow_headers() -> str:
    """What a browser may send: the body's type, every method's credentials (and what else it
    allows), the handlers' own credentials, and ``Authorization``."""
    names = ["Content-Type"]
    for mode in PAYMENT_METHODS.values():
        names += [c.header for c in mode.credentials] + list(mode.also_allowed)
    names += [c.header for handler in HANDLERS.values() for c in handler.credentials]
    return ", ".join(dict.fromkeys([*names, "Authorization"]))


def expose_headers() -> str:
    """What a browser may read: the challenge, ``Retry-After``, and every method's receipts."""
    names = ["Content-Type", "WWW-Authenticate", "PAYMENT-REQUIRED", "Retry-After"]
    names += [r.header for mode in PAYMENT_METHODS.values() for r in mode.receipts]
    return ", ".join(dict.fromkeys(names))


class CorsMiddleware:
    """Answer OPTIONS for the route's methods; add ``Access-Control-*`` to every response."""

    def __init__(self, app: ASGIApp, methods: Sequence[str]) -> None:
        self.app = app
        allowed = ", ".join([*methods, "OPTIONS"])
        # Allow lists what the path answers (HEAD with GET), as the 405 of MethodDispatcher does.
        answered = ", ".join([*methods, *(["HEAD"] if "GET" in methods else []), "OPTIONS"])
        self.preflight: RawHeaders = [
            (b"access-control-allow-origin", b"*"),
            (b"access-control-allow-methods", allowed.encode()),
            (b"access-control-allow-headers", allow_headers().encode()),
            (b"access-control-max-age", b"600"),
            (b"allow", answered.encode()),
        ]
        self.simple: RawHeaders = [
            (b"access-control-allow-origin", b"*"),
            (b"access-control-expose-headers", expose_headers().encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "OPTIONS":
            await send_bytes(send, 204, b"", self.preflight)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *self.simple]
            await send(message)

        await self.app(scope, receive, send_with_cors)
