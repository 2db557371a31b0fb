"""What one request learned on its way through the pipeline: typed, in one place.

The access middlewares fill it (the validated input, the sign-in, who paid and what it came to),
the handler reads the input, and the telemetry turns the rest into the log line and metrics. A
payment itself never travels here: the layer that admitted it also finishes it. The context
lives in ``scope["state"]`` under :data:`CONTEXT_KEY`, the only key the gateway keeps there;
nothing is kept in globals.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.routing.validation import ValidatedInput
from gateway.routing.vocabulary import Outcome
from gateway.web.asgi import Scope
from gateway.x402.siwx import VerifiedSignIn

CONTEXT_KEY = "ctx"


@dataclass(slots=True)
class RequestContext:
    route: str = "unmatched"
    status: int = 0
    """Set when the response starts (by the outermost middleware): after that, no error page."""
    access: str = "-"
    outcome: str = Outcome.NONE
    """An :class:`Outcome`, or a registered method's own word."""
    wallet: str | None = None
    payer: str | None = None
    amount: str | None = None
    settlement: str | None = None
    error: str | None = None
    input: ValidatedInput | None = None
    """The request after its route's validator (every payment method's routes); ``.body`` is the JSON body."""
    sign_in: VerifiedSignIn | None = None
    """The verified sign-in (``siwx`` routes, :class:`gateway.methods.seam.Passed`)."""


def request_context(scope: Scope) -> RequestContext:
    """The request's context, created on first use."""
    state = scope.setdefault("state", {})
    ctx = state.get(CONTEXT_KEY)
    if ctx is None:
        ctx = state[CONTEXT_KEY] = RequestContext()
    assert isinstance(ctx, RequestContext)
    return ctx


def validated_input(scope: Scope) -> ValidatedInput:
    """The input an access middleware validated; a handler mounted without one is a wiring bug."""
    validated = request_context(scope).input
    if validated is None:
        raise GatewayError(ErrorCode.INTERNAL_ERROR, "route is served without input validation")
    return validated
