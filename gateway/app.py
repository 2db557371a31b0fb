"""The app factory: routes.yaml -> one pipeline per route, built once, inside a Starlette app.

Each route's ``access`` decides the middlewares stacked around its handler:

    public:           CORS -> handler
    a payment method: CORS -> ChallengeRateLimit -> PaidAccess (the methods bound to the route) -> handler
    siwx (sign-in):   CORS -> PaidAccess (sign-in-with-x at $0.00) -> handler
    internal:         handler (gated by its shared secret; no CORS)

This is the composition root: each payment method (:mod:`gateway.methods.registry`) takes its
typed dependencies from the shared parts once per app, and binds to each route with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import groupby
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.types import ASGIApp as StarletteASGIApp

from gateway.batch.endpoint import BatchEndpoint
from gateway.batch.proxy import BatchProxy
from gateway.config import Settings, startup_notes
from gateway.handlers.catalog import CatalogHandler
from gateway.handlers.docs import DocsHandler
from gateway.handlers.health import HealthHandler
from gateway.handlers.jsonrpc import JsonRpcProxy
from gateway.handlers.metrics import MetricsHandler
from gateway.handlers.openapi import OpenApiHandler
from gateway.handlers.readiness import ReadyHandler
from gateway.handlers.tokens import TokensHandler
from gateway.mcp.meta import MCP_PATH
from gateway.mcp.mount import mcp_endpoint, with_endpoint
from gateway.methods.credit.handlers import (
    BalanceHandler,
    SessionOpenHandler,
    SessionRevokeHandler,
    TopUpHandler,
)
from gateway.methods.credit.sessions import CreditSessions
from gateway.methods.registry import METHODS, PaymentMethod
from gateway.methods.seam import RouteMethod, credential_headers
from gateway.outbound.client import UpstreamClient
from gateway.routing.plan import plan_routes
from gateway.routing.pricing import credit_terms
from gateway.routing.routes import (
    RouteSpec,
    load_routes,
    named_limits,
    payment_methods,
    sells_anything,
)
from gateway.routing.vocabulary import ACCESS_MODES
from gateway.services import Services
from gateway.store import Store
from gateway.telemetry.logs import configure_logging, log_event
from gateway.web.asgi import ASGIApp, BodyReadDeadline
from gateway.web.router import MethodDispatcher, PathTable, not_found
from middleware.batch_access import BatchAccess
from middleware.cors import CorsMiddleware
from middleware.paid_access import PaidAccess
from middleware.ratelimit import ChallengeRateLimit, ScopeRateLimit
from middleware.telemetry import TelemetryMiddleware

HandlerFactory = Callable[[RouteSpec, Services], ASGIApp]
AccessLayer = Callable[[ASGIApp, RouteSpec, Services], ASGIApp]


def _health(route: RouteSpec, services: Services) -> ASGIApp:
    return HealthHandler()


def _ready(route: RouteSpec, services: Services) -> ASGIApp:
    return ReadyHandler(services.readiness)


def _catalog(route: RouteSpec, services: Services) -> ASGIApp:
    s = services.settings
    return CatalogHandler(
        route,
        services.routes,
        s.base_url,
        s.usdc_mint,
        s.pay_to,
        services.facilitator_fee,
        credit_terms(s),
        services.batch_endpoints,
    )


def _metrics(route: RouteSpec, services: Services) -> ASGIApp:
    endpoints = [endpoint.name for endpoint in services.batch_endpoints]
    return MetricsHandler(services.usage, [*(r.name for r in services.routes), *endpoints])


def _openapi(route: RouteSpec, services: Services) -> ASGIApp:
    s = services.settings
    return OpenApiHandler(
        services.routes,
        s.base_url,
        s.usdc_mint,
        s.pay_to,
        services.facilitator_fee,
        credit_terms(s),
        services.batch_endpoints,
    )


def _docs(route: RouteSpec, services: Services) -> ASGIApp:
    return DocsHandler(route.path)


def _tokens(route: RouteSpec, services: Services) -> ASGIApp:
    upstream = route.upstream or ""  # none at all: TokensHandler refuses the route by name
    return TokensHandler(
        route,
        base_url=services.settings.upstream_url(upstream),
        api_key=services.settings.asset_api_key.reveal(),
        client=services.upstream(upstream),
    )


def _jsonrpc(route: RouteSpec, services: Services) -> ASGIApp:
    assert route.upstream is not None and route.operation is not None
    upstream = route.upstream
    return JsonRpcProxy(
        url=services.settings.upstream_url(upstream) or "",
        method=route.operation,
        client=services.upstream(upstream),
    )


def _credit_top_up(route: RouteSpec, services: Services) -> ASGIApp:
    assert route.provider_price_micro_usdc is not None, f"top-up {route.name} has no price"
    return TopUpHandler(services.credit_book, route.provider_price_micro_usdc)


def _credit_balance(route: RouteSpec, services: Services) -> ASGIApp:
    return BalanceHandler(services.credit_book, services.recorder)


def credit_sessions(services: Services) -> CreditSessions:
    """The app's credit sessions: on its store, for its sign-in origin."""
    return CreditSessions(services.store, services.siwx.base_url, services.credit_book)


def _credit_session_open(route: RouteSpec, services: Services) -> ASGIApp:
    # its sign-in signs the session's terms (gateway.methods.sign_in.SignInMethod)
    return SessionOpenHandler(credit_sessions(services))


def _credit_session_revoke(route: RouteSpec, services: Services) -> ASGIApp:
    return SessionRevokeHandler(credit_sessions(services), services.limiter)


def _internal(route: RouteSpec, services: Services) -> ASGIApp:
    """An internal facilitator operation; its path's dispatcher checks the shared secret first."""
    operation: ASGIApp = getattr(services.internal_routes, route.handler.removeprefix("facilitator_"))
    return operation


HANDLER_FACTORIES: dict[str, HandlerFactory] = {
    "health": _health,
    "ready": _ready,
    "catalog": _catalog,
    "metrics": _metrics,
    "openapi": _openapi,
    "docs": _docs,
    "jsonrpc": _jsonrpc,
    "tokens": _tokens,
    "facilitator_supported": _internal,
    "facilitator_verify": _internal,
    "facilitator_settle": _internal,
    "credit_top_up": _credit_top_up,
    "credit_balance": _credit_balance,
    "credit_session_open": _credit_session_open,
    "credit_session_revoke": _credit_session_revoke,
}
"""One factory per handler of :data:`gateway.routing.vocabulary.HANDLERS` (a test holds the two equal)."""


def challenge_limit(app: ASGIApp, services: Services, credential_headers: tuple[bytes, ...]) -> ASGIApp:
    """Unpaid requests (no credential header) are limited per client IP before any work."""
    return ChallengeRateLimit(app, services.limiter, credential_headers)


def _public(app: ASGIApp, route: RouteSpec, services: Services) -> ASGIApp:
    return ScopeRateLimit(app, services.limiter, route.rate_limits) if route.rate_limits else app


class MethodBinder:
    """Binds payment methods to routes, each with the typed dependencies it takes from the
    app's shared parts, made once per app (the method never sees the rest)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.deps: dict[str, Any] = {}

    def bind(self, method: PaymentMethod[Any], route: RouteSpec) -> RouteMethod[Any]:
        if method.name not in self.deps:
            self.deps[method.name] = method.dependencies(self.services)
        return method.bind(route, self.deps[method.name])


def _paid(app: ASGIApp, route: RouteSpec, services: Services, binder: MethodBinder) -> ASGIApp:
    """A payment method's route: the one paid-access layer around the handler, with the methods
    the route accepts bound to it (its access mode's first); unpaid requests are limited per
    client IP first, unless the route's challenge has no side effect (a sign-in's)."""
    accepted = [METHODS[name] for name in payment_methods(route, services.settings)]
    paid = PaidAccess(
        app,
        route_name=route.name,
        methods=[binder.bind(method, route) for method in accepted],
        limiter=services.limiter,
        max_body=services.settings.max_body_bytes,
    )
    if not any(method.mode.counts_challenges for method in accepted):
        return paid
    return challenge_limit(paid, services, paid.credential_headers)


def batch_pipeline(endpoint: BatchEndpoint, services: Services, binder: MethodBinder) -> ASGIApp:
    """A provider's JSON-RPC endpoint (``gateway.batch``): unpaid requests limited per client IP
    first, as on its per-method routes, then the body priced, then the paid-access layer."""
    route = endpoint.template
    accepted = [METHODS[name] for name in payment_methods(route, services.settings)]
    proxy = _jsonrpc(msgspec.structs.replace(route, operation=""), services)
    assert isinstance(proxy, JsonRpcProxy)
    access = BatchAccess(
        BatchProxy(proxy),
        endpoint=endpoint,
        bind=lambda priced: [(m.name, binder.bind(m, priced)) for m in accepted],
        limiter=services.limiter,
        max_body=services.settings.max_body_bytes,
    )
    app: ASGIApp = access
    if any(method.mode.counts_challenges for method in accepted):
        headers = tuple(name for method in accepted for name in credential_headers(method.mode))
        app = challenge_limit(access, services, headers)
    return CorsMiddleware(MethodDispatcher({"POST": (route, app)}, "POST, OPTIONS"), ["POST"])


def _internal_gate(app: ASGIApp, route: RouteSpec, services: Services) -> ASGIApp:
    """Nothing around it: the endpoint checks its shared secret itself, before anything else."""
    return app


ACCESS_LAYERS: dict[str, AccessLayer] = {
    "public": _public,
    "internal": _internal_gate,
}
"""The middlewares around a handler, per built-in access mode of
:data:`gateway.routing.vocabulary.ACCESS_MODES`; every payment method gets :func:`_paid`."""


def buildable(access: str) -> bool:
    """A built-in mode with its own layers, or a registered payment method."""
    return access in METHODS or access in ACCESS_LAYERS


class UnbuildableRoute(LookupError):
    """A route names a handler or access mode this app has no factory for (the loader refuses
    both, so only a hand-built route list can get here)."""


def build_pipeline(route: RouteSpec, services: Services, binder: MethodBinder) -> ASGIApp:
    """The handler with exactly the middlewares its access mode needs (CORS is per path)."""
    app = HANDLER_FACTORIES[route.handler](route, services)
    if route.access in METHODS:
        return _paid(app, route, services, binder)
    return ACCESS_LAYERS[route.access](app, route, services)


def check_buildable(routes: list[RouteSpec]) -> None:
    """Refuse, naming each, the routes this app has no handler factory or access layer for."""
    problems = [
        f"route {r.name}: no factory for handler {r.handler!r}"
        if r.handler not in HANDLER_FACTORIES
        else f"route {r.name}: no layer for access mode {r.access!r}"
        for r in routes
        if r.handler not in HANDLER_FACTORIES or not buildable(r.access)
    ]
    if problems:
        raise UnbuildableRoute("\n".join(problems))


class GatewayApp(Starlette):
    """Starlette for the lifespan and the router; the outermost layer is our telemetry, which
    also turns an unexpected error into the one error shape. Starlette's own error and
    exception middlewares (for HTTPException handlers this app never registers) are left out
    of every request's path."""

    body_timeout_s = 10.0
    max_body_bytes = 65536

    def build_middleware_stack(self) -> StarletteASGIApp:
        inner = BodyReadDeadline(self.router, self.body_timeout_s, drain_limit=self.max_body_bytes)
        services = self.state.services
        return TelemetryMiddleware(inner, services.usage, services.request_log)


def create_app(
    settings: Settings,
    routes: list[RouteSpec] | None = None,
    store: Store | None = None,
    outbound: UpstreamClient | None = None,
) -> Starlette:
    """Build the whole gateway for ``settings``; ``routes`` defaults to the ROUTES_FILE table.

    ``store`` and ``outbound`` (the one client every upstream, facilitator and node call goes
    out through) are made from ``settings`` unless handed in; the app's lifespan opens and
    closes both."""
    configure_logging(settings.log_level)
    if routes is None:
        routes = load_routes(settings.routes_file, named_limits(settings))
    check_buildable(routes)
    mounted, warnings = plan_routes(routes, settings)
    for note in startup_notes(settings):
        log_event(note)
    for warning in warnings:
        log_event(warning, logging.WARNING)
    services = Services(settings, mounted, store, outbound)
    binder = MethodBinder(services)
    entries: list[tuple[str, ASGIApp, str]] = []
    for path, group in groupby(sorted(mounted, key=_path_order), key=lambda r: r.path):
        specs = list(group)
        pipelines = {r.method: (r, build_pipeline(r, services, binder)) for r in specs}
        methods = [r.method for r in specs]
        allowed = [*methods, "HEAD"] if "GET" in methods else methods
        app: ASGIApp
        if len(specs) == 1 and not ACCESS_MODES[specs[0].access].from_browsers:
            # Server to server: its shared secret before anything else, the method included.
            gate = services.internal_routes.require_secret
            app = MethodDispatcher(pipelines, ", ".join(allowed), gate=gate)
        else:
            app = CorsMiddleware(MethodDispatcher(pipelines, ", ".join([*allowed, "OPTIONS"])), methods)
        entries.append((path, app, specs[0].name))
    for endpoint in services.batch_endpoints:
        entries.append((endpoint.path, batch_pipeline(endpoint, services, binder), endpoint.name))
    mcp = mcp_endpoint(mounted, services.facilitator_fee, credit_terms(settings), settings.max_body_bytes)
    if mcp is not None:  # its own path: the tools' calls run the routes' pipelines below
        entries.append((MCP_PATH, mcp, "mcp"))
    starlette = GatewayApp(
        routes=[PathTable(entries)],
        lifespan=with_endpoint(services.lifespan, mcp),
    )
    starlette.body_timeout_s = settings.client_body_timeout_s
    starlette.max_body_bytes = settings.max_body_bytes
    starlette.router.redirect_slashes = False
    starlette.router.default = not_found
    starlette.state.services = services
    if mcp is not None:
        mcp.gateway = starlette
    if sells_anything(mounted):
        log_event("gateway ready", routes=len(mounted), base_url=settings.base_url)
    else:
        log_event(
            "gateway up with nothing to sell: every paid and sign-in route group is off (ROUTE_GROUPS)",
            logging.WARNING,
            routes=len(mounted),
            base_url=settings.base_url,
        )
    return starlette


def _path_order(route: RouteSpec) -> tuple[bool, str]:
    """Fixed-segment paths first, so they win over ``{assetId}`` paths."""
    return (route.has_path_params, route.path)
