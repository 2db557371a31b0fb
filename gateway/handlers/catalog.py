"""``GET /v1/catalog``: the routes this gateway sells, precomputed per provider filter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from gateway import SERVICE_NAME
from gateway.batch.describe import CatalogEndpoint, catalog_endpoint
from gateway.batch.endpoint import BatchEndpoint
from gateway.errors import ErrorCode, GatewayError
from gateway.mcp.meta import MCP_PATH, PAYMENT_META
from gateway.mcp.tools import is_tool
from gateway.methods.credit.sessions import MAX_LIFETIME_S, SESSION_HEADER
from gateway.routing.pricing import (
    CreditTerms,
    FacilitatorFee,
    micro_usdc_string,
    route_price,
    usd_display,
)
from gateway.routing.routes import RouteSpec, accepted, credit_price, provider_groups, published
from gateway.routing.validation import InvalidInput, RequestValidator
from gateway.routing.vocabulary import ACCESS_MODES, CREDIT_METHOD
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes
from gateway.x402.types import SOLANA_MAINNET


class CatalogPrice(msgspec.Struct):
    microUsdc: str
    usd: str


class CatalogPriceParts(msgspec.Struct):
    """The two parts a paid route's price adds up to: the provider's, and the settlement fee of
    the facilitator that settles (none when it pays the Solana fees itself)."""

    provider: CatalogPrice
    settlementFee: CatalogPrice


class CatalogEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    name: str
    path: str
    url: str
    method: str
    access: str
    provider: str
    description: str
    price: CatalogPrice
    priceParts: CatalogPriceParts | None = None
    inputSchema: dict[str, Any]
    outputSchema: dict[str, Any] | None = None
    asset: str | None = None
    network: str | None = None
    payTo: str | None = None
    scheme: str | None = None
    operation: str | None = None
    replayableUpToBytes: int | None = None
    creditPrice: CatalogPrice | None = None
    """What a call takes from prepaid credit instead (signed in), while credit is on."""
    mcpTool: str | None = None
    """The MCP tool that calls this route at the catalog's ``mcp`` endpoint."""


class CatalogMcp(msgspec.Struct):
    """The routes with an ``mcpTool`` are also MCP tools at ``url`` (Streamable HTTP), paid through
    the x402 MCP transport: the payment in the call's ``_meta[paymentMeta]``."""

    url: str
    transport: str = "streamable-http"
    paymentMeta: str = PAYMENT_META


class CatalogCredit(msgspec.Struct):
    """Prepaid credit: bought on the top-up routes, spent by signing in (sign-in-with-x) on any
    route with a ``creditPrice``, or by a credit session's token in ``sessionHeader`` (opened by
    one sign-in, for at most ``sessionMaxSeconds``); it lapses ``lapseDays`` after the wallet's
    last top-up."""

    scheme: str
    lapseDays: int
    sessionHeader: str
    sessionMaxSeconds: int


class Catalog(msgspec.Struct, omit_defaults=True):
    ok: bool
    service: str
    baseUrl: str
    x402Version: int
    routes: list[CatalogEntry]
    credit: CatalogCredit | None = None
    endpoints: list[CatalogEndpoint] | None = None
    """Each provider's JSON-RPC endpoint: one call or a batch of its methods (``gateway.batch``)."""
    mcp: CatalogMcp | None = None


def input_schema(route: RouteSpec) -> dict[str, Any]:
    """The route's declared input as one JSON Schema: an object of path, query and body."""
    return {"type": "object", "properties": dict(route.input), "required": sorted(route.input)}


def _price(micro: int) -> CatalogPrice:
    return CatalogPrice(microUsdc=micro_usdc_string(micro), usd=usd_display(micro))


def catalog_entry(
    route: RouteSpec,
    base_url: str,
    asset: str,
    pay_to: str,
    fee: FacilitatorFee,
    credit: CreditTerms | None = None,
) -> CatalogEntry:
    """``route`` as the catalog lists it, priced through the facilitator charging ``fee`` (and in
    credit, while ``credit`` is on)."""
    price = route_price(route, fee)
    paid = route.paid
    in_credit = credit_price(route) if CREDIT_METHOD in accepted(route, credit is not None) else None
    return CatalogEntry(
        name=route.name,
        path=route.path,
        url=base_url + route.path,
        method=route.method,
        access=route.access,
        provider=route.group,
        description=route.description,
        price=_price(price.total if price is not None else 0),
        priceParts=(
            CatalogPriceParts(provider=_price(price.provider), settlementFee=_price(price.settlement_fee))
            if price is not None
            else None
        ),
        inputSchema=input_schema(route),
        outputSchema=route.output,
        asset=asset if paid else None,
        network=SOLANA_MAINNET if paid else None,
        payTo=pay_to if paid else None,
        scheme=ACCESS_MODES[route.access].scheme,
        operation=route.operation,
        replayableUpToBytes=route.replay_cap_bytes if paid else None,
        creditPrice=_price(in_credit) if in_credit is not None else None,
        mcpTool=route.name if is_tool(route) else None,
    )


class CatalogHandler:
    """Serve the catalog of the mounted, listed routes; ``?provider=`` filters by group.

    The filters are the provider groups of the mounted routes; a group the route's query schema
    accepts but ROUTE_GROUPS switched off lists nothing."""

    def __init__(
        self,
        route: RouteSpec,
        mounted: Sequence[RouteSpec],
        base_url: str,
        asset: str,
        pay_to: str,
        fee: FacilitatorFee,
        credit: CreditTerms | None = None,
        endpoints: Sequence[BatchEndpoint] = (),
    ) -> None:
        self.validator = RequestValidator(route.input)
        described = [catalog_endpoint(e, base_url, fee, credit) for e in endpoints]
        entries = [catalog_entry(r, base_url, asset, pay_to, fee, credit) for r in published(mounted)]
        terms = None
        if credit is not None:
            scheme = ACCESS_MODES[CREDIT_METHOD].scheme or ""
            terms = CatalogCredit(scheme, credit.lapse_days, SESSION_HEADER, MAX_LIFETIME_S)

        mcp = CatalogMcp(base_url + MCP_PATH) if any(e.mcpTool for e in entries) else None

        def body(listed: list[CatalogEntry], group: str | None = None) -> bytes:
            shown = [e for e in described if group is None or e.provider == group] or None
            catalog = Catalog(
                ok=True,
                service=SERVICE_NAME,
                baseUrl=base_url,
                x402Version=2,
                routes=listed,
                credit=terms,
                endpoints=shown if listed else None,
                mcp=mcp,
            )
            return msgspec.json.encode(catalog)

        self.bodies: dict[str | None, bytes] = {None: body(entries)}
        for group in provider_groups(mounted):
            self.bodies[group] = body([e for e in entries if e.provider == group], group)
        self.switched_off = body([])
        self.headers = [JSON_CONTENT_TYPE, (b"cache-control", b"public, max-age=60")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            query = self.validator.query(scope.get("query_string", b""))
        except InvalidInput as exc:
            raise GatewayError(ErrorCode.INVALID_REQUEST, str(exc), {"parameter": exc.where}) from exc
        await send_bytes(send, 200, self.bodies.get(query.get("provider"), self.switched_off), self.headers)
