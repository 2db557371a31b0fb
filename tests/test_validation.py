"""The validation engine: the JSON Schema subset of routes.yaml, its x- keywords, strict query strings."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import msgspec
import pytest

from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.routes import RouteSpec, load_routes, named_limits
from gateway.routing.validation import (
    InvalidInput,
    RequestValidator,
    SchemaError,
    check_schema,
    compile_schema,
)

LIMITS = named_limits(Settings(base_url="https://gw.example.com"))
"""The named limits at their defaults (rpc 50/s, das 10/s, tokens 30/min, challenge 120/min, wallet 5/s)."""
MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
OTHER_MINT = "So11111111111111111111111111111111111111112"


@pytest.fixture(scope="module")
def routes() -> dict[str, RouteSpec]:
    return {r.name: r for r in load_routes(PACKAGED_ROUTES_FILE, LIMITS)}


def _validator(routes: dict[str, RouteSpec], name: str) -> RequestValidator:
    return RequestValidator(routes[name].input)


def _refused(call: Any, *args: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        call(*args)
    return caught.value


def _q(**params: Any) -> bytes:
    return urlencode(params).encode()


def _schema(schema: dict[str, Any], *, from_query: bool = False) -> Any:
    check_schema(schema, "test")
    return compile_schema(schema, from_query=from_query)


# --- plain keywords ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "good", "bad"),
    [
        ("string", "x", 1),
        ("integer", 3, 3.0),
        ("integer", -2, True),
        ("number", 2.5, "2.5"),
        ("boolean", False, 0),
        ("null", None, ""),
        ("array", [1], (1,)),
        ("object", {"a": 1}, [("a", 1)]),
    ],
)
def test_type_accepts_its_own_kind_only(type_: str, good: Any, bad: Any) -> None:
    validate = _schema({"type": type_})

    assert validate(good, "v") == good
    assert "must be" in str(_refused(validate, bad, "v"))


def test_type_list_accepts_any_of_its_types() -> None:
    validate = _schema({"type": ["string", "integer", "null"]})

    assert [validate(v, "id") for v in ("a", 1, None)] == ["a", 1, None]
    assert str(_refused(validate, 1.5, "id")) == "id: must be a string or integer or null"


def test_const_refuses_any_other_value() -> None:
    validate = _schema({"type": "string", "const": "2.0"})

    assert validate("2.0", "jsonrpc") == "2.0"
    assert str(_refused(validate, "1.0", "jsonrpc")) == "jsonrpc: must be '2.0'"


def test_enum_lists_the_allowed_values() -> None:
    validate = _schema({"type": "string", "enum": ["1m", "1H"]})

    assert str(_refused(validate, "1h", "interval")) == "interval: must be one of 1m, 1H"


def test_minimum_and_maximum_bound_a_number() -> None:
    validate = _schema({"type": "integer", "minimum": 1, "maximum": 50})

    assert validate(50, "limit") == 50
    assert str(_refused(validate, 0, "limit")) == "limit: must be between 1 and 50"
    assert str(_refused(validate, 51, "limit")) == "limit: must be between 1 and 50"


def test_min_length_one_means_not_empty() -> None:
    validate = _schema({"type": "string", "minLength": 1, "maxLength": 3})

    assert str(_refused(validate, "", "q")) == "q: must not be empty"
    assert str(_refused(validate, "abcd", "q")) == "q: must be at most 3 characters"


def test_pattern_message_uses_the_schema_description() -> None:
    validate = _schema({"type": "string", "pattern": "^[1-9A-HJ-NP-Za-km-z]{32,44}$", "description": "mint"})

    assert validate(MINT, "mint") == MINT
    assert str(_refused(validate, "0OIl", "mint")) == "mint: must be a mint"


def test_prefix_items_then_items_check_each_position() -> None:
    validate = _schema(
        {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "prefixItems": [{"type": "string"}],
            "items": {"type": "integer"},
        }
    )

    assert validate(["a", 1, 2], "params") == ["a", 1, 2]
    assert str(_refused(validate, [1], "params")) == "params[0]: must be a string"
    assert str(_refused(validate, ["a", "b"], "params")) == "params[1]: must be an integer"
    assert str(_refused(validate, [], "params")) == "params: must have at least 1 item(s)"
    assert str(_refused(validate, ["a", 1, 2, 3], "params")) == "params: must have at most 3 item(s)"


def test_required_property_is_named() -> None:
    validate = _schema({"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}})

    error = _refused(validate, {}, "")
    assert (error.where, str(error)) == ("q", "q: is required")


def test_unknown_parameter_is_refused_when_closed() -> None:
    validate = _schema({"type": "object", "additionalProperties": False, "properties": {"a": {}}})

    error = _refused(validate, {"a": 1, "b": 2}, "")
    assert (error.where, str(error)) == ("b", "b: is not a known parameter")


def test_extra_parameter_is_kept_when_open() -> None:
    validate = _schema({"type": "object", "properties": {"a": {"type": "integer"}}})

    assert validate({"a": 1, "b": 2}, "") == {"a": 1, "b": 2}


# --- oneOf / anyOf of required groups ------------------------------------------------------------


def test_resolve_accepts_exactly_one_of_ref_or_mint(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "tokens.resolve")

    assert validator.query(_q(ref="solana")) == {"ref": "solana"}
    assert validator.query(_q(mint=MINT)) == {"mint": MINT}


@pytest.mark.parametrize("params", [{}, {"ref": "solana", "mint": MINT}])
def test_resolve_refuses_both_or_neither(routes: dict[str, RouteSpec], params: dict[str, str]) -> None:
    error = _refused(_validator(routes, "tokens.resolve").query, _q(**params))

    assert str(error) == "ref: exactly one of ref or mint must be given"


def test_any_of_needs_at_least_one_group(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "tokens.marketSnapshots")

    assert validator.body(b'{"addresses": ["a"], "mints": ["b"]}') == {"addresses": ["a"], "mints": ["b"]}
    assert str(_refused(validator.body, b"{}")) == "mints: at least one of mints or addresses must be given"


# --- x-comma-list ---------------------------------------------------------------------------------


def test_comma_list_becomes_a_list_of_valid_items(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "tokens.assetDetail")

    assert validator.query(_q(include="profile,risk")) == {"include": ["profile", "risk"]}


def test_comma_list_item_is_checked_by_position(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.assetDetail").query, _q(include="profile,gossip"))

    assert str(error) == "include[1]: must be one of profile, risk, ohlcv, markets"


@pytest.mark.parametrize("value", ["", "profile,", ",risk", "profile,,risk"])
def test_comma_list_with_an_empty_item_is_refused(routes: dict[str, RouteSpec], value: str) -> None:
    error = _refused(_validator(routes, "tokens.assetDetail").query, _q(include=value))

    assert str(error) == "include: must be a comma-separated list without empty items"


def test_comma_list_longer_than_max_items_is_refused(routes: dict[str, RouteSpec]) -> None:
    error = _refused(
        _validator(routes, "tokens.assetDetail").query, _q(include="profile,risk,ohlcv,markets,risk")
    )

    assert str(error) == "include: must list 1 to 4 items"


def test_comma_list_items_are_coerced_as_query_integers() -> None:
    validate = _schema(
        {"type": "string", "x-comma-list": {"items": {"type": "integer", "minimum": 0}}}, from_query=True
    )

    assert validate("1,20,300", "ids") == [1, 20, 300]
    assert str(_refused(validate, "1,02", "ids")) == "ids[1]: must be an integer"


# --- x-combined-count -----------------------------------------------------------------------------


def test_market_snapshots_take_up_to_250_ids_combined(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "tokens.marketSnapshots")
    body = msgspec.json.encode({"mints": ["m"] * 200, "addresses": ["a"] * 50})

    assert len(validator.body(body)["mints"]) == 200


def test_market_snapshots_refuse_251_ids_combined(routes: dict[str, RouteSpec]) -> None:
    body = msgspec.json.encode({"mints": ["m"] * 200, "addresses": ["a"] * 51})

    error = _refused(_validator(routes, "tokens.marketSnapshots").body, body)

    assert str(error) == "mints: mints plus addresses must hold 1 to 250 ids combined"


def test_market_snapshots_refuse_zero_ids(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.marketSnapshots").body, b'{"mints": []}')

    assert str(error) == "mints: mints plus addresses must hold 1 to 250 ids combined"


def test_variant_markets_cap_comma_lists_at_50_ids_combined(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "tokens.variantMarkets")
    ok = _q(mints=",".join([MINT] * 25), addresses=",".join([OTHER_MINT] * 25))
    too_many = _q(mints=",".join([MINT] * 25), addresses=",".join([OTHER_MINT] * 26))

    assert len(validator.query(ok)["addresses"]) == 25
    assert (
        str(_refused(validator.query, too_many))
        == "mints: mints plus addresses must hold 1 to 50 ids combined"
    )


# --- x-not-less-than ------------------------------------------------------------------------------


def test_to_before_from_is_refused(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.ohlcv").query, _q(**{"from": 100, "to": 99}))

    assert (error.where, str(error)) == ("to", "to: must be >= from")


@pytest.mark.parametrize("params", [{"from": 100, "to": 100}, {"to": 5}, {"from": 5}])
def test_to_not_before_from_is_accepted(routes: dict[str, RouteSpec], params: dict[str, int]) -> None:
    assert _validator(routes, "tokens.priceChart").query(_q(**params)) == params


def test_ohlcv_to_before_ohlcv_from_is_refused_on_asset_detail(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.assetDetail").query, _q(ohlcvFrom=10, ohlcvTo=9))

    assert str(error) == "ohlcvTo: must be >= ohlcvFrom"


# --- query strings --------------------------------------------------------------------------------


def test_duplicate_query_parameter_is_refused(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.search").query, b"q=sol&limit=5&q=eth")

    assert (error.where, str(error)) == ("q", "q: is given more than once")


def test_unknown_query_parameter_is_refused(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.search").query, b"q=sol&sort=asc")

    assert str(error) == "sort: is not a known parameter"


def test_percent_encoded_query_is_decoded_as_utf8(routes: dict[str, RouteSpec]) -> None:
    assert _validator(routes, "tokens.search").query(b"q=caf%C3%A9+au+lait") == {"q": "café au lait"}


def test_empty_query_value_is_not_taken_as_absent(routes: dict[str, RouteSpec]) -> None:
    assert str(_refused(_validator(routes, "tokens.search").query, b"q=")) == "q: must not be empty"


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), ("50", 50), ("-0", 0)])
def test_query_integer_in_plain_decimal_is_accepted(
    routes: dict[str, RouteSpec], text: str, value: int
) -> None:
    validator = _validator(routes, "tokens.tickers")

    assert validator.query(b"offset=" + text.encode()) == {"offset": value}


@pytest.mark.parametrize(
    "text", ["01", "007", "1e3", "1.0", "+1", " 1", "1 ", "0x10", "1_000", "", "\u0661", "1" + "0" * 19]
)
def test_query_integer_in_any_other_spelling_is_refused(routes: dict[str, RouteSpec], text: str) -> None:
    error = _refused(_validator(routes, "tokens.tickers").query, _q(offset=text))

    assert str(error) == "offset: must be an integer"


def test_negative_query_integer_is_a_range_error(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "tokens.tickers").query, b"offset=-1")

    assert str(error) == "offset: must be between 0 and 10000"


def test_integer_text_is_not_coerced_in_a_json_body() -> None:
    validate = _schema({"type": "object", "properties": {"limit": {"type": "integer"}}})

    assert str(_refused(validate, {"limit": "5"}, "")) == "limit: must be an integer"


def test_route_without_query_schema_reads_no_query(routes: dict[str, RouteSpec]) -> None:
    assert RequestValidator(routes["health"].input).query(b"anything=1") == {}


# --- path parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "asset_id",
    ["solana", "usd-coin", f"solana-{MINT}", "Solana", "usd_coin", "wrapped.eth", "-sol", "sol~1", "a" * 128],
)
def test_asset_id_accepts_what_an_upstream_id_can_be(routes: dict[str, RouteSpec], asset_id: str) -> None:
    assert _validator(routes, "tokens.profile").path({"assetId": asset_id}) == {"assetId": asset_id}


@pytest.mark.parametrize(
    "asset_id", [".", "..", "a/b", "a\\b", "sol\n", "sol\x00", "sol\x7f", "a b", "a%2Fb", "a" * 129, ""]
)
def test_asset_id_refuses_traversal_slashes_and_control_characters(
    routes: dict[str, RouteSpec], asset_id: str
) -> None:
    error = _refused(_validator(routes, "tokens.profile").path, {"assetId": asset_id})

    assert error.where == "assetId"


def test_a_pattern_ending_in_dollar_does_not_match_before_a_trailing_newline() -> None:
    validate = _schema({"type": "string", "pattern": "^[a-z]+$"})

    assert validate("abc", "x") == "abc"
    assert str(_refused(validate, "abc\n", "x")) == "x: has an invalid format"


# --- JSON bodies ----------------------------------------------------------------------------------


def test_rpc_body_is_checked_against_the_method_params(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "solana.mainnet.provider_a.rpc.getBalance")

    assert validator.body(b'{"params": ["%s"]}' % MINT.encode()) == {"params": [MINT]}
    assert (
        str(_refused(validator.body, b'{"params": ["nope"]}')) == "params[0]: must be a base58 Solana address"
    )


def test_rpc_body_naming_another_method_is_refused(routes: dict[str, RouteSpec]) -> None:
    validator = _validator(routes, "solana.mainnet.provider_a.rpc.getBalance")
    body = b'{"method": "getProgramAccounts", "params": ["%s"]}' % MINT.encode()

    assert str(_refused(validator.body, body)) == "method: must be 'getBalance'"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "body: a JSON body is required"),
        (b"  \n", "body: a JSON body is required"),
        (b"{", "body: is not valid JSON"),
    ],
)
def test_missing_or_broken_json_body_is_refused(
    routes: dict[str, RouteSpec], raw: bytes, message: str
) -> None:
    error = _refused(_validator(routes, "solana.devnet.provider_b.das.getAsset").body, raw)

    assert str(error) == message


DAS_GET_ASSET = "solana.mainnet.provider_a.das.getAsset"
DAS_BY_OWNER = "solana.mainnet.provider_b.das.getAssetsByOwner"
DAS_SEARCH = "solana.devnet.provider_b.das.searchAssets"


def _body(routes: dict[str, RouteSpec], name: str, body: Any) -> Any:
    return _validator(routes, name).body(msgspec.json.encode(body))


@pytest.mark.parametrize(
    "params",
    [[MINT], [{"id": MINT}], {"id": MINT}, [MINT, None]],
    ids=["positional", "named-in-array", "bare-object", "positional-null-option"],
)
def test_das_get_asset_takes_both_forms_and_yields_the_named_one(
    routes: dict[str, RouteSpec], params: Any
) -> None:
    assert _body(routes, DAS_GET_ASSET, {"params": params}) == {"params": {"id": MINT}}


def test_das_positional_options_land_on_their_names(routes: dict[str, RouteSpec]) -> None:
    params = [MINT, {"sortBy": "created", "sortDirection": "asc"}, 20, 2, None, None, {"showFungible": True}]

    assert _body(routes, DAS_BY_OWNER, {"params": params})["params"] == {
        "ownerAddress": MINT,
        "sortBy": {"sortBy": "created", "sortDirection": "asc"},
        "limit": 20,
        "page": 2,
        "options": {"showFungible": True},
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (["nope"], "params.id: must be a base58 Solana address"),
        ([{"id": "nope"}], "params.id: must be a base58 Solana address"),
        ({"id": "nope"}, "params.id: must be a base58 Solana address"),
        ([MINT, {"showFungible": "yes"}], "params.options.showFungible: must be a boolean"),
        (
            {"id": MINT, "displayOptions": {"showFungible": 1}},
            "params.options.showFungible: must be a boolean",
        ),
        (
            {"id": MINT, "options": {}, "displayOptions": {}},
            "params.displayOptions: give options or displayOptions, not both",
        ),
        ({"id": MINT, "show": True}, "params.show: is not a known parameter"),
        ([MINT, {}, 3], "params: takes at most 2 positional parameters (id, options)"),
        ([], "params.id: is required"),
        ("x", "params: must be an array or object"),
    ],
)
def test_das_forms_are_held_to_the_same_rules(
    routes: dict[str, RouteSpec], params: Any, message: str
) -> None:
    error = _refused(_body, routes, DAS_GET_ASSET, {"params": params})

    assert str(error) == message


def test_das_page_size_defaults_when_none_is_given_and_is_capped(routes: dict[str, RouteSpec]) -> None:
    assert _body(routes, DAS_SEARCH, {"params": {"ownerAddress": MINT}})["params"] == {
        "ownerAddress": MINT,
        "limit": 100,
    }
    assert _body(routes, DAS_BY_OWNER, {"params": [MINT]})["params"]["limit"] == 100
    assert _body(routes, DAS_BY_OWNER, {"params": [MINT, None, 1000]})["params"]["limit"] == 1000
    assert str(_refused(_body, routes, DAS_SEARCH, {"params": {"limit": 1001}})) == (
        "params.limit: must be between 1 and 1000"
    )
    assert str(_refused(_body, routes, DAS_BY_OWNER, {"params": [MINT, None, 10, 10001]})) == (
        "params.page: must be between 1 and 10000"
    )


def test_das_search_takes_the_documented_criteria(routes: dict[str, RouteSpec]) -> None:
    criteria = {
        "ownerAddress": MINT,
        "tokenType": "fungible",
        "grouping": ["collection", MINT],
        "burnt": False,
        "interface": "ProgrammableNFT",
        "sortBy": {"sortBy": "recent_action", "sortDirection": "desc"},
        "cursor": "abc",
        "options": {"showNativeBalance": True, "showGrandTotal": True, "showZeroBalance": False},
        "limit": 5,
    }

    assert _body(routes, DAS_SEARCH, {"params": criteria})["params"] == criteria
    assert str(_refused(_body, routes, DAS_SEARCH, {"params": {"conditionType": "most"}})) == (
        "params.conditionType: must be one of all, any"
    )
    assert str(_refused(_body, routes, DAS_SEARCH, {"params": [MINT]})) == (
        "params: takes named parameters only: an object, or an array holding one"
    )


def test_das_display_options_reach_the_provider_under_their_current_name(
    routes: dict[str, RouteSpec],
) -> None:
    body = {"params": [{"id": MINT, "displayOptions": {"showFungible": True}}]}

    assert _body(routes, DAS_GET_ASSET, body)["params"] == {"id": MINT, "options": {"showFungible": True}}


def test_unknown_top_level_body_fields_are_ignored(routes: dict[str, RouteSpec]) -> None:
    body = {"jsonrpc": "2.0", "id": 7, "method": "getAsset", "params": [MINT], "trace": {"x": 1}}

    assert _body(routes, DAS_GET_ASSET, body)["params"] == {"id": MINT}


def test_named_params_order_must_name_properties() -> None:
    schema = {"type": "object", "x-named-params": {"order": ["id", "idz"]}, "properties": {"id": {}}}

    with pytest.raises(SchemaError) as caught:
        check_schema(schema, "s")

    assert str(caught.value) == "s.x-named-params.order: ['idz'] are not properties of this schema"


def test_body_that_is_not_an_object_is_refused(routes: dict[str, RouteSpec]) -> None:
    error = _refused(_validator(routes, "solana.devnet.provider_b.das.getAsset").body, b"[1]")

    assert str(error) == "must be an object"


# --- the schema subset is checked at load time ------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "if": {}}, "s: unsupported schema keyword(s) ['if']"),
        ({"type": "integer32"}, "s.type: unknown type 'integer32'"),
        ({"type": "string", "pattern": "("}, "s.pattern: missing ), unterminated subpattern at position 0"),
        ({"properties": ["a", "b"]}, "s.properties: must map names to schemas"),
        (
            {"properties": {"a": {"maxLength": "3"}}},
            "s.properties.a.maxLength: must be a non-negative integer, got the text '3'",
        ),
        ({"minimum": "1"}, "s.minimum: must be a number, got the text '1'"),
        ({"enum": "abc"}, "s.enum: must be a list, got the text 'abc'"),
        ({"required": "q"}, "s.required: must be a list, got the text 'q'"),
        (
            {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "s.oneOf[0]: only {required: [names]} groups are supported",
        ),
        ({"anyOf": [{"required": []}]}, "s.anyOf[0]: only {required: [names]} groups are supported"),
        ({"x-not-less-than": ["to", "from"]}, "s.x-not-less-than: must map a property name to another"),
        ({"x-comma-list": {"maxItems": 3}}, "s.x-comma-list: needs an items schema"),
        (
            {"x-comma-list": {"items": {}, "maxItems": "3"}},
            "s.x-comma-list.maxItems: must be a non-negative integer, got the text '3'",
        ),
        ({"x-combined-count": {"min": 1}}, "s.x-combined-count: needs fields, min and max"),
        (
            {"x-combined-count": {"fields": ["a"], "max": "9"}},
            "s.x-combined-count: needs fields, min and max",
        ),
    ],
)
def test_schema_outside_the_subset_is_refused(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as caught:
        check_schema(schema, "s")

    assert str(caught.value) == message


def test_every_packaged_schema_is_inside_the_subset(routes: dict[str, RouteSpec]) -> None:
    for route in routes.values():
        for location, schema in route.input.items():
            check_schema(schema, f"{route.name}.{location}")
        if route.output is not None:
            check_schema(route.output, f"{route.name}.output")
