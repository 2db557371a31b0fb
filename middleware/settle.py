"""SettleAfterSuccess: buffer the handler's answer; settle only when the upstream succeeded.

``challenged -> verified -> claimed -> upstream_ok -> intent recorded -> settled``; an upstream
failure passes its 502/504 through with nothing settled (the claim stays, so the authorization
is dead), a settlement failure withholds the body behind a 402 ``settlement_failed``. The
settling itself (write-ahead intent, reconciliation, delivery once) is
:class:`~gateway.payments.Settlement`'s; this layer buffers, decides whether to settle and
renders the outcome.
"""

from __future__ import annotations

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, send_bytes
from gateway.context import Outcome, request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import log_event
from gateway.payments import PaidRequest, Settlement, StoredResponse
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


class SettleAfterSuccess:
    def __init__(
        self, app: ASGIApp, *, settlement: Settlement, answers: PaymentAnswers, route_name: str
    ) -> None:
        self.app = app
        self.settlement = settlement
        self.answers = answers
        self.route_name = route_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        paid = ctx.payment
        if paid is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "paid route is served without X402Exact")
        buffer = _Buffer()
        try:
            await self.app(scope, receive, buffer.send)
        except GatewayError:  # the handler's 502/504: discarded all the same
            self._discard(scope, paid)
            raise
        body = b"".join(buffer.chunks)
        if buffer.status != 200 or not ctx.upstream_ok:
            self._discard(scope, paid)
            await send_bytes(send, buffer.status, body, buffer.headers)
            return
        response = StoredResponse(status=200, body=body, content_type=buffer.content_type)
        await self.answers.settled(scope, send, paid, await self.settlement.settle(paid, response))

    def _discard(self, scope: Scope, paid: PaidRequest) -> None:
        """Upstream failed: nothing is settled, the claim stays, the flow counts as failed."""
        request_context(scope).outcome = Outcome.UPSTREAM_FAILED
        log_event("payment discarded: upstream failed", route=self.route_name, payer=paid.payer)
