"""PaidAccess: the one access layer of every payment method, as a thin ASGI adapter.

No credential header of any of the route's methods -> the route's 402 (the body is never read).
A credential -> its method checks it (:class:`gateway.methods.seam.RouteMethod`) and this layer
renders the decision: a refusal, a conflict, a limit, an answer given again or reconciled, or
the handler, whose answer is buffered and handed to the method to finish only when it is a 200
(anything else passes through and the method abandons the grant: nothing is collected). A
method with nothing to collect (a sign-in at $0.00) lets the handler answer directly. The
grant stays in this call: no other layer sees it. Every method's admission passes here, so
this is the one place a 402 answered with an admitted credential is handed back to the client
IP's challenge limit: only unanswered 402s and refused credentials add up. Invalid input and
store outages are left to the one conversion of each (``gateway.web.failures``): 400 and 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.limits.rate_limiter import Limited, RateLimiter
from gateway.methods.results import Conflict, InProgress, Refused, Replay
from gateway.methods.seam import Admitted, Answer, Asked, Finished, Incoming, Offer, Passed, RouteMethod
from gateway.routing.validation import ValidatedInput
from gateway.routing.vocabulary import Outcome
from gateway.web.asgi import (
    ASGIApp,
    Message,
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
from middleware.payment_answers import PaymentAnswers


class _Buffer:
    """Collects the inner app's response instead of sending it."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))

    @property
    def content_type(self) -> str:
        for key, value in self.headers:
            if key.lower() == b"content-type":
                return str(value.decode("latin-1"))
        return "application/json"


class PaidAccess:
    """Pure-ASGI middleware guarding one paid or sign-in route; ``methods[0]`` is its primary
    (the first the route accepts): its 402 is the route's, the others extend it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        route_name: str,
        methods: Sequence[RouteMethod[Any]],
        limiter: RateLimiter,
        max_body: int,
    ) -> None:
        self.app = app
        self.primary = methods[0]
        self.others = tuple(methods[1:])
        self.selectors = [(name, method) for method in methods for name in method.credential_headers]
        self.answers = PaymentAnswers(route_name=route_name, challenge=self.challenge, limiter=limiter)
        self.max_body = max_body
        self.limiter = limiter
        self.client_ip = limiter.client_ip

    @property
    def credential_headers(self) -> tuple[bytes, ...]:
        """Every header that carries a credential here (the challenge limit spares them)."""
        return tuple(name for name, _ in self.selectors)

    async def challenge(self, scope: Scope, error: str | None) -> Offer:
        """The route's 402: its primary method's, with what the others add."""
        asked = _asked(scope)
        extensions: dict[str, Any] = {}
        for method in self.others:
            extensions.update(await method.extensions(asked))
        return await self.primary.challenge(asked, error, extensions)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        found = self._credential(scope)
        if found is None:
            ctx.outcome = Outcome.CHALLENGED
            await self.answers.send_challenge(scope, send)
            return
        credential, method, name = found
        read: list[bytes] = []

        async def body() -> bytes:
            read.append(await read_body(receive, self.max_body))
            return read[-1]

        incoming = Incoming(
            credential,
            request_path(scope),
            self.client_ip(scope),
            body,
            name.decode("latin-1"),
            scope.get("query_string", b""),
            scope.get("path_params") or {},
        )
        checked = await method.check(incoming)
        ctx.payer = checked.payer
        ctx.wallet = checked.wallet or ctx.wallet
        match checked.decision:
            case Admitted() as admitted:
                self.limiter.answered(scope)  # its 402 was answered: not an unpaid challenge
                ctx.amount = admitted.amount
                ctx.input = ValidatedInput(path={}, query={}, body=admitted.body)
                await self._serve(scope, receive, send, method, admitted)
            case Passed() as passed:
                ctx.outcome, ctx.input, ctx.sign_in = passed.outcome, passed.input, passed.sign_in
                await self.app(scope, replay_body(read[-1]) if read else receive, send)
            case Finished(settled=settled, amount=amount):
                ctx.amount = amount
                await self.answers.settled(scope, send, settled)
            case Refused() as refused:
                await self.answers.refused(scope, send, refused)
            case Replay(response=response):
                await self.answers.replayed(scope, send, response)
            case InProgress(message=message):
                await self.answers.in_progress(scope, send, message)
            case Conflict(message=message):
                await send_error(send, GatewayError(ErrorCode.IDEMPOTENCY_CONFLICT, message))
            case Limited(error=error):
                if checked.limit_counted:
                    await self.limiter.challenge(scope)
                await send_error(send, error)

    def _credential(self, scope: Scope) -> tuple[str, RouteMethod[Any], bytes] | None:
        """The first non-empty credential header, the method it selects and its name."""
        for name, method in self.selectors:
            credential = header(scope, name)
            if credential:
                return credential, method, name
        return None

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, method: RouteMethod[Any], admitted: Admitted[Any]
    ) -> None:
        """Call the handler; finish only on its 200, abandon on anything else."""
        buffer = _Buffer()
        try:
            await self.app(scope, receive, buffer.send)
        except GatewayError:  # the handler's 502/504: nothing collected all the same
            await self._abandon(scope, method, admitted)
            raise
        body = b"".join(buffer.chunks)
        if buffer.status != 200:
            await self._abandon(scope, method, admitted)
            await send_bytes(send, buffer.status, body, buffer.headers)
            return
        settled = await method.finish(admitted.grant, Answer(body, buffer.content_type))
        await self.answers.settled(scope, send, settled)

    async def _abandon(self, scope: Scope, method: RouteMethod[Any], admitted: Admitted[Any]) -> None:
        request_context(scope).outcome = Outcome.UPSTREAM_FAILED
        await method.abandon(admitted.grant)


def _asked(scope: Scope) -> Asked:
    return Asked(request_path(scope), scope.get("query_string", b""), scope.get("path_params") or {})
