"""How the catalog and the OpenAPI document describe a provider's JSON-RPC endpoint: its methods,
each with its provider part and credit price, and how a batch of them is priced (the sum of the
calls' provider parts plus one settlement fee of the facilitator that settles it)."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.batch.endpoint import BatchEndpoint
from gateway.routing.pricing import CreditTerms, FacilitatorFee, micro_usdc_string, route_price, usd_display
from gateway.routing.routes import accepted, credit_price
from gateway.routing.vocabulary import CREDIT_METHOD

PRICING = (
    "One payment per request: the sum of its calls' provider parts plus one settlement fee of the "
    "facilitator that settles it. On prepaid credit, each call's credit price is held, the answered "
    "calls' taken and the failed calls' released."
)


class EndpointPrice(msgspec.Struct):
    microUsdc: str
    usd: str


class EndpointMethod(msgspec.Struct, omit_defaults=True):
    """One method a call may name: its provider part (added up per call) and its credit price."""

    operationId: str
    """The per-method route selling the same call alone."""
    provider: EndpointPrice
    creditPrice: EndpointPrice | None = None


class CatalogEndpoint(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A provider's JSON-RPC endpoint as the catalog lists it."""

    name: str
    path: str
    url: str
    method: str
    provider: str
    description: str
    maxCalls: int
    pricing: str
    settlementFee: EndpointPrice
    methods: dict[str, EndpointMethod]


def _price(micro: int) -> EndpointPrice:
    return EndpointPrice(micro_usdc_string(micro), usd_display(micro))


def _methods(endpoint: BatchEndpoint, credit: CreditTerms | None) -> dict[str, EndpointMethod]:
    methods: dict[str, EndpointMethod] = {}
    for route in endpoint.routes:
        in_credit = credit_price(route) if CREDIT_METHOD in accepted(route, credit is not None) else None
        methods[route.operation or ""] = EndpointMethod(
            operationId=route.name,
            provider=_price(route.provider_price_micro_usdc or 0),
            creditPrice=_price(in_credit) if in_credit is not None else None,
        )
    return methods


def _fee(endpoint: BatchEndpoint, fee: FacilitatorFee) -> int:
    price = route_price(endpoint.routes[0], fee)
    return price.settlement_fee if price is not None else 0


def catalog_endpoint(
    endpoint: BatchEndpoint, base_url: str, fee: FacilitatorFee, credit: CreditTerms | None
) -> CatalogEndpoint:
    template = endpoint.template
    return CatalogEndpoint(
        name=endpoint.name,
        path=endpoint.path,
        url=base_url + endpoint.path,
        method=template.method,
        provider=template.group,
        description=template.description,
        maxCalls=endpoint.max_items,
        pricing=PRICING,
        settlementFee=_price(_fee(endpoint, fee)),
        methods=_methods(endpoint, credit),
    )


def openapi_operation(
    endpoint: BatchEndpoint, fee: FacilitatorFee, credit: CreditTerms | None
) -> dict[str, Any]:
    """The endpoint's POST operation: one call or a batch in, per-call answers out, its prices."""
    names = sorted(endpoint.methods)
    one_call = {
        "type": "object",
        "required": ["jsonrpc", "method", "params"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {"type": ["string", "integer", "null"]},
            "method": {"enum": names, "description": "its params follow the method's own operation"},
            "params": {},
        },
    }
    answer = {
        "type": "object",
        "required": ["jsonrpc", "id"],
        "properties": {"jsonrpc": {"const": "2.0"}, "id": {}, "result": {}, "error": {"type": "object"}},
    }

    discovery = endpoint.template.input["body"]
    body_schema: dict[str, Any] = {
        "oneOf": [
            one_call,
            {"type": "array", "minItems": 1, "maxItems": endpoint.max_items, "items": one_call},
        ]
    }
    if "examples" in discovery:
        body_schema["examples"] = discovery["examples"]

    def error(description: str) -> dict[str, Any]:
        schema = {"$ref": "#/components/schemas/Error"}
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    return {
        "operationId": endpoint.name,
        "summary": endpoint.template.description,
        "tags": [endpoint.template.group],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body_schema}}},
        "responses": {
            "200": {
                "description": "every call's answer, in order (one answer for one call); on credit a "
                "failed call's answer is its error, and nothing was taken for it",
                "content": {
                    "application/json": {"schema": {"oneOf": [answer, {"type": "array", "items": answer}]}}
                },
            },
            "400": error(
                "a call is not one sold here, or breaks its method's rules; details.parameter names it"
            ),
            "402": {
                "description": "payment required: the 402 is priced for this body",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PaymentRequired"}}},
            },
            "429": error("a limit refused it: the limits count calls, not requests"),
            "502": error(
                "the provider failed a call (details.failed names each); nothing was charged for it"
            ),
            "503": error("the store or the facilitator is unavailable; nothing was charged"),
            "504": error("the provider timed out; nothing was charged"),
        },
        "x-x402": {
            "pricing": PRICING,
            "maxCalls": endpoint.max_items,
            "settlementFee": msgspec.to_builtins(_price(_fee(endpoint, fee))),
            "methods": msgspec.to_builtins(_methods(endpoint, credit)),
        },
    }
