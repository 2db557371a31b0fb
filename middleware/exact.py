"""X402Exact: the paid side of an ``exact`` route, as a thin ASGI adapter of the payment core.

:class:`~gateway.payments.PaymentGate` decides (its docstring has the order of the checks);
this layer reads the header and the body, records what was learned in the request's context and
renders the result: a 402 challenge or refusal, a replayed answer, a reconciled settlement, or
the inner app with the verified, claimed payment and the validated body in the request's
context (``payment``, ``input``), from where :class:`~middleware.settle.SettleAfterSuccess`
settles it. Invalid input and store outages are left to the one conversion of each
(``gateway.failures``): 400 and 503.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.asgi import ASGIApp, Receive, Scope, Send, header, read_body, send_error
from gateway.context import Outcome, request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.payments import Challenge, Conflict, Paid, PaymentGate, Reconcile, Refused, Replay, Settlement
from gateway.rate_limiter import Limited
from gateway.validation import ValidatedInput
from gateway.x402.headers import PAYMENT_SIGNATURE, X_PAYMENT
from middleware.payment_answers import PaymentAnswers

CREDENTIAL_HEADERS = (PAYMENT_SIGNATURE, X_PAYMENT)


class X402Exact:
    def __init__(
        self,
        app: ASGIApp,
        *,
        gate: PaymentGate,
        settlement: Settlement,
        answers: PaymentAnswers,
        max_body: int,
        client_ip: Callable[[Scope], str],
    ) -> None:
        self.app = app
        self.gate = gate
        self.settlement = settlement
        self.answers = answers
        self.max_body = max_body
        self.client_ip = client_ip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        raw = header(scope, PAYMENT_SIGNATURE) or header(scope, X_PAYMENT)
        inspected = await self.gate.inspect(raw, lambda: read_body(receive, self.max_body))
        if isinstance(inspected, Challenge):
            ctx.outcome = Outcome.CHALLENGED
            await self.answers.send_challenge(send)
            return
        if isinstance(inspected, Refused):
            await self.answers.refused(scope, send, inspected)
            return
        ctx.payer = inspected.payer
        match await self.gate.authorize(inspected, self.client_ip(scope)):
            case Replay(response=response):
                await self.answers.replayed(scope, send, response)
            case Refused() as refused:
                await self.answers.refused(scope, send, refused)
            case Reconcile() as retry:
                await self.answers.settled(scope, send, retry.paid, await self.settlement.reconcile(retry))
            case Conflict(message=message):
                await send_error(send, GatewayError(ErrorCode.IDEMPOTENCY_CONFLICT, message))
            case Limited(error=error):
                await send_error(send, error)
            case Paid(paid=paid, body=body):
                ctx.amount = paid.requirements.amount
                ctx.payment = paid
                ctx.input = ValidatedInput(path={}, query={}, body=body)
                await self.app(scope, receive, send)
