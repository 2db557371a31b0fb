"""CORS for public, paid and sign-in routes, in the style of Starlette's own.

Every header is precomputed in ``__init__``; ``__call__`` answers a preflight or adds the
simple-response headers and gets out of the way.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.web.asgi import ASGIApp, Message, RawHeaders, Receive, Scope, Send, send_bytes

ALLOW_HEADERS = (
    "Content-Type, PAYMENT-SIGNATURE, X-PAYMENT, X-PAYMENT-RESPONSE, PAYMENT-RESPONSE, "
    "SIGN-IN-WITH-X, X-CREDIT-SESSION, Authorization"
)
EXPOSE_HEADERS = (
    "Content-Type, WWW-Authenticate, X-PAYMENT-RESPONSE, PAYMENT-RESPONSE, PAYMENT-REQUIRED, Retry-After, "
    "X-Credit-Balance"
)


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
            (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
            (b"access-control-max-age", b"600"),
            (b"allow", answered.encode()),
        ]
        self.simple: RawHeaders = [
            (b"access-control-allow-origin", b"*"),
            (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
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
