"""routes.yaml -> an OpenAPI 3.1 document of the routes this gateway serves.

Built once at start-up from the mounted, listed, non-internal routes (the same set the catalog
lists), from the same declarations that feed the validators and the catalog: a route's
``input.path`` and ``input.query`` properties become parameters, ``input.body`` the JSON request
body and ``output`` the 200 schema. Our own schema keywords (``x-comma-list``,
``x-combined-count``, ``x-not-less-than``) are extensions, which OpenAPI 3.1 schemas allow.

Errors use the one error shape (``#/components/schemas/Error``); a 402 carries the x402 challenge
(``#/components/schemas/PaymentRequired``) and its base64 copy in ``PAYMENT-REQUIRED``. The
credential headers are optional header parameters, so a client (or a fuzzer) sees exactly which
header each route reads; prices (and a paid price's parts) and payment terms are in each
operation's ``x-x402``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway import SERVICE_NAME, __version__
from gateway.errors import ErrorCode
from gateway.routing.pricing import (
    CreditTerms,
    FacilitatorFee,
    micro_usdc_string,
    route_price,
    usd_display,
)
from gateway.routing.routes import RouteSpec, accepted, credit_price, published
from gateway.routing.vocabulary import ACCESS_MODES, CREDIT_METHOD, HANDLERS, Credential
from gateway.x402.types import SOLANA_MAINNET

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"

_ERROR_RESPONSES: dict[int, str] = {
    400: "Invalid path, query or body (the one error shape, `invalid_request`).",
    404: "No such resource.",
    405: "Method not allowed; `Allow` lists the methods of the path.",
    409: (
        "The payment identifier was used with another payment or request (`idempotency_conflict`),"
        " or a call on credit is retried while it is still answered (`call_in_progress`)."
    ),
    413: "Request body over the size limit.",
    429: "Rate limit exceeded; see `Retry-After`.",
    502: "The upstream failed or answered unusably; nothing was charged.",
    503: "The state store or the payment facilitator is unavailable; nothing was charged.",
    504: "The upstream did not answer in time; nothing was charged.",
}
# Rules across query parameters, which OpenAPI cannot attach to one parameter: published as is.
_QUERY_RULES = ("oneOf", "anyOf", "x-combined-count", "x-not-less-than")


def _credential_name(credential: Credential) -> str:
    """The component name of a credential header: ``PAYMENT-SIGNATURE`` -> ``PaymentSignature``."""
    return "".join(part.capitalize() for part in credential.header.split("-"))


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _components() -> dict[str, Any]:
    error = {
        "type": "object",
        "description": "The one error shape of the gateway.",
        "required": ["ok", "error"],
        "properties": {
            "ok": {"type": "boolean", "const": False},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": [code.value for code in ErrorCode]},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            },
        },
    }
    payment_required = {
        "type": "object",
        "description": "x402 v2 challenge: what to pay (exact) or sign (sign-in-with-x); "
        "`error` names why a credential was refused.",
        "required": ["x402Version", "accepts"],
        "properties": {
            "x402Version": {"type": "integer"},
            "resource": {"type": "object"},
            "accepts": {"type": "array", "items": {"type": "object"}},
            "error": {"type": "string"},
            "extensions": {"type": "object"},
        },
    }
    base64_json = {"type": "string", "description": "base64 of UTF-8 JSON"}
    headers = {
        "PaymentRequired": {
            "description": "The challenge of the body, base64 JSON (x402 v2).",
            "required": True,
            "schema": base64_json,
        },
        "PaymentResponse": {
            "description": "The settlement receipt, base64 JSON.",
            "schema": base64_json,
        },
        "RetryAfter": {"description": "Seconds to wait.", "schema": {"type": "string"}},
    }
    parameters = {
        _credential_name(credential): _header_param(credential.header, credential.description)
        for mode in ACCESS_MODES.values()
        for credential in mode.credentials
    }
    return {
        "schemas": {"Error": error, "PaymentRequired": payment_required},
        "headers": headers,
        "parameters": parameters,
    }


def _header_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }


def _credentials(route: RouteSpec, credit: CreditTerms | None) -> tuple[Credential, ...]:
    """The credential headers ``route`` answers to: its access mode's and its handler's, then
    those of every other method it accepts (credit only while it is on)."""
    own = (*ACCESS_MODES[route.access].credentials, *HANDLERS[route.handler].credentials)
    others = accepted(route, credit is not None)[1:]
    return (*own, *(c for method in others for c in ACCESS_MODES[method].credentials))


def _parameters(route: RouteSpec, credit: CreditTerms | None = None) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    path_schema = route.input.get("path") or {}
    path_props: dict[str, Any] = dict(path_schema.get("properties") or {})
    for name in _path_names(route.path):
        params.append(
            {"name": name, "in": "path", "required": True, "schema": path_props.get(name, {"type": "string"})}
        )
    query = route.input.get("query") or {}
    required = set(query.get("required") or ())
    for name, schema in (query.get("properties") or {}).items():
        params.append({"name": name, "in": "query", "required": name in required, "schema": schema})
    params.extend(_ref("parameters", _credential_name(c)) for c in _credentials(route, credit))
    return params


def _path_names(path: str) -> list[str]:
    return [piece.partition("}")[0] for piece in path.split("{")[1:]]


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _ERROR_RESPONSES[status],
        "content": {JSON: {"schema": _ref("schemas", "Error")}},
    }
    if status == 429:
        response["headers"] = {"Retry-After": _ref("headers", "RetryAfter")}
    return response


def _receipt(receipt: Credential) -> dict[str, Any]:
    """A receipt header of a paid answer: x402's settlement receipt by reference, others inline."""
    if receipt.header.removeprefix("X-") == "PAYMENT-RESPONSE":
        return _ref("headers", "PaymentResponse")
    return {"description": receipt.description, "schema": {"type": "string"}}


def _responses(route: RouteSpec) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "Success.", "content": {JSON: {"schema": route.output or {}}}}
    receipts = ACCESS_MODES[route.access].receipts
    if receipts:
        ok["headers"] = {r.header: _receipt(r) for r in receipts}
    statuses = {*ACCESS_MODES[route.access].error_statuses, *HANDLERS[route.handler].error_statuses}
    if route.input:
        statuses.add(400)
    if route.rate_limits:
        statuses.add(429)
    responses: dict[str, Any] = {"200": ok}
    for status in sorted(statuses):
        if status == 402:
            responses["402"] = {
                "description": "Payment or sign-in required, or the credential was refused "
                "(`error` says why); a fresh challenge to answer.",
                "headers": {"PAYMENT-REQUIRED": _ref("headers", "PaymentRequired")},
                "content": {JSON: {"schema": _ref("schemas", "PaymentRequired")}},
            }
        else:
            responses[str(status)] = _error_response(status)
    return responses


def _price(micro: int) -> dict[str, str]:
    return {"microUsdc": micro_usdc_string(micro), "usd": usd_display(micro)}


def _x402(
    route: RouteSpec, asset: str, pay_to: str, fee: FacilitatorFee, credit: CreditTerms | None
) -> dict[str, Any] | None:
    scheme = ACCESS_MODES[route.access].scheme
    price = route_price(route, fee)
    if route.paid and price is not None:
        described: dict[str, Any] = {
            "scheme": scheme,
            "network": SOLANA_MAINNET,
            "asset": asset,
            "payTo": pay_to,
            "price": _price(price.total),
            "priceParts": {"provider": _price(price.provider), "settlementFee": _price(price.settlement_fee)},
        }
        if HANDLERS[route.handler].sells_credit and route.provider_price_micro_usdc is not None:
            described["buysCredit"] = _price(route.provider_price_micro_usdc)  # a purchase, not a call
        in_credit = credit_price(route) if CREDIT_METHOD in accepted(route, credit is not None) else None
        if credit is not None and in_credit is not None:
            described["creditPrice"] = _price(in_credit)
            described["creditLapseDays"] = credit.lapse_days
        return described
    if scheme is not None:  # sign-in: free
        return {"scheme": scheme, "price": _price(0)}
    return None


def _operation(
    route: RouteSpec, asset: str, pay_to: str, fee: FacilitatorFee, credit: CreditTerms | None
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.description,
        "tags": [route.group],
    }
    parameters = _parameters(route, credit)
    if parameters:
        operation["parameters"] = parameters
    if "body" in route.input:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": route.input["body"]}}}
    rules = {k: v for k, v in (route.input.get("query") or {}).items() if k in _QUERY_RULES}
    if rules:
        operation["x-query-rules"] = rules
    operation["responses"] = _responses(route)
    x402 = _x402(route, asset, pay_to, fee, credit)
    if x402 is not None:
        operation["x-x402"] = x402
    return operation


def build_openapi(
    routes: Iterable[RouteSpec],
    base_url: str,
    asset: str,
    pay_to: str,
    fee: FacilitatorFee,
    credit: CreditTerms | None = None,
    extra: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (pass the mounted ones), served from ``base_url``,
    priced through the facilitator charging the settlement fee ``fee`` (and in credit, while
    ``credit`` is on); ``extra`` adds operations described elsewhere (path -> method -> operation)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in published(routes):
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, asset, pay_to, fee, credit)
    for path, operations in (extra or {}).items():
        paths.setdefault(path, {}).update(operations)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": SERVICE_NAME,
            "version": __version__,
            "description": "Solana RPC, DAS and asset data sold per request over the x402 payment "
            "protocol (exact payments in USDC on Solana, or sign-in-with-x).",
        },
        "servers": [{"url": base_url}],
        "paths": paths,
        "components": _components(),
    }
