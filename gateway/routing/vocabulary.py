"""The words a route of routes.yaml is built from, declared once: handlers, access modes, groups,
and what a request on a paid or sign-in route can come to.

The loader refuses a word that is not here (with its YAML location), the app factory holds one
factory per handler and builds each access mode's layers from its entry, and the catalog, the
OpenAPI document, the metrics and the CLI describe a route by its access mode's entry, so they
never disagree. A payment method is an access mode whose entry names the module that binds it to
a route (:data:`PAYMENT_METHODS`): registering one here is all the rest needs to know of it.
Provider groups are not listed: they are whatever groups routes.yaml gives its routes.
"""

from __future__ import annotations

import enum

import msgspec


class Outcome(enum.StrEnum):
    """What a request on a paid or sign-in route came to: the one vocabulary the middlewares set
    and the metrics and logs read, so a misspelt outcome is a type error, never a dropped count."""

    NONE = "-"
    CHALLENGED = "challenged"
    REJECTED = "rejected"
    REPLAYED = "replayed"
    PAID = "paid"
    SETTLEMENT_PENDING = "settlement_pending"
    SETTLE_FAILED = "settle_failed"
    UPSTREAM_FAILED = "upstream_failed"
    REFUSED = "refused"
    SIGNED_IN = "signed_in"
    CREDIT_SPENT = "credit_spent"
    CREDIT_UNCOVERED = "no_credit"
    """A sign-in probing for credit found too little: the client pays per call instead. Not a
    failed payment: nothing was offered that could have paid."""


class Credential(msgspec.Struct, frozen=True):
    """A request header that carries a credential of an access mode (an OpenAPI parameter)."""

    header: str
    description: str


class AccessMode(msgspec.Struct, frozen=True, kw_only=True):
    """How a route is reached, and what that promises to a client."""

    scheme: str | None = None
    """The payment scheme its challenge names (catalog ``scheme``, OpenAPI ``x-x402``)."""
    rate_limit_per: tuple[str, ...] = ()
    """The ``per`` keys of ``rate_limits`` its middleware can enforce (none: it runs no limiter)."""
    required_per: tuple[str, ...] = ()
    """The ``per`` keys of ``rate_limits`` every route of this mode must declare: its requests
    are free to make (a throwaway key signs in for nothing), so only a client's own limits bound
    what a flood of them costs and stores."""
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
    paid: bool = False
    """Sold for USDC on Solana to the operator's wallet: its routes carry a price, need a
    facilitator and the pay-to wallet, and count revenue."""
    credentials: tuple[Credential, ...] = ()
    """The headers a client answers its challenge with, first the preferred one."""
    outcomes: tuple[Outcome, ...] = ()
    """What a request on a route of this mode can come to (the metrics' series)."""
    binder: str | None = None
    """A payment method's ``module:function`` that binds it to one route (a
    :class:`gateway.methods.RouteMethod`); the built-in modes have their layers in the app."""
    beside_only: bool = False
    """A payment method accepted only beside a route's own (prepaid credit beside ``exact``):
    routes.yaml cannot name it as a route's access."""


SIGN_IN = Credential(
    "SIGN-IN-WITH-X", "Signed sign-in-with-x payload (base64 JSON) answering the 402 challenge."
)
CREDIT_SESSION = Credential(
    "X-CREDIT-SESSION",
    "A credit session's token (POST /v1/x402/credits/sessions): spends prepaid credit with no 402 "
    "and no signature, up to the cap its wallet signed, until it expires (at most 1 hour) or is "
    "revoked (DELETE /v1/x402/credits/sessions).",
)

EXACT_OUTCOMES = (
    Outcome.CHALLENGED,
    Outcome.REJECTED,
    Outcome.REPLAYED,
    Outcome.PAID,
    Outcome.SETTLEMENT_PENDING,
    Outcome.SETTLE_FAILED,
    Outcome.UPSTREAM_FAILED,
)

PAYMENT_METHODS: dict[str, AccessMode] = {
    "exact": AccessMode(
        scheme="exact",
        rate_limit_per=("scope", "wallet", "ip"),
        error_statuses=(400, 402, 405, 409, 413, 429, 502, 503, 504),
        sells=True,
        paid=True,
        credentials=(
            Credential(
                "PAYMENT-SIGNATURE", "x402 v2 payment payload (base64 JSON) answering the 402 challenge."
            ),
            Credential("X-PAYMENT", "x402 v1 payment payload (base64 JSON)."),
        ),
        outcomes=EXACT_OUTCOMES,
        binder="gateway.methods.exact.method:bind",
    ),
    "credit": AccessMode(
        scheme="sign-in-with-x",
        rate_limit_per=("scope", "wallet", "ip"),
        error_statuses=(400, 402, 405, 409, 413, 429, 502, 503, 504),
        sells=True,
        credentials=(SIGN_IN, CREDIT_SESSION),
        outcomes=(
            Outcome.REJECTED,
            Outcome.CREDIT_UNCOVERED,
            Outcome.REPLAYED,
            Outcome.CREDIT_SPENT,
            Outcome.UPSTREAM_FAILED,
        ),
        binder="gateway.methods.credit.method:bind",
        beside_only=True,
    ),
}
"""The ways of paying a route: each one access mode, bound to a route by its ``binder``. ``credit``
(prepaid credit spent by signing in) is also accepted beside ``exact`` on every paid route while
credit is on (``CREDITS_ENABLED``)."""


ACCESS_MODES: dict[str, AccessMode] = {
    "public": AccessMode(rate_limit_per=("scope",), error_statuses=(405,)),
    **PAYMENT_METHODS,
    "siwx": AccessMode(
        scheme="sign-in-with-x",
        rate_limit_per=("scope", "wallet", "ip"),
        required_per=("ip", "wallet"),
        error_statuses=(400, 402, 404, 405, 413, 429, 502, 503, 504),
        sells=True,
        credentials=(SIGN_IN,),
        outcomes=(Outcome.CHALLENGED, Outcome.REFUSED, Outcome.SIGNED_IN, Outcome.UPSTREAM_FAILED),
    ),
    # Answers only to its shared secret: no limiter, no CORS, never published.
    "internal": AccessMode(published=False, from_browsers=False),
}


def register_payment_method(name: str, mode: AccessMode) -> None:
    """Add a way of paying (a test's own, say) to the words routes.yaml may use."""
    assert mode.binder is not None, "a payment method names its binder"
    assert name not in ACCESS_MODES or ACCESS_MODES[name] == mode, f"access mode {name!r} exists"
    PAYMENT_METHODS[name] = ACCESS_MODES[name] = mode


def unregister_payment_method(name: str) -> None:
    PAYMENT_METHODS.pop(name, None)
    ACCESS_MODES.pop(name, None)


class Handler(msgspec.Struct, frozen=True, kw_only=True):
    """What answers a route once its access mode let the request through."""

    needs_upstream: bool = False
    """A route with this handler must name an ``upstream`` (it forwards there)."""
    sells_credit: bool = False
    """Its paid answer is prepaid credit worth its price: no settlement fee is added to the price,
    and the credit is booked atomically with the payment's delivery."""
    credentials: tuple[Credential, ...] = ()
    """Credential headers the handler itself reads (the OpenAPI document lists them)."""
    error_statuses: tuple[int, ...] = ()
    """Statuses other than 200 the handler itself answers, beyond its access mode's."""


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
    "credit_top_up": Handler(sells_credit=True),
    "credit_balance": Handler(),
    "credit_session_open": Handler(),
    "credit_session_revoke": Handler(credentials=(CREDIT_SESSION,), error_statuses=(400, 404, 429, 503)),
}

CREDIT_METHOD = "credit"
"""The payment method of prepaid credit (in :data:`PAYMENT_METHODS`)."""
CREDITS_GROUP = "credits"
"""The top-up and balance routes: served only while credit is on (``CREDITS_ENABLED``)."""
SERVICE_GROUP = "service"
INTERNAL_GROUP = "internal"
ALWAYS_ON_GROUPS = (SERVICE_GROUP, INTERNAL_GROUP)
"""Served whatever ROUTE_GROUPS says: health, readiness, catalog, metrics, OpenAPI, and the internal
facilitator (which answers 401 until its secret and wallet are set). Every other group of
routes.yaml is a provider group the operator can switch off."""


def is_provider_group(group: str) -> bool:
    """True for a group of sold routes (a catalog filter, a ROUTE_GROUPS choice)."""
    return group not in ALWAYS_ON_GROUPS
