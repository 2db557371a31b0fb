"""What one request learned on its way through the pipeline, for the log line and metrics.

Middlewares fill it in ``scope["state"]["ctx"]``; nothing is kept in globals.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.asgi import Scope


@dataclass(slots=True)
class RequestContext:
    route: str = "unmatched"
    status: int = 0
    """Set when the response starts (by the outermost middleware): after that, no error page."""
    access: str = "-"
    outcome: str = "-"
    wallet: str | None = None
    payer: str | None = None
    amount: str | None = None
    settlement: str | None = None
    error: str | None = None


def request_context(scope: Scope) -> RequestContext:
    """The request's context, created on first use."""
    state = scope.setdefault("state", {})
    ctx = state.get("ctx")
    if ctx is None:
        ctx = state["ctx"] = RequestContext()
    assert isinstance(ctx, RequestContext)
    return ctx
