"""One MCP tool per sellable route, generated from the route table.

A JSON-RPC route (a provider's method) becomes a tool taking that method's ``params``; an
asset-data route one taking its ``path``, ``query`` and ``body`` inputs, each under its own name
with the route's own schema. The description carries the price the 402 asks for; the output
schema is the route's. :meth:`RouteTool.request` turns a call's arguments back into the HTTP
request the route serves, byte for byte the same for the same arguments (an identical retry is
answered again, never charged twice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import msgspec

from gateway.routing.pricing import CreditTerms, FacilitatorFee, route_price, usd_display
from gateway.routing.routes import RouteSpec, accepted, credit_price
from gateway.routing.vocabulary import CREDIT_METHOD

TOOL_HANDLERS = ("jsonrpc", "tokens")
"""The handlers whose routes are tools: a provider's JSON-RPC methods and the asset data (the
service, credit and internal routes are not data an agent calls for)."""

_ANY_OUTPUT: dict[str, Any] = {"type": "object"}
_encode = msgspec.json.Encoder(order="sorted").encode


class ToolRequest(msgspec.Struct, frozen=True):
    """The HTTP request a tool call is: what the route's pipeline is given."""

    method: str
    path: str
    query: bytes
    body: bytes


class ToolPrice(msgspec.Struct, frozen=True, omit_defaults=True):
    """A tool's price as its listing's ``_meta["x402-gateway/price"]`` states it (micro-USDC, as
    strings like every x402 amount): what a client may hold against its spending cap before it
    calls. Unset where nothing is paid (a sign-in route)."""

    microUsdc: str
    creditMicroUsdc: str | None = None
    """What a call takes from prepaid credit instead, where the route takes credit."""


class RouteTool(msgspec.Struct, frozen=True):
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    route: RouteSpec
    price: ToolPrice | None = None

    def request(self, arguments: Mapping[str, Any]) -> ToolRequest:
        """The route's request for ``arguments`` (already checked against the input schema; the
        route's own validation still decides, exactly as for HTTP)."""
        route = self.route
        if route.handler == "jsonrpc":
            params = arguments.get("params")
            envelope = {"jsonrpc": "2.0", "id": 1, "method": route.operation, "params": params}
            return ToolRequest(route.method, route.path, b"", _encode(envelope))
        path = route.path
        for name, value in dict(arguments.get("path") or {}).items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        query = urlencode(sorted((k, _query_value(v)) for k, v in dict(arguments.get("query") or {}).items()))
        body = _encode(arguments["body"]) if "body" in arguments else b""
        return ToolRequest(route.method, path, query.encode(), body)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def route_tools(
    routes: Sequence[RouteSpec], fee: FacilitatorFee, credit: CreditTerms | None
) -> list[RouteTool]:
    """The tools of the served routes that sell data (listed routes of :data:`TOOL_HANDLERS`)."""
    return [
        RouteTool(
            name=route.name,
            description=_description(route, fee, credit),
            input_schema=_input_schema(route),
            output_schema=route.output or _ANY_OUTPUT,
            route=route,
            price=_price(route, fee, credit),
        )
        for route in routes
        if is_tool(route)
    ]


def is_tool(route: RouteSpec) -> bool:
    """A listed route of :data:`TOOL_HANDLERS` (when served) is an MCP tool."""
    return route.handler in TOOL_HANDLERS and route.listed


def _price(route: RouteSpec, fee: FacilitatorFee, credit: CreditTerms | None) -> ToolPrice | None:
    price = route_price(route, fee)
    if price is None:
        return None
    taken = credit_price(route)
    on_credit = taken is not None and CREDIT_METHOD in accepted(route, credit is not None)
    return ToolPrice(str(price.total), str(taken) if on_credit else None)


def _description(route: RouteSpec, fee: FacilitatorFee, credit: CreditTerms | None) -> str:
    price = _price(route, fee, credit)
    if price is None:
        return f"{route.description} Free with a sign-in-with-x (no payment)."
    text = (
        f"{route.description} Price: {usd_display(int(price.microUsdc))} USDC per call (x402 exact, Solana)"
    )
    if price.creditMicroUsdc is not None:
        text += f", or {usd_display(int(price.creditMicroUsdc))} from prepaid credit"
    return text + "."


def _input_schema(route: RouteSpec) -> dict[str, Any]:
    if route.handler == "jsonrpc":
        body = route.input.get("body", {})
        params = body.get("properties", {}).get("params", {})
        schema: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "required": ["params"] if "params" in body.get("required", ()) else [],
            "properties": {"params": params},
        }
        examples = [{"params": e["params"]} for e in body.get("examples", ()) if "params" in e]
        if examples:
            schema["examples"] = examples
        return schema
    locations = {where: schema for where, schema in route.input.items() if schema}
    needed = [where for where, schema in locations.items() if where == "path" or schema.get("required")]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": needed,
        "properties": locations,
    }
