"""The words a route of routes.yaml is built from, declared once: handlers, access modes, groups.

The loader refuses a word that is not here (with its YAML location), the app factory holds one
factory per handler and one layer per access mode named here, and the catalog and the OpenAPI
document describe a route by its access mode's entry, so the four never disagree. Provider
groups are not listed: they are whatever groups routes.yaml gives its routes.
"""

from __future__ import annotations

import msgspec


class AccessMode(msgspec.Struct, frozen=True, kw_only=True):
    """How a route is reached, and what that promises to a client."""

    scheme: str | None = None
    """The payment scheme its challenge names (catalog ``scheme``, OpenAPI ``x-x402``)."""
    rate_limit_per: tuple[str, ...] = ()
    """The ``per`` keys of ``rate_limits`` its middleware can enforce (none: it runs no limiter)."""
    error_statuses: tuple[int, ...] = ()
    """Statuses other than 200 any route of this mode can answer (a route adds 400 for its
    input and 429 for its rate limits)."""
    published: bool = True
    """Listed in the catalog and the OpenAPI document (when the route itself is listed)."""
    sells: bool = False
    """Paid or sign-in: a gateway serving none of these has nothing to sell."""
    from_browsers: bool = True
    """Its path answers CORS preflights and checks the method first; a server-to-server route
    instead checks its shared secret before anything else, the method included."""


ACCESS_MODES: dict[str, AccessMode] = {
    "public": AccessMode(rate_limit_per=("scope",), error_statuses=(405,)),
    "exact": AccessMode(
        scheme="exact",
        rate_limit_per=("scope", "wallet", "ip"),
        error_statuses=(400, 402, 405, 409, 413, 429, 502, 503, 504),
        sells=True,
    ),
    "siwx": AccessMode(
        scheme="sign-in-with-x",
        rate_limit_per=("scope", "wallet", "ip"),
        error_statuses=(400, 402, 404, 405, 413, 429, 502, 503, 504),
        sells=True,
    ),
    # Answers only to its shared secret: no limiter, no CORS, never published.
    "internal": AccessMode(published=False, from_browsers=False),
}


class Handler(msgspec.Struct, frozen=True, kw_only=True):
    """What answers a route once its access mode let the request through."""

    needs_upstream: bool = False
    """A route with this handler must name an ``upstream`` (it forwards there)."""


HANDLERS: dict[str, Handler] = {
    "health": Handler(),
    "ready": Handler(),
    "catalog": Handler(),
    "metrics": Handler(),
    "openapi": Handler(),
    "docs": Handler(),
    "jsonrpc": Handler(needs_upstream=True),
    "tokens": Handler(needs_upstream=True),
    "facilitator_supported": Handler(),
    "facilitator_verify": Handler(),
    "facilitator_settle": Handler(),
}

SERVICE_GROUP = "service"
INTERNAL_GROUP = "internal"
ALWAYS_ON_GROUPS = (SERVICE_GROUP, INTERNAL_GROUP)
"""Served whatever ROUTE_GROUPS says: health, readiness, catalog, metrics, OpenAPI, and the internal
facilitator (which answers 401 until its secret and wallet are set). Every other group of
routes.yaml is a provider group the operator can switch off."""


def is_provider_group(group: str) -> bool:
    """True for a group of sold routes (a catalog filter, a ROUTE_GROUPS choice)."""
    return group not in ALWAYS_ON_GROUPS
