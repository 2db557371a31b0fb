"""The words a route of routes.yaml is built from, declared once: handlers, access modes, groups,
and what a request on a paid or sign-in route can come to.

The loader refuses a word that is not here (with its YAML location), the app factory holds one
factory per handler and binds each payment method a route accepts, and the catalog, the
OpenAPI document, the metrics, CORS and the CLI describe a route by its access mode's entry, so
they never disagree. A payment method is an access mode of :data:`PAYMENT_METHODS`; its entry here
is what the routing layer knows of it, and :func:`gateway.methods.registry.register` adds it
together with the object that binds it to a route. Provider groups are not listed: they are
whatever groups routes.yaml gives its routes.
"""

from __future__ import annotations

import enum

import msgspec

from gateway.x402.types import SCHEME_EXACT


class Outcome(enum.StrEnum):
    """What a request on a paid or sign-in route came to: the one vocabulary the middlewares set
    and the metrics and logs read, so a misspelt outcome is a type error, never a dropped count.
    A method registered later may declare outcomes of its own (plain strings in its
    :attr:`AccessMode.outcomes`): they are counted like these."""

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
    """A header a way of paying reads (a credential: an OpenAPI parameter) or writes (a receipt)."""

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
    """The headers a client answers its challenge with, first the preferred one (CORS allows
    them, OpenAPI lists them)."""
    receipts: tuple[Credential, ...] = ()
    """The response headers its paid answer carries (CORS exposes them, OpenAPI lists them)."""
    also_allowed: tuple[str, ...] = ()
    """Other request headers a browser may send on its routes (CORS allows them)."""
    outcomes: tuple[str, ...] = ()
    """What a request on a route of this mode can come to (the metrics' series)."""
    usage: tuple[tuple[str, str], ...] = ()
    """The shared store's coarser count of each of its outcomes, (outcome, count): ``unpaid``,
    ``failed``, or what was paid (``paid``, ``credit``, ``signed_in``); an outcome not named here
    (a replay, a pending settlement) adds nothing there."""
    beside_only: bool = False
    """A payment method accepted only beside another (prepaid credit beside ``exact``): it is
    never first in a route's ``accepts``."""
    counts_challenges: bool = True
    """Its unanswered 402s count against the client IP's challenge limit; a sign-in's challenge
    has no side effect (only refused sign-ins count)."""


SIGN_IN = Credential(
    "SIGN-IN-WITH-X", "Signed sign-in-with-x payload (base64 JSON) answering the 402 challenge."
)
CREDIT_SESSION = Credential(
    "X-CREDIT-SESSION",
    "A credit session's token (POST /v1/x402/credits/sessions): spends prepaid credit with no 402 "
    "and no signature, up to the cap its wallet signed, until it expires (at most 1 hour) or is "
    "revoked (DELETE /v1/x402/credits/sessions).",
)

PAYMENT_RESPONSE = Credential("PAYMENT-RESPONSE", "The settlement receipt, base64 JSON.")
X_PAYMENT_RESPONSE = Credential("X-PAYMENT-RESPONSE", "The settlement receipt, base64 JSON (x402 v1).")
CREDIT_BALANCE = Credential(
    "X-Credit-Balance", "The wallet's prepaid credit left after the call, in micro-USDC."
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

EXACT_METHOD = "exact"
"""The payment method of one x402 ``exact`` transfer per call (its scheme: ``SCHEME_EXACT``)."""
CREDIT_METHOD = "credit"
"""The payment method of prepaid credit (in :data:`PAYMENT_METHODS`)."""
SIGN_IN_METHOD = "siwx"
"""Sign-in-with-x at $0.00: the asset-data routes and the credit balance."""

PAYMENT_METHODS: dict[str, AccessMode] = {
    EXACT_METHOD: AccessMode(
        scheme=SCHEME_EXACT,
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
        receipts=(PAYMENT_RESPONSE, X_PAYMENT_RESPONSE),
        # x402 browser clients of old echo the receipt headers: allowed since they were
        also_allowed=(X_PAYMENT_RESPONSE.header, PAYMENT_RESPONSE.header),
        outcomes=EXACT_OUTCOMES,
        usage=(
            (Outcome.CHALLENGED, "unpaid"),
            (Outcome.REJECTED, "failed"),
            (Outcome.PAID, "paid"),
            (Outcome.SETTLE_FAILED, "failed"),
            (Outcome.UPSTREAM_FAILED, "failed"),
        ),
    ),
    CREDIT_METHOD: AccessMode(
        scheme="sign-in-with-x",
        rate_limit_per=("scope", "wallet", "ip"),
        error_statuses=(400, 402, 405, 409, 413, 429, 502, 503, 504),
        sells=True,
        credentials=(SIGN_IN, CREDIT_SESSION),
        receipts=(CREDIT_BALANCE,),
        outcomes=(
            Outcome.REJECTED,
            Outcome.CREDIT_UNCOVERED,
            Outcome.REPLAYED,
            Outcome.CREDIT_SPENT,
            Outcome.UPSTREAM_FAILED,
        ),
        # a sign-in that found too little credit was answered with the route's 402: unpaid
        usage=(
            (Outcome.REJECTED, "failed"),
            (Outcome.CREDIT_UNCOVERED, "unpaid"),
            (Outcome.CREDIT_SPENT, "credit"),
            (Outcome.UPSTREAM_FAILED, "failed"),
        ),
        beside_only=True,
    ),
    SIGN_IN_METHOD: AccessMode(
        scheme="sign-in-with-x",
        rate_limit_per=("scope", "wallet", "ip"),
        required_per=("ip", "wallet"),
        error_statuses=(400, 402, 404, 405, 413, 429, 502, 503, 504),
        sells=True,
        credentials=(SIGN_IN,),
        outcomes=(Outcome.CHALLENGED, Outcome.REFUSED, Outcome.SIGNED_IN, Outcome.UPSTREAM_FAILED),
        usage=(
            (Outcome.CHALLENGED, "unpaid"),
            (Outcome.REFUSED, "failed"),
            (Outcome.SIGNED_IN, "signed_in"),
            (Outcome.UPSTREAM_FAILED, "failed"),
        ),
        counts_challenges=False,
    ),
}
"""The ways of paying a route: each one access mode, bound to a route by its registered method
(:mod:`gateway.methods.registry`). ``siwx`` is sign-in-with-x at a price of $0.00: a wallet
signs in and reads, nothing is paid or taken. ``credit`` (prepaid credit spent by signing in)
is accepted beside ``exact`` where a route lists it, while credit is on (``CREDITS_ENABLED``)."""


ACCESS_MODES: dict[str, AccessMode] = {
    "public": AccessMode(rate_limit_per=("scope",), error_statuses=(405,)),
    **PAYMENT_METHODS,
    # Answers only to its shared secret: no limiter, no CORS, never published.
    "internal": AccessMode(published=False, from_browsers=False),
}


def register_payment_method(name: str, mode: AccessMode) -> None:
    """Add a way of paying to the words routes.yaml may use (through
    :func:`gateway.methods.registry.register`, which also keeps the object that binds it)."""
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
