"""routes.yaml: template expansion, the price derivation, and load errors that name their YAML location."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest

from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.plan import route_plan
from gateway.routing.pricing import FacilitatorFee, RoutePrice, route_price
from gateway.routing.routes import (
    InternalSettlement,
    RoutesError,
    RouteSpec,
    load_routes,
    named_limits,
    parse_routes,
    payment_methods,
)
from gateway.routing.vocabulary import HANDLERS
from gateway.x402.challenge import ExactChallenge
from gateway.x402.types import SOLANA_MAINNET, USDC_MAINNET_MINT, PaymentRequirements
from tests.support.log_capture import captured_log_lines

LIMITS = named_limits(Settings(base_url="https://gw.example.com"))
KNOWN_HANDLERS = ", ".join(sorted(HANDLERS))
"""The named limits at their defaults (rpc 50/s, das 10/s, tokens 30/min, challenge 120/min, wallet 5/s)."""
RPC_METHODS = {
    "getBalance",
    "getAccountInfo",
    "getTransaction",
    "getSignaturesForAddress",
    "getTokenAccountsByOwner",
    "getProgramAccounts",
}
DAS_METHODS = {"getAsset", "getAssetsByOwner", "searchAssets"}

# The derivation table of routes.yaml: the provider part, ceil(units * per-unit price).
PROVIDER_PRICES = {
    ("provider_a", "getBalance"): 5,
    ("provider_a", "getAccountInfo"): 5,
    ("provider_a", "getTokenAccountsByOwner"): 5,
    ("provider_a", "getTransaction"): 18,
    ("provider_a", "getSignaturesForAddress"): 18,
    ("provider_a", "getProgramAccounts"): 9,
    ("provider_a", "getAsset"): 36,
    ("provider_a", "getAssetsByOwner"): 216,
    ("provider_a", "searchAssets"): 216,
    ("provider_b", "getBalance"): 5,
    ("provider_b", "getAccountInfo"): 5,
    ("provider_b", "getTokenAccountsByOwner"): 5,
    ("provider_b", "getTransaction"): 5,
    ("provider_b", "getSignaturesForAddress"): 5,
    ("provider_b", "getProgramAccounts"): 50,
    ("provider_b", "getAsset"): 50,
    ("provider_b", "getAssetsByOwner"): 50,
    ("provider_b", "searchAssets"): 50,
}
INTERNAL_FEE = 2200
"""routes.yaml's settlement fee for the internal facilitator: 11,000 lamports at $200 per SOL."""


@pytest.fixture(scope="module")
def packaged() -> list[RouteSpec]:
    return load_routes(PACKAGED_ROUTES_FILE, LIMITS)


def _solana(routes: list[RouteSpec], surface: str) -> set[tuple[str, str, str]]:
    """(cluster, provider, method) of every paid route of ``surface`` (rpc or das)."""
    found = set()
    for route in routes:
        parts = route.path.split("/")  # ['', 'v1', 'x402', 'solana', cluster, provider, surface, method]
        if route.path.startswith("/v1/x402/solana/") and parts[6] == surface:
            found.add((parts[4], parts[5], parts[7]))
    return found


# --- the packaged table --------------------------------------------------------------------------


def test_packaged_table_has_69_routes(packaged: list[RouteSpec]) -> None:
    """63, and the prepaid-credit routes (three top-ups, the balance, opening and revoking a credit
    session), served when credit is on."""
    assert len(packaged) == 69
    assert sorted(r.name for r in packaged if r.group == "credits") == [
        "credits.balance",
        "credits.sessions.open",
        "credits.sessions.revoke",
        "credits.topUp.1",
        "credits.topUp.20",
        "credits.topUp.5",
    ]


def test_rpc_has_six_methods_on_both_clusters_for_both_providers(packaged: list[RouteSpec]) -> None:
    expected = {
        (cluster, provider, method)
        for cluster in ("mainnet", "devnet")
        for provider in ("provider_a", "provider_b")
        for method in RPC_METHODS
    }

    assert _solana(packaged, "rpc") == expected


def test_das_is_mainnet_only_for_provider_a_and_both_clusters_for_provider_b(
    packaged: list[RouteSpec],
) -> None:
    expected = {("mainnet", "provider_a", m) for m in DAS_METHODS} | {
        (cluster, "provider_b", m) for cluster in ("mainnet", "devnet") for m in DAS_METHODS
    }

    assert _solana(packaged, "das") == expected


def test_paid_routes_are_exact_post_with_their_provider_upstream(packaged: list[RouteSpec]) -> None:
    paid = [r for r in packaged if r.path.startswith("/v1/x402/solana/")]

    assert len(paid) == 33
    for route in paid:
        _, _, _, _, cluster, provider, _, method = route.path.split("/")
        assert (route.method, route.access, route.handler) == ("POST", "exact", "jsonrpc")
        assert route.upstream == f"{provider}_{cluster}"
        assert route.group == provider
        assert route.operation == method


def _priced(packaged: list[RouteSpec], provider: str, method: str) -> list[RouteSpec]:
    return [
        r
        for r in packaged
        if r.path.startswith("/v1/x402/solana/")
        and r.path.endswith(f"/{provider}/{r.path.split('/')[6]}/{method}")
    ]


@pytest.mark.parametrize(("provider", "method"), sorted(PROVIDER_PRICES))
def test_provider_part_matches_the_derivation_table(
    packaged: list[RouteSpec], provider: str, method: str
) -> None:
    prices = {r.provider_price_micro_usdc for r in _priced(packaged, provider, method)}

    assert prices == {PROVIDER_PRICES[provider, method]}


@pytest.mark.parametrize(("provider", "method"), sorted(PROVIDER_PRICES))
def test_each_facilitator_adds_its_own_settlement_fee(
    packaged: list[RouteSpec], provider: str, method: str
) -> None:
    part = PROVIDER_PRICES[provider, method]
    for route in _priced(packaged, provider, method):
        internal = route_price(route, FacilitatorFee(internal=True))
        external = route_price(route, FacilitatorFee(internal=False))
        configured = route_price(route, FacilitatorFee(internal=False, external_micro_usdc=700))

        assert internal == RoutePrice(provider=part, settlement_fee=INTERNAL_FEE)
        assert external == RoutePrice(provider=part, settlement_fee=0)
        assert configured is not None and configured.total == part + 700


def test_the_internal_facilitators_fee_covers_the_default_caps_worst_case(packaged: list[RouteSpec]) -> None:
    terms = {r.internal_settlement for r in packaged if r.access == "exact"}

    assert terms == {InternalSettlement(fee_micro_usdc=INTERNAL_FEE, sol_price_usd=Decimal(200))}
    assert InternalSettlement(INTERNAL_FEE, Decimal(200)).fee_lamports == 11_000


def _uncovered(routes: list[RouteSpec], settings: Settings) -> list[str]:
    return [p for p in route_plan(routes, settings).problems if p.startswith("one settlement can cost")]


def test_only_the_internal_facilitators_fee_must_cover_the_compute_caps(packaged: list[RouteSpec]) -> None:
    caps = {"base_url": "https://gw.example.com", "max_compute_unit_price": 5_000_000}

    assert _uncovered(packaged, Settings(**caps, facilitator_url="internal")) == [
        "one settlement can cost the fee payer 260000 lamports under X402_MAX_COMPUTE_UNIT_LIMIT=50000 and "
        "X402_MAX_COMPUTE_UNIT_PRICE=5000000, but the internal facilitator's settlement fee of 2200 "
        "micro-USDC earns only 11000 lamports at the SOL price routes.yaml states: lower the caps or raise "
        "pricing.settlement_fee_micro_usdc"
    ]
    assert _uncovered(packaged, Settings(**caps)) == []  # the external facilitator pays those fees
    assert _uncovered(packaged, Settings(base_url="https://gw.example.com", facilitator_url="internal")) == []


def test_rpc_and_das_routes_carry_their_named_scope_and_wallet_limits(packaged: list[RouteSpec]) -> None:
    route = next(r for r in packaged if r.path == "/v1/x402/solana/devnet/provider_b/das/getAsset")

    scope, wallet = route.rate_limits
    assert (scope.scope, scope.limit, scope.per) == ("provider_b:devnet:das", 10, "scope")
    assert scope.period_ms == wallet.period_ms == 1000
    # A payer may use all of an idle scope: its own limit defaults to the scope's.
    assert (wallet.scope, wallet.limit, wallet.per) == ("provider_b:devnet:das:wallet", 10, "wallet")


def test_a_payers_own_limit_defaults_to_its_scopes_limit_and_can_be_set_apart() -> None:
    defaults = LIMITS
    assert defaults["rpc_wallet"] == defaults["rpc"] == (50, 1000)
    assert defaults["das_wallet"] == defaults["das"] == (10, 1000)
    capped = named_limits(Settings(base_url="https://gw.example.com", rate_limit_wallet_rps=7))
    assert capped["rpc_wallet"] == capped["das_wallet"] == (7, 1000)


def test_one_wallets_or_one_ips_share_of_the_asset_data_key_is_a_quarter_by_default() -> None:
    assert LIMITS["tokens"] == (30, 60_000)
    assert LIMITS["tokens_share"] == (8, 60_000)  # ceil(30 * 25%)
    half = named_limits(Settings(base_url="https://gw.example.com", rate_limit_tokens_share_percent=50))
    assert half["tokens_share"] == (15, 60_000)


def test_asset_data_routes_charge_the_wallet_and_the_ip_share_and_the_shared_key(
    packaged: list[RouteSpec],
) -> None:
    route = next(r for r in packaged if r.group == "tokens")

    assert [(s.scope, s.per, s.limit) for s in route.rate_limits] == [
        ("tokens:upstream-key", "scope", 30),
        ("tokens:wallet", "wallet", 8),
        ("tokens:ip", "ip", 8),
    ]


def test_asset_data_routes_are_19_free_siwx_routes(packaged: list[RouteSpec]) -> None:
    tokens = [r for r in packaged if r.group == "tokens"]

    assert len(tokens) == 19
    assert {r.access for r in tokens} == {"siwx"}
    assert {r.provider_price_micro_usdc for r in tokens} == {None}
    assert {route_price(r, FacilitatorFee(internal=True)) for r in tokens} == {None}


def test_internal_and_metrics_routes_are_unlisted(packaged: list[RouteSpec]) -> None:
    unlisted = {r.path for r in packaged if not r.listed}

    assert unlisted == {
        "/metrics",
        "/readyz",
        "/openapi.json",
        "/docs",
        "/docs/docs.js",
        "/docs/docs.css",
        "/api/internal/facilitator/supported",
        "/api/internal/facilitator/verify",
        "/api/internal/facilitator/settle",
    }


def test_fixed_asset_paths_are_declared_before_asset_id_paths(packaged: list[RouteSpec]) -> None:
    fixed = [r for r in packaged if r.group == "tokens" and not r.has_path_params]

    assert {r.operation for r in fixed} == {
        "health",
        "search",
        "resolve",
        "curated",
        "marketSnapshots",
        "variantMarkets",
        "riskSummaryByMint",
    }


# --- errors name their YAML location --------------------------------------------------------------


def _route(**overrides: Any) -> dict[str, Any]:
    route: dict[str, Any] = {
        "name": "ping",
        "path": "/ping",
        "method": "GET",
        "access": "public",
        "handler": "health",
    }
    route.update(overrides)
    return route


UPSTREAMS = {
    "provider_a_mainnet": "PROVIDER_A_MAINNET_RPC_URL",
    "provider_a_devnet": "PROVIDER_A_DEVNET_RPC_URL",
}


def _doc(*routes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"upstreams": UPSTREAMS, "routes": list(routes), **extra}


TEMPLATE: dict[str, Any] = {
    "name": "solana.{cluster}.{provider}.rpc.{method}",
    "path": "/v1/x402/solana/{cluster}/{provider}/rpc/{method}",
    "method": "POST",
    "access": "exact",
    "handler": "jsonrpc",
    "group": "{provider}",
    "upstream": "{provider}_{cluster}",
    "price": 1000,
    "expand": [{"cluster": ["mainnet", "devnet"], "provider": ["provider_a"]}],
    "methods": {"getBalance": {"params": {"type": "array"}}, "getSlot": {}},
}


def _load_error(doc: Any) -> str:
    with pytest.raises(RoutesError) as caught:
        parse_routes(doc, LIMITS)
    return str(caught.value)


def _load_problems(doc: Any) -> list[str]:
    with pytest.raises(RoutesError) as caught:
        parse_routes(doc, LIMITS)
    return caught.value.problems


def test_a_small_valid_table_loads() -> None:
    (route,) = parse_routes(_doc(_route()), LIMITS)

    assert (route.name, route.path, route.method, route.access) == ("ping", "/ping", "GET", "public")


def test_template_expands_cluster_by_provider_by_method() -> None:
    routes = parse_routes({"upstreams": UPSTREAMS, "templates": [TEMPLATE]}, LIMITS)

    assert sorted(r.name for r in routes) == [
        "solana.devnet.provider_a.rpc.getBalance",
        "solana.devnet.provider_a.rpc.getSlot",
        "solana.mainnet.provider_a.rpc.getBalance",
        "solana.mainnet.provider_a.rpc.getSlot",
    ]


def test_unknown_handler_names_its_location() -> None:
    message = _load_error(_doc(_route(), _route(name="b", path="/b", handler="teapot")))

    assert message == (
        f"routes.yaml: routes[1] (b).handler: unknown handler 'teapot' (known: {KNOWN_HANDLERS})"
    )


def test_unknown_access_names_its_location() -> None:
    message = _load_error(_doc(_route(access="free")))

    assert message.startswith("routes.yaml: routes[0] (ping).access: 'free' is not one of")


def test_duplicate_path_names_both_locations() -> None:
    message = _load_error(_doc(_route(), _route(name="ping2")))

    assert message == "routes.yaml: routes[1].path: duplicate route GET /ping (first at routes[0])"


def test_same_path_with_another_method_is_not_a_duplicate() -> None:
    routes = parse_routes(_doc(_route(), _route(name="ping2", method="POST")), LIMITS)

    assert [r.method for r in routes] == ["GET", "POST"]


def test_duplicate_name_names_its_location() -> None:
    message = _load_error(_doc(_route(), _route(path="/other")))

    assert message == "routes.yaml: routes[1].name: duplicate route name 'ping' (first at routes[0])"


def test_duplicate_from_a_template_names_the_expansion() -> None:
    clash = _route(name="clash", path="/v1/x402/solana/devnet/provider_a/rpc/getSlot", method="POST")

    message = _load_error({"upstreams": UPSTREAMS, "routes": [clash], "templates": [TEMPLATE]})

    assert message.startswith(
        "routes.yaml: templates[0][devnet/provider_a/getSlot].path: duplicate route POST"
    )
    assert message.endswith("(first at routes[0])")


def test_exact_route_without_price_names_its_location() -> None:
    message = _load_error(_doc(_route(access="exact")))

    assert message == "routes.yaml: routes[0] (ping).price: an exact route needs a price"


def test_price_on_a_route_that_is_not_exact_is_refused() -> None:
    message = _load_error(_doc(_route(price=5)))

    assert message == "routes.yaml: routes[0] (ping).price: only exact routes carry a price"


def test_template_without_price_is_one_problem_naming_the_template_and_its_routes() -> None:
    template = {k: v for k, v in TEMPLATE.items() if k != "price"}

    problems = _load_problems({"upstreams": UPSTREAMS, "templates": [template]})

    assert problems == [
        "routes.yaml: templates[0] (solana.{cluster}.{provider}.rpc.{method}).price: "
        "an exact route needs a price [affects all 4 routes of the template]"
    ]


def test_a_typo_in_a_template_is_reported_once_with_the_valid_values() -> None:
    template = {**TEMPLATE, "handler": "jsonrcp", "upstream": "{provider}_{clustr}"}

    problems = _load_problems({"upstreams": UPSTREAMS, "templates": [template]})

    assert problems == [
        "routes.yaml: templates[0] (solana.{cluster}.{provider}.rpc.{method}).handler: unknown handler "
        f"'jsonrcp' (did you mean 'jsonrpc'?) (known: {KNOWN_HANDLERS}) "
        "[affects all 4 routes of the template]",
        "routes.yaml: templates[0] (solana.{cluster}.{provider}.rpc.{method}).upstream: unknown upstream "
        "'provider_a_{clustr}' (did you mean 'provider_a_devnet'?) (declare it under upstreams; known: "
        "['provider_a_devnet', 'provider_a_mainnet']) [affects all 4 routes of the template]",
    ]


def test_a_problem_of_some_of_a_templates_routes_says_how_many_and_names_one() -> None:
    template = {**TEMPLATE, "upstream": "provider_a_{cluster}", "price": {"pricing": "p", "unit": "{method}"}}
    pricing = {"p": {"micro_usdc_per_unit": 1, "units": {"getBalance": 5}}}

    problems = _load_problems({"upstreams": UPSTREAMS, "pricing": pricing, "templates": [template]})

    assert problems == [
        "routes.yaml: templates[0] (solana.{cluster}.{provider}.rpc.{method}).price.unit: schedule 'p' has "
        "no units for 'getSlot' [affects 2 of the template's 4 routes]"
    ]


def test_a_problem_of_one_route_of_a_template_names_that_route() -> None:
    template = {**TEMPLATE, "expand": [{"cluster": ["mainnet"], "provider": ["provider_a"]}]}
    template["methods"] = {"getBalance": {"params": {"type": "array", "uniqueItems": True}}, "getSlot": {}}

    problems = _load_problems({"upstreams": UPSTREAMS, "templates": [template]})

    assert problems == [
        "routes.yaml: templates[0][mainnet/provider_a/getBalance] (solana.mainnet.provider_a.rpc.getBalance)"
        ".input.body.properties.params: unsupported schema keyword(s) ['uniqueItems']"
    ]


def test_a_template_typo_in_a_file_points_at_the_templates_line_once(tmp_path: Any) -> None:
    text = PACKAGED_ROUTES_FILE.read_text().replace("    handler: jsonrpc\n", "    handler: jsonrcp\n", 1)
    line = text.splitlines().index("    handler: jsonrcp") + 1

    problems = _file_error(tmp_path, text)

    expanded = [r for r in load_routes(PACKAGED_ROUTES_FILE, LIMITS) if r.name.startswith("solana.")]
    rpc = [r for r in expanded if ".rpc." in r.name]  # the first template's
    assert len(rpc) > 1
    [problem] = problems
    assert problem.startswith(f"{tmp_path / 'my-routes.yaml'}:{line}: templates[0] (solana.")
    assert "unknown handler 'jsonrcp' (did you mean 'jsonrpc'?) (known: " in problem
    assert problem.endswith(f"[affects all {len(rpc)} routes of the template]")


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (
            {k: v for k, v in _route().items() if k != "access"} | {"acess": "public"},
            "routes.yaml: routes[0]: unknown field(s) ['acess'] (did you mean 'access'?)",
        ),
        (
            _route(prise=5, descripton="d"),
            "routes.yaml: routes[0]: unknown field(s) ['descripton', 'prise'] "
            "(did you mean 'description' for 'descripton', 'price' for 'prise'?)",
        ),
        (
            _route(access="publik"),
            "routes.yaml: routes[0] (ping).access: 'publik' is not one of "
            "['public', 'exact', 'siwx', 'internal'] (did you mean 'public'?)",
        ),
        (
            _route(rate_limits=[{"scope": "s", "limit": "rpc_walet"}]),
            "routes.yaml: routes[0] (ping).rate_limits[0].limit: unknown named limit 'rpc_walet' "
            f"(did you mean 'rpc_wallet'?) (known: {sorted(LIMITS)})",
        ),
    ],
)
def test_a_misspelt_key_or_value_is_one_problem_with_a_did_you_mean(
    route: dict[str, Any], message: str
) -> None:
    assert _load_problems(_doc(route)) == [message]


def test_bad_schema_keyword_names_its_location() -> None:
    schema = {"type": "object", "properties": {"limit": {"type": "integer", "exclusiveMinimum": 0}}}

    message = _load_error(_doc(_route(input={"query": schema})))

    assert message == (
        "routes.yaml: routes[0] (ping).input.query.properties.limit: "
        "unsupported schema keyword(s) ['exclusiveMinimum']"
    )


def test_bad_schema_keyword_in_a_template_method_names_it() -> None:
    template = copy.deepcopy(TEMPLATE)
    template["methods"]["getBalance"]["params"] = {"type": "array", "uniqueItems": True}

    message = _load_error({"upstreams": UPSTREAMS, "templates": [template]})

    assert "input.body.properties.params: unsupported schema keyword(s) ['uniqueItems']" in message


def test_unknown_field_in_a_template_method_is_refused() -> None:
    template = copy.deepcopy(TEMPLATE)
    template["methods"]["getBalance"] = {"parms": {"type": "array", "maxItems": 1}}

    message = _load_error({"upstreams": UPSTREAMS, "templates": [template]})

    assert message.startswith("routes.yaml: templates[0].methods.getBalance: unknown field(s) ['parms']")


def test_unknown_upstream_names_its_location() -> None:
    message = _load_error(_doc(_route(upstream="provider_c_mainnet")))

    assert message.startswith("routes.yaml: routes[0] (ping).upstream: unknown upstream 'provider_c_mainnet'")


def test_unknown_named_limit_names_its_location() -> None:
    limits = [{"scope": "a", "limit": 5, "period_seconds": 1}, {"scope": "b", "limit": "turbo"}]

    message = _load_error(_doc(_route(rate_limits=limits)))

    assert message.startswith(
        "routes.yaml: routes[0] (ping).rate_limits[1].limit: unknown named limit 'turbo'"
    )


@pytest.mark.parametrize("period", [0, -1, True, "30"])
def test_literal_limit_needs_a_positive_period(period: Any) -> None:
    limits = [{"scope": "a", "limit": 5, "period_seconds": period}]

    message = _load_error(_doc(_route(rate_limits=limits)))

    assert message.startswith(
        "routes.yaml: routes[0] (ping).rate_limits[0].limit: a named limit or a positive integer"
    )


def test_literal_limit_is_kept_in_milliseconds() -> None:
    limits = [{"scope": "scale-test", "limit": 200, "period_seconds": 30}]

    (route,) = parse_routes(_doc(_route(rate_limits=limits)), LIMITS)

    assert [(x.scope, x.limit, x.period_ms, x.per) for x in route.rate_limits] == [
        ("scale-test", 200, 30_000, "scope")
    ]


def test_unknown_route_field_names_its_location() -> None:
    message = _load_error(_doc(_route(cost=3)))

    assert message == "routes.yaml: routes[0]: unknown field(s) ['cost']"


def test_forward_params_is_no_longer_a_route_field() -> None:
    message = _load_error(_doc(_route(forward_params="named")))

    assert message == "routes.yaml: routes[0]: unknown field(s) ['forward_params']"


def test_listed_must_be_a_boolean() -> None:
    message = _load_error(_doc(_route(listed="false")))

    assert message == "routes.yaml: routes[0] (ping).listed: must be true or false, got the text 'false'"


def test_unknown_pricing_unit_names_its_location() -> None:
    pricing = {"provider_a": {"micro_usdc_per_unit": "0.45", "units": {"getBalance": 10}}}
    route = _route(access="exact", method="POST", price={"pricing": "provider_a", "unit": "getSlot"})

    message = _load_error(_doc(route, pricing=pricing))

    assert (
        message
        == "routes.yaml: routes[0] (ping).price.unit: schedule 'provider_a' has no units for 'getSlot'"
    )


def test_price_from_a_schedule_rounds_up_and_keeps_the_fee_apart() -> None:
    pricing = {
        "settlement_fee_micro_usdc": 1000,
        "provider_a": {"micro_usdc_per_unit": "0.45", "units": {"getTransaction": 41, "getBalance": 10}},
    }
    route = _route(access="exact", method="POST", price={"pricing": "provider_a", "unit": "getTransaction"})

    (parsed,) = parse_routes(_doc(route, pricing=pricing), LIMITS)

    assert parsed.provider_price_micro_usdc == 19  # ceil(41 * 0.45 = 18.45)
    assert parsed.internal_settlement == InternalSettlement(fee_micro_usdc=1000)
    assert parsed.internal_settlement.fee_lamports is None  # no SOL price stated: nothing to compare
    assert route_price(parsed, FacilitatorFee(internal=True)) == RoutePrice(provider=19, settlement_fee=1000)
    assert route_price(parsed, FacilitatorFee(internal=False)) == RoutePrice(provider=19, settlement_fee=0)


def test_the_settlement_fee_is_converted_to_lamports_at_the_stated_sol_price() -> None:
    pricing = {
        "sol_price_usd": "200",
        "settlement_fee_micro_usdc": 2200,
        "provider_a": {"micro_usdc_per_unit": "0.45", "units": {"getBalance": 10}},
    }
    scheduled = _route(access="exact", method="POST", price={"pricing": "provider_a", "unit": "getBalance"})
    literal = {**_route(access="exact", method="POST", price=3000), "name": "flat", "path": "/flat"}

    by_name = {r.name: r for r in parse_routes(_doc(scheduled, literal, pricing=pricing), LIMITS)}

    assert by_name["ping"].provider_price_micro_usdc == 5
    assert by_name["ping"].internal_settlement.fee_lamports == 11_000  # 2,200 micro-USDC at $200 per SOL
    # A literal price is a provider part too: the settling facilitator adds its fee to it.
    assert by_name["flat"].provider_price_micro_usdc == 3000
    flat = route_price(by_name["flat"], FacilitatorFee(internal=True))
    assert flat is not None and flat.total == 5200


@pytest.mark.parametrize("fee", [-1, 2.5, "2200", True, None])
def test_a_settlement_fee_that_is_not_a_whole_number_of_micro_usdc_is_refused(fee: Any) -> None:
    route = _route(access="exact", method="POST", price=1000)

    (problem,) = _load_problems(_doc(route, pricing={"settlement_fee_micro_usdc": fee}))

    assert "pricing.settlement_fee_micro_usdc: must be a whole number of micro-USDC >= 0" in problem


@pytest.mark.parametrize("sol_price", ["0", "-3", "cheap", True])
def test_a_sol_price_that_is_not_a_positive_number_is_refused(sol_price: Any) -> None:
    pricing = {"sol_price_usd": sol_price}
    route = _route(access="exact", method="POST", price=1000)

    with pytest.raises(RoutesError) as refused:
        parse_routes(_doc(route, pricing=pricing), LIMITS)

    assert "pricing.sol_price_usd: must be a positive number" in str(refused.value)


# --- the file as an operator edits it: every problem at once, with the file and its location -------


def _file_error(tmp_path: Any, text: str, name: str = "my-routes.yaml") -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RoutesError) as caught:
        load_routes(path, LIMITS)
    return caught.value.problems


def test_every_problem_is_reported_at_once_each_with_the_file_and_line(tmp_path: Any) -> None:
    text = """version: 1
routes:
  - name: a
    path: /a
    method: GET
    access: free
    handler: health
  - name: b
    path: b
    method: FETCH
    access: public
    handler: teapot
    listed: 'no'
"""

    problems = _file_error(tmp_path, text)

    source = str(tmp_path / "my-routes.yaml")
    assert problems == [
        f"{source}:6: routes[0] (a).access: 'free' is not one of ['public', 'exact', 'siwx', 'internal']",
        f"{source}:9: routes[1] (b).path: must start with /, got 'b'",
        f"{source}:10: routes[1] (b).method: 'FETCH' is not one of ['DELETE', 'GET', 'PATCH', 'POST', 'PUT']",
        f"{source}:12: routes[1] (b).handler: unknown handler 'teapot' (known: {KNOWN_HANDLERS})",
        f"{source}:13: routes[1] (b).listed: must be true or false, got the text 'no'",
    ]


def test_a_problem_in_the_packaged_table_points_at_its_line(tmp_path: Any) -> None:
    text = PACKAGED_ROUTES_FILE.read_text().replace("getBalance: 10\n", "getBalance: ten\n", 1)
    line = text.splitlines().index("      getBalance: ten") + 1

    problems = _file_error(tmp_path, text)

    assert problems == [
        f"{tmp_path / 'my-routes.yaml'}:{line}: pricing.provider_a.units.getBalance: "
        "must be a positive number, got the text 'ten'"
    ]


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Any) -> None:
    (problem,) = _file_error(tmp_path, "version: 1\nroutes:\n  - {name: a, path: /a\n  - oops: [\n")

    assert problem == (
        f"{tmp_path / 'my-routes.yaml'}:4:9: YAML syntax error: "
        "while parsing a flow mapping, expected ',' or '}', but got ':'"
    )
    assert "<unicode string>" not in problem


def test_an_empty_file_is_blamed_on_its_own_name(tmp_path: Any) -> None:
    (problem,) = _file_error(tmp_path, "# nothing yet\n", name="empty.yaml")

    assert (
        problem
        == f"{tmp_path / 'empty.yaml'}: the file is empty (expected version, pricing, routes, templates)"
    )


def test_a_directory_is_reported_as_a_directory(tmp_path: Any) -> None:
    with pytest.raises(RoutesError) as caught:
        load_routes(tmp_path, LIMITS)

    assert caught.value.problems == [f"{tmp_path}: is a directory, not a route table file"]


def test_unknown_top_level_keys_and_versions_are_refused() -> None:
    problems = _load_problems({"version": 2, "route": [], "x-anchors": {}, "routes": [_route()]})

    assert problems == [
        "routes.yaml: route: unknown top-level key (did you mean 'routes'?) "
        "(known: pricing, routes, templates, upstreams, version, or x-...)",
        "routes.yaml: version: unsupported version 2 (this gateway reads version 1)",
    ]


@pytest.mark.parametrize(
    ("units", "message"),
    [
        ("ten", "must be a positive number, got the text 'ten'"),
        (0, "must be a positive number, got the number 0"),
        (True, "must be a positive number, got the boolean true"),
    ],
)
def test_a_bad_pricing_value_says_what_is_wrong_with_it(units: Any, message: str) -> None:
    pricing = {"provider_a": {"micro_usdc_per_unit": "0.45", "units": {"getBalance": units}}}
    route = _route(access="exact", method="POST", price={"pricing": "provider_a", "unit": "getBalance"})

    problems = _load_problems(_doc(route, pricing=pricing))

    assert problems == [f"routes.yaml: pricing.provider_a.units.getBalance: {message}"]


def test_a_bad_per_unit_price_is_named() -> None:
    pricing = {"provider_a": {"micro_usdc_per_unit": "cheap", "units": {"getBalance": 1}}}

    problems = _load_problems(_doc(_route(), pricing=pricing))

    assert problems == [
        "routes.yaml: pricing.provider_a.micro_usdc_per_unit: must be a positive number, got the text 'cheap'"
    ]


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (
            _route(rate_limits=[{"scope": "s", "limit": "rpc", "per": "wallet"}]),
            "routes[0] (ping).rate_limits[0]: a per-wallet limit cannot be enforced on public routes",
        ),
        (
            _route(
                access="internal",
                handler="facilitator_supported",
                rate_limits=[{"scope": "s", "limit": "rpc"}],
            ),
            "routes[0] (ping).rate_limits[0]: internal routes run no rate limiter: remove their rate_limits",
        ),
        (
            _route(rate_limits=[{"scope": "s", "limit": "rpc", "burst": 5}]),
            "routes[0] (ping).rate_limits[0]: unknown field(s) ['burst'] "
            "(known: limit, per, period_seconds, scope, share_of)",
        ),
        (
            _route(access="siwx", rate_limits=[{"scope": "k", "limit": "tokens", "share_of": "k"}]),
            "routes[0] (ping).rate_limits[0].share_of: a per-wallet or per-IP limit's share_of names a scope",
        ),
        (
            _route(
                access="siwx",
                rate_limits=[
                    {"scope": "k", "limit": "tokens"},
                    {"scope": "w", "limit": "tokens_share", "per": "ip", "share_of": "other"},
                    {"scope": "v", "limit": "sign_in_wallet", "per": "wallet"},
                ],
            ),
            "routes[0] (ping).rate_limits[1].share_of: 'other' is no per-scope limit of this route",
        ),
    ],
)
def test_a_rate_limit_the_gateway_cannot_enforce_is_refused_at_load(
    route: dict[str, Any], message: str
) -> None:
    assert _load_problems(_doc(route)) == [f"routes.yaml: {message}"]


def test_the_asset_data_shares_bind_only_under_contention_for_the_key(packaged: list[RouteSpec]) -> None:
    for route in packaged:
        if route.handler != "tokens":
            continue
        shares = {limit.scope: limit.share_of for limit in route.rate_limits if limit.per != "scope"}
        assert shares == {"tokens:wallet": "tokens:upstream-key", "tokens:ip": "tokens:upstream-key"}


@pytest.mark.parametrize(
    ("limits", "missing"),
    [
        (None, "ip, wallet"),
        ([{"scope": "s", "limit": "sign_in_wallet", "per": "wallet"}], "ip"),
        ([{"scope": "s", "limit": "sign_in_ip", "per": "ip"}, {"scope": "k", "limit": "tokens"}], "wallet"),
    ],
    ids=["none", "wallet-only", "ip-and-scope"],
)
def test_a_sign_in_route_without_its_own_per_ip_and_per_wallet_limits_is_refused_at_load(
    limits: list[dict[str, Any]] | None, missing: str
) -> None:
    """A sign-in costs a throwaway key nothing: without a client's own limits a flood of them
    from one IP would be unbounded in calls and in nonces kept."""
    route = _route(access="siwx", handler="credit_balance", **({"rate_limits": limits} if limits else {}))

    assert _load_problems(_doc(route)) == [
        "routes.yaml: routes[0] (ping).rate_limits: a siwx route is free to call, so it needs a per-ip "
        f"and a per-wallet limit (missing: {missing}; e.g. the named limits sign_in_ip, sign_in_wallet)"
    ]


def test_every_packaged_sign_in_route_limits_each_ip_and_each_wallet(packaged: list[RouteSpec]) -> None:
    signed = [route for route in packaged if route.access == "siwx"]
    assert any(route.path == "/v1/x402/credits" for route in signed)
    for route in signed:
        assert {"ip", "wallet"} <= {limit.per for limit in route.rate_limits}, route.name


def test_the_packaged_table_declares_only_enforceable_limits(packaged: list[RouteSpec]) -> None:
    for route in packaged:
        for limit in route.rate_limits:
            assert route.access != "internal"
            assert limit.per == "scope" or route.access in ("exact", "siwx")


def test_every_paid_challenge_header_fits_common_client_limits(packaged: list[RouteSpec]) -> None:
    """A paid route's body schema travels twice in PAYMENT-REQUIRED; aiohttp, for one, refuses
    a response header over 8190 bytes, so that client could not even read the price."""
    requirements = PaymentRequirements(
        scheme="exact",
        network=SOLANA_MAINNET,
        amount="2416",
        asset=USDC_MAINNET_MINT,
        payTo=USDC_MAINNET_MINT,
        maxTimeoutSeconds=60,
    )
    for route in packaged:
        if route.access != "exact":
            continue
        challenge = ExactChallenge(
            requirements,
            "https://gateway.example.com" + route.path,
            route.description,
            route.input.get("body"),
            route.output,
            "https://api.cdp.coinbase.com/platform/v2/x402",
            route.method,
        )
        _, headers = challenge.response(USDC_MAINNET_MINT)
        assert len(dict(headers)[b"payment-required"]) < 8000, route.name


@pytest.mark.parametrize(
    "price", [{"pricing": ["provider_a"], "unit": "getBalance"}, {"pricing": "provider_a", "unit": {"a": 1}}]
)
def test_a_price_reference_must_name_its_schedule_and_unit_as_text(price: dict[str, Any]) -> None:
    route = _route(access="exact", method="POST", price=price)

    (problem,) = _load_problems(_doc(route))

    assert problem.startswith("routes.yaml: routes[0] (ping).price: an integer of micro-USDC or {pricing: ")


def test_an_upstream_reads_its_url_variable_from_the_upstreams_block() -> None:
    route = _route(handler="jsonrpc", upstream="provider_a_devnet")

    (parsed,) = parse_routes(_doc(route), LIMITS)

    assert (parsed.upstream, parsed.upstream_variable) == ("provider_a_devnet", "PROVIDER_A_DEVNET_RPC_URL")


def test_bad_upstreams_entries_name_their_line(tmp_path: Any) -> None:
    text = """\
upstreams:
  good: GOOD_RPC_URL
  lower: not-a-variable
  wallet: X402_PAY_TO_WALLET
routes:
  - {name: a, path: /a, method: POST, access: public, handler: jsonrpc, upstream: lower}
"""

    problems = _file_error(tmp_path, text)

    source = str(tmp_path / "my-routes.yaml")
    assert problems == [
        f"{source}:3: upstreams.lower: must name an environment variable (A-Z, 0-9, _), "
        "got the text 'not-a-variable'",
        f"{source}:4: upstreams.wallet: X402_PAY_TO_WALLET is a setting of the gateway, not an upstream URL",
        f"{source}:6: routes[0] (a).upstream: unknown upstream 'lower' (declare it under upstreams; "
        "known: ['good'])",
    ]


def test_a_catalog_filter_that_misses_a_provider_group_names_its_line(tmp_path: Any) -> None:
    text = """\
upstreams: {provider_a_mainnet: PROVIDER_A_MAINNET_RPC_URL}
routes:
  - name: catalog
    path: /v1/catalog
    method: GET
    access: public
    handler: catalog
    input:
      query:
        type: object
        properties:
          provider: {type: string, enum: [provider_z]}
  - {name: a, path: /a, method: POST, access: public, handler: jsonrpc, group: provider_a,
     upstream: provider_a_mainnet}
"""

    problems = _file_error(tmp_path, text)

    assert problems == [
        f"{tmp_path / 'my-routes.yaml'}:12: routes[0] (catalog).input.query.properties.provider.enum: "
        "lists provider_z but the provider groups of the table are provider_a: list exactly those"
    ]


def test_a_misspelt_key_points_at_its_own_line(tmp_path: Any) -> None:
    text = PACKAGED_ROUTES_FILE.read_text()
    at = text.index("templates:")
    text = text[:at] + text[at:].replace("    accepts: [exact, credit]\n", "    acepts: [exact, credit]\n", 1)
    line = text.splitlines().index("    acepts: [exact, credit]") + 1

    [problem] = _file_error(tmp_path, text)

    assert problem.startswith(f"{tmp_path / 'my-routes.yaml'}:{line}: templates[0] (solana.")
    rpc = [
        r
        for r in load_routes(PACKAGED_ROUTES_FILE, LIMITS)
        if r.name.startswith("solana.") and ".rpc." in r.name
    ]
    assert problem.endswith(
        ": unknown field(s) ['acepts'] (did you mean 'accepts'?) "
        f"[affects all {len(rpc)} routes of the template]"
    )


def test_a_problem_in_a_yaml_anchor_is_said_once_naming_every_route_it_reaches(tmp_path: Any) -> None:
    text = """\
version: 1
routes:
  - &base
    name: a
    path: /a
    method: GET
    acess: public
    handler: health
  - <<: *base
    name: b
    path: /b
"""

    problems = _file_error(tmp_path, text)

    source = tmp_path / "my-routes.yaml"
    assert problems == [
        f"{source}:7: routes[0], routes[1]: unknown field(s) ['acess'] (did you mean 'access'?)"
    ]


# --- accepts: the payment methods a route takes ------------------------------------------------


def _paid(**overrides: Any) -> dict[str, Any]:
    route = {k: v for k, v in _route(method="POST", price=1000).items() if k != "access"}
    return {**route, "accepts": ["exact", "credit"], **overrides}


@pytest.mark.parametrize("credits", [True, False])
def test_credit_is_accepted_where_a_route_lists_it_and_credit_is_on(credits: bool) -> None:
    settings = Settings(base_url="https://gw.example.com", credits_enabled=credits)
    both, alone = parse_routes(_doc(_paid(), _paid(name="alone", path="/alone", accepts=["exact"])), LIMITS)

    assert (both.access, both.accepts) == ("exact", ("exact", "credit"))
    assert payment_methods(both, settings) == (("exact", "credit") if credits else ("exact",))
    assert (alone.access, payment_methods(alone, settings)) == ("exact", ("exact",))


SIGN_IN_LIMITS = [
    {"scope": "s:ip", "per": "ip", "limit": "sign_in_ip"},
    {"scope": "s:wallet", "per": "wallet", "limit": "sign_in_wallet"},
]


def test_a_table_naming_a_payment_method_as_access_loads_as_it_always_meant_with_a_warning() -> None:
    top_up = _route(
        name="top", path="/top", method="POST", access="exact", handler="credit_top_up", price=1000
    )
    with captured_log_lines() as lines:
        paid, bought, signed = parse_routes(
            _doc(
                _route(method="POST", access="exact", price=1000),
                top_up,
                _route(
                    name="s", path="/s", access="siwx", handler="credit_balance", rate_limits=SIGN_IN_LIMITS
                ),
            ),
            LIMITS,
        )

    assert [r.accepts for r in (paid, bought, signed)] == [("exact", "credit"), ("exact",), ("siwx",)]
    [warning] = [json.loads(line) for line in lines]
    assert warning["level"] == "warning"
    assert warning["msg"].startswith(
        "routes.yaml: 3 route(s) name a payment method as access; read as accepts"
    )
    assert "routes[0] (ping): access: exact -> accepts: [exact, credit]" in warning["msg"]


def test_the_packaged_table_lists_its_methods_and_loads_without_a_warning() -> None:
    with captured_log_lines() as lines:
        routes = load_routes(PACKAGED_ROUTES_FILE, LIMITS)

    assert lines == []
    assert {r.accepts for r in routes} == {(), ("exact",), ("exact", "credit"), ("siwx",)}
    assert all(r.accepts == ("exact",) for r in routes if r.handler == "credit_top_up")


@pytest.mark.parametrize(
    ("route", "problem"),
    [
        (
            _paid(accepts=["exakt"]),
            "accepts: unknown payment method 'exakt' (did you mean 'exact'?) (known: exact, credit, siwx)",
        ),
        (
            _paid(accepts=["public"]),
            "accepts: unknown payment method 'public' (public and internal routes say so with access:) "
            "(known: exact, credit, siwx)",
        ),
        (
            _paid(accepts=["credit"]),
            "accepts: credit is accepted only beside another method; list one of ['exact', 'siwx'] first",
        ),
        (_paid(accepts=["exact", "exact"]), "accepts: names a payment method twice"),
        (_paid(accepts="exact"), "accepts: a non-empty list of payment methods, got the text 'exact'"),
        (_paid(accepts=[]), "accepts: a non-empty list of payment methods, got a list"),
        (
            _paid(access="public"),
            "access: give access (public or internal) or accepts (payment methods), not both",
        ),
        (
            _paid(accepts=["exact"], credit_price=5),
            "credit_price: the route does not accept credit: add credit to its accepts",
        ),
        (
            _paid(handler="credit_top_up"),
            "accepts: credit is accepted only on a paid route that does not sell credit",
        ),
    ],
)
def test_a_wrong_accepts_is_refused_naming_its_location(route: dict[str, Any], problem: str) -> None:
    assert _load_error(_doc(route)) == f"routes.yaml: routes[0] (ping).{problem}"
