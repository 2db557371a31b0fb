"""A provider's JSON-RPC endpoint, derived from the packaged routes.yaml: which endpoints exist,
how a body is parsed into calls (each by its method's own rules) and what route a request
becomes (its price, credit price and limits). The served behaviour, money included, is in
tests/adversarial/test_rpc_batch_served.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.batch.endpoint import BatchEndpoint, batch_endpoints
from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.pricing import FacilitatorFee, batch_price, route_price
from gateway.routing.routes import load_routes, named_limits
from gateway.routing.validation import InvalidInput

ROUTES = load_routes(PACKAGED_ROUTES_FILE, named_limits(Settings(base_url="https://gw.example.com")))
ENDPOINTS = {e.path: e for e in batch_endpoints(ROUTES, 20)}
RPC = "/v1/x402/solana/mainnet/provider_a/rpc"
DAS = "/v1/x402/solana/mainnet/provider_b/das"
ACCOUNT = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
INTERNAL = FacilitatorFee(internal=True)


def body(*calls: dict[str, Any]) -> bytes:
    return json.dumps(list(calls)).encode()


def call(method: str, params: Any, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def test_one_endpoint_per_provider_cluster_and_kind_the_table_sells() -> None:
    per_method = {r.path.rsplit("/", 1)[0] for r in ROUTES if r.handler == "jsonrpc"}

    assert set(ENDPOINTS) == per_method
    assert len(ENDPOINTS) == 4 + 3  # rpc on 2 clusters x 2 providers; das on 3 provider-clusters
    rpc = ENDPOINTS[RPC]
    assert rpc.name == "solana.mainnet.provider_a.rpc"
    assert "getAsset" not in rpc.methods and "getAsset" in ENDPOINTS[DAS].methods
    assert rpc.template.upstream == "provider_a_mainnet" and rpc.template.accepts == ("exact", "credit")


def test_a_batch_is_priced_as_its_calls_provider_parts_plus_one_settlement_fee() -> None:
    rpc = ENDPOINTS[RPC]
    batch = rpc.parse(
        body(call("getBalance", [ACCOUNT]), call("getTransaction", ["5" * 88]), call("getBalance", [ACCOUNT]))
    )

    priced = rpc.priced(batch)
    by_method = {r.operation: r for r in rpc.routes}
    alone = [by_method["getBalance"], by_method["getTransaction"], by_method["getBalance"]]

    assert (batch.provider_price, batch.credit_prices) == (5 + 18 + 5, (5, 18, 5))
    assert route_price(priced, INTERNAL) == batch_price(alone, INTERNAL)
    price = route_price(priced, INTERNAL)
    assert price is not None and (price.provider, price.settlement_fee) == (28, 2200)
    assert priced.credit_price_micro_usdc == 28
    # Each call's limits once per call: the buckets count calls, not requests.
    assert priced.rate_limits == by_method["getBalance"].rate_limits * 3
    assert batch.key == ("getBalance", "getBalance", "getTransaction")


def test_a_lone_call_is_answered_as_one_and_its_fields_named_as_on_its_route() -> None:
    rpc = ENDPOINTS[RPC]

    batch = rpc.parse(json.dumps(call("getBalance", [ACCOUNT], "a")).encode())
    with pytest.raises(InvalidInput) as bad:
        rpc.parse(json.dumps(call("getBalance", ["nope"])).encode())

    assert batch.single and [(c.method, c.id, c.params) for c in batch.calls] == [
        ("getBalance", "a", [ACCOUNT])
    ]
    assert bad.value.where == "params[0]"


def test_unset_options_sent_as_null_are_left_out_and_das_params_are_named() -> None:
    config = {"commitment": "finalized", "minContextSlot": None}
    batch = ENDPOINTS[RPC].parse(body(call("getBalance", [ACCOUNT, config])))
    das = ENDPOINTS[DAS].parse(body(call("getAsset", [ACCOUNT]), call("getAsset", {"id": ACCOUNT})))

    assert batch.calls[0].params == [ACCOUNT, {"commitment": "finalized"}]
    assert das.calls[0].params == das.calls[1].params
    assert isinstance(das.calls[0].params, dict) and das.calls[0].params["id"] == ACCOUNT


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"", "body"),
        (b"{", "body"),
        (b"7", "body"),
        (b"[]", "body"),
        (body(*[call("getBalance", [ACCOUNT])] * 21), "body"),
        (body(call("getBalance", [ACCOUNT]), call("getAsset", [ACCOUNT])), "body[1].method"),
        (body(call("getBalance", [ACCOUNT]), {"id": 1}), "body[1].method"),
        (body(call("getBalance", [ACCOUNT]), [1]), "body[1]"),
        (
            body(call("getBalance", [ACCOUNT]), call("getBalance", [ACCOUNT, {"commitment": "soon"}])),
            "body[1].params[1].commitment",
        ),
    ],
)
def test_a_body_not_sold_here_is_refused_naming_where(raw: bytes, where: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        ENDPOINTS[RPC].parse(raw)

    assert refused.value.where == where
    assert str(refused.value).startswith(f"{where}: ")


def test_the_most_calls_a_request_may_carry_is_the_setting() -> None:
    small = BatchEndpoint(ENDPOINTS[RPC].routes, 2)

    with pytest.raises(InvalidInput, match="at most 2 calls, got 3"):
        small.parse(body(*[call("getBalance", [ACCOUNT])] * 3))
    assert len(small.parse(body(*[call("getBalance", [ACCOUNT])] * 2)).calls) == 2
    assert Settings(base_url="https://gw.example.com").rpc_batch_max_items == 20
