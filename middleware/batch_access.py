"""BatchAccess: a provider's JSON-RPC endpoint, priced per request, behind the one access layer.

What a batch costs depends on its body, so the body is read (bounded by ``MAX_BODY_BYTES``) and
every call validated and priced (``gateway.batch.endpoint``) before anything else: a 400 here
costs no store round trip, no bucket and no facilitator. Only then does the request meet
:class:`~middleware.paid_access.PaidAccess`, with the route's payment methods bound to this
request's priced route (bound once per distinct mix of methods, then reused): its 402 asks for
this batch's price, and a credential is checked, limited, settled or taken exactly as on a
per-method route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gateway.batch.endpoint import BatchEndpoint
from gateway.batch.methods import batch_method
from gateway.batch.proxy import BATCH_SCOPE_KEY, BatchCall
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.seam import RouteMethod
from gateway.routing.routes import RouteSpec
from gateway.web.asgi import ASGIApp, Receive, Scope, Send, read_body, replay_body
from middleware.paid_access import PaidAccess

Binder = Callable[[RouteSpec], Sequence[tuple[str, RouteMethod[Any]]]]
"""The route's payment methods bound to a priced route, each with its registered name."""
MAX_BOUND = 4096
"""Distinct mixes of methods bound and kept (then all forgotten at once, and bound again)."""


class BatchAccess:
    """Pure-ASGI middleware of one endpoint: parse and price, then the paid-access layer."""

    def __init__(
        self, app: ASGIApp, *, endpoint: BatchEndpoint, bind: Binder, limiter: RateLimiter, max_body: int
    ) -> None:
        self.app = app
        self.endpoint = endpoint
        self.bind = bind
        self.limiter = limiter
        self.max_body = max_body
        self._bound: dict[tuple[str, ...], Sequence[tuple[str, RouteMethod[Any]]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await read_body(receive, self.max_body)
        batch = self.endpoint.parse(raw)
        call = BatchCall(batch)
        scope[BATCH_SCOPE_KEY] = call
        paid = PaidAccess(
            self.app,
            route_name=self.endpoint.name,
            methods=[batch_method(name, method, call) for name, method in self._methods(call)],
            limiter=self.limiter,
            max_body=self.max_body,
        )
        await paid(scope, replay_body(raw), send)

    def _methods(self, call: BatchCall) -> Sequence[tuple[str, RouteMethod[Any]]]:
        batch = call.batch
        key = batch.key
        bound = self._bound.get(key)
        if bound is None:
            if len(self._bound) >= MAX_BOUND:
                self._bound.clear()
            bound = self._bound[key] = self.bind(self.endpoint.priced(batch))
        return bound
