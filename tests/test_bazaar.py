"""Every paid route is indexable by the x402 Bazaar, as the reference SDK's indexer judges it.

The gateway runs from the packaged route table; each paid route's real 402 is fetched over a
socket, its PAYMENT-REQUIRED header decoded as a client decodes it, and its ``bazaar`` extension
put through the reference validator, the spec check and the extractor a facilitator runs on the
payment the client builds from that 402. An indexer drops a listing whose ``info`` its own
``schema`` refuses, so a route that fails here is a route nobody finds.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from x402.extensions.bazaar import (
    BodyDiscoveryInfo,
    extract_discovery_info,
    validate_and_extract,
    validate_discovery_extension,
    validate_discovery_extension_spec,
)
from x402.http.utils import decode_payment_required_header
from x402.schemas import PaymentPayload, PaymentRequired

from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.routes import RoutesError, RouteSpec, load_routes, named_limits, parse_routes
from gateway.routing.validation import RequestValidator
from gateway.x402.challenge import bazaar_extension
from tests.support.gateway_server import FULL_ENV, RunningGateway, run_gateway

LIMITS = named_limits(Settings(base_url="https://gw.example"))
PAID = [r for r in load_routes(PACKAGED_ROUTES_FILE, LIMITS) if r.access == "exact"]
ADDRESS = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"


def _paid_routes_written_in_the_table() -> int:
    """The paid routes routes.yaml declares, counted from the YAML itself (each template's
    matrices times its methods), so a loader that dropped routes could not shrink the check."""
    doc = yaml.safe_load(PACKAGED_ROUTES_FILE.read_text(encoding="utf-8"))
    routes = sum(1 for r in doc.get("routes") or [] if (r.get("accepts") or [None])[0] == "exact")
    templates = sum(
        len(t["methods"]) * sum(math.prod(len(axis) for axis in m.values()) for m in t["expand"])
        for t in doc.get("templates") or []
        if (t.get("accepts") or [None])[0] == "exact"
    )
    return routes + templates


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(redis_url: str) -> AsyncIterator[RunningGateway]:
    """Every paid route served, the credit top-ups included (credit needs a lasting store)."""
    env = {**FULL_ENV, "CREDITS_ENABLED": "true", "STATE_STORE_REST_URL": redis_url}
    async with run_gateway(env) as running:
        yield running


async def _challenge(http: aiohttp.ClientSession, url: str, method: str) -> str:
    """The PAYMENT-REQUIRED header of the route's 402, as a client without a payment gets it."""
    async with http.request(method, url) as response:
        assert response.status == 402, await response.text()
        return response.headers["payment-required"]


def _schemas(extension: dict[str, Any]) -> tuple[Any, Any]:
    """The input body and output schemas, where the extension's ``schema`` carries them."""
    properties = extension["schema"]["properties"]
    return properties["input"]["properties"]["body"], properties["output"]["properties"]["example"]


def test_every_paid_route_of_the_table_is_checked_here() -> None:
    assert len(PAID) == _paid_routes_written_in_the_table() > 0


async def test_the_served_gateway_sells_exactly_the_checked_routes(gateway: RunningGateway) -> None:
    mounted = [r for r in gateway.services.routes if r.access == "exact"]

    assert sorted(r.name for r in mounted) == sorted(r.name for r in PAID)


@pytest.mark.parametrize("route", PAID, ids=[r.name for r in PAID])
async def test_the_reference_bazaar_indexes_the_paid_route(
    gateway: RunningGateway, http: aiohttp.ClientSession, route: RouteSpec
) -> None:
    url = gateway.url + route.path
    header = await _challenge(http, url, route.method)
    required = decode_payment_required_header(header)
    assert isinstance(required, PaymentRequired)
    assert required.extensions is not None
    extension = required.extensions["bazaar"]
    raw = json.loads(base64.b64decode(header))["extensions"]["bazaar"]

    # The indexer's checks: info against its own schema (no external $ref), and the protocol's.
    checked = validate_and_extract(extension)
    assert (checked.valid, checked.errors) == (True, [])
    assert validate_discovery_extension(raw).errors == []  # the wire dict, before any model drops a field
    assert validate_discovery_extension_spec(extension).errors == []
    assert isinstance(checked.info, BodyDiscoveryInfo)

    # What a facilitator extracts from the payment a client builds from this 402.
    accepted = required.accepts[0]
    payment = PaymentPayload(
        payload={}, accepted=accepted, resource=required.resource, extensions=required.extensions
    )
    found = extract_discovery_info(payment, accepted)
    assert found is not None
    assert (found.x402_version, found.method, found.resource_url) == (2, route.method, url)
    assert found.description == route.description
    assert found.discovery_info == checked.info
    assert found.extensions is not None
    body_schema = route.input.get("body")  # a top-up takes no body: any object is listed
    assert _schemas(found.extensions["bazaar"]) == (body_schema or {"type": "object"}, route.output)

    # The listed example is a call the gateway itself accepts, not just one the schema lets by.
    example = checked.info.input.body
    if body_schema is None:
        assert example == {}
        return
    assert example == body_schema["examples"][0]
    assert RequestValidator(route.input).body(json.dumps(example).encode())


# --- the loader keeps it so: a paid route's listed example must pass its own schema ------------------

BALANCE_PARAMS = {
    "type": "array",
    "minItems": 1,
    "prefixItems": [{"type": "string", "pattern": "^[1-9A-HJ-NP-Za-km-z]{32,44}$"}],
}


def _template(method: dict[str, Any]) -> dict[str, Any]:
    return {
        "upstreams": {"rpc": "RPC_URL"},
        "templates": [
            {
                "name": "rpc.{method}",
                "path": "/rpc/{method}",
                "method": "POST",
                "access": "exact",
                "handler": "jsonrpc",
                "upstream": "rpc",
                "price": 1000,
                "expand": [{"cluster": ["mainnet"]}],
                "methods": {"getBalance": method},
            }
        ],
    }


def _problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(RoutesError) as caught:
        parse_routes(doc, LIMITS)
    return caught.value.problems


def test_a_template_method_example_becomes_the_body_examples_and_the_listed_call() -> None:
    (route,) = parse_routes(_template({"params": BALANCE_PARAMS, "example": [ADDRESS]}), LIMITS)

    call = {"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [ADDRESS]}
    assert route.input["body"]["examples"] == [call]
    assert validate_and_extract(bazaar_extension(route.method, route.input["body"], route.output)).valid


@pytest.mark.parametrize(
    ("method", "refusal"),
    [
        ({"params": BALANCE_PARAMS}, "body.params: must have at least 1 item(s)"),
        ({"params": BALANCE_PARAMS, "example": ["not-an-address"]}, "body.params[0]: "),
    ],
    ids=["no-example", "example-the-schema-refuses"],
)
def test_a_paid_method_whose_example_its_schema_refuses_does_not_load(
    method: dict[str, Any], refusal: str
) -> None:
    (problem,) = _problems(_template(method))

    assert problem.startswith(
        "routes.yaml: templates[0][mainnet/getBalance] (rpc.getBalance).input.body.examples[0]: "
        f"the schema refuses its own example ({refusal}"
    )
    assert "a template method gives its params as `example`" in problem


def _search_route(body: dict[str, Any]) -> dict[str, Any]:
    route = {
        "name": "search",
        "path": "/search",
        "method": "POST",
        "access": "exact",
        "handler": "jsonrpc",
        "upstream": "rpc",
        "price": 1000,
        "input": {"body": body},
    }
    return {"upstreams": {"rpc": "RPC_URL"}, "routes": [route]}


def test_a_paid_route_whose_schema_refuses_an_empty_body_needs_examples() -> None:
    body: dict[str, Any] = {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}

    (problem,) = _problems(_search_route(body))
    (route,) = parse_routes(_search_route({**body, "examples": [{"q": "sol"}]}), LIMITS)

    assert problem.startswith(
        "routes.yaml: routes[0] (search).input.body.examples: a paid route's Bazaar listing needs an "
        "example call its schema accepts (body.q: is required)"
    )
    extension = bazaar_extension(route.method, route.input["body"], route.output)
    assert extension["info"]["input"]["body"] == {"q": "sol"}
    assert validate_and_extract(extension).valid
