"""Configuration: every variable, its default, one message for every problem, no secret.

Start-up stops for a malformed value and for every required variable a served route group lacks;
a group is off only when ROUTE_GROUPS leaves it out, and that is one warning per group.
"""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any

import base58
import pytest
from solders.keypair import Keypair

from gateway.config import (
    CDP_FACILITATOR_URL,
    PACKAGED_ROUTES_FILE,
    PUBLIC_MAINNET_RPC_URL,
    ConfigError,
    load_settings,
    startup_notes,
)
from gateway.routing.plan import RoutePlan, plan_routes, route_plan
from gateway.routing.routes import load_routes, named_limits
from gateway.x402.types import USDC_MAINNET_MINT

BASE = {"GATEWAY_BASE_URL": "https://gateway.example.com"}
PAY_TO = str(Keypair().pubkey())

# Values a leak would be recognised by: each secret variable carries a unique marker.
SECRET_MARKERS = {
    "PROVIDER_A_MAINNET_RPC_URL": "https://a.example/v2/?api-key=LEAK-A-MAINNET",
    "PROVIDER_A_DEVNET_RPC_URL": "https://a.example/v2/?api-key=LEAK-A-DEVNET",
    "PROVIDER_B_MAINNET_RPC_URL": "https://b.example/LEAK-B-MAINNET",
    "PROVIDER_B_DEVNET_RPC_URL": "https://b.example/LEAK-B-DEVNET",
    "SOLANA_MAINNET_RPC_URL": "https://rpc.example/LEAK-SOLANA-RPC",
    "ASSET_API_KEY": "LEAK-ASSET-KEY",
    "STATE_STORE_REST_URL": "redis://:LEAK-STORE-PASSWORD@127.0.0.1:6379/0",
    "STATE_STORE_REST_TOKEN": "LEAK-STORE-TOKEN",
    "INTERNAL_SETTLEMENT_SECRET": "LEAK-INTERNAL-SECRET-0123456789abcdef",
    "SIWX_SECRET": "LEAK-SIWX-SECRET-0123456789abcdef0123",
}


def _wallet_base58() -> str:
    return base58.b58encode(bytes(Keypair())).decode()


def _cdp_secret() -> str:
    return base64.b64encode(bytes(Keypair())).decode()


def _problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    return caught.value.problems


# --- defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "default"),
    [
        ("port", 8080),
        ("facilitator_url", CDP_FACILITATOR_URL),
        ("facilitator_api_key_id", ""),
        ("pay_to", ""),
        ("usdc_mint", USDC_MAINNET_MINT),
        ("rate_limit_rpc_rps", 50),
        ("rate_limit_das_rps", 10),
        ("rate_limit_tokens_per_minute", 30),
        ("rate_limit_challenge_per_minute", 120),
        ("upstreams", {}),
        ("routes_file", PACKAGED_ROUTES_FILE),
        ("upstream_timeout_s", 15.0),
        ("max_body_bytes", 65536),
        ("trusted_proxies", ()),
        ("log_level", "INFO"),
        ("facilitator_down_s", 30.0),
        ("facilitator_probe_s", 5.0),
    ],
)
def test_default_when_only_base_url_is_set(attribute: str, default: Any) -> None:
    settings = load_settings(BASE)

    assert getattr(settings, attribute) == default


def test_usdc_mint_default_is_the_mainnet_usdc_mint() -> None:
    assert load_settings(BASE).usdc_mint == "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"


def test_solana_mainnet_rpc_defaults_to_the_public_endpoint() -> None:
    settings = load_settings(BASE)

    assert (
        settings.solana_mainnet_rpc_url.reveal()
        == PUBLIC_MAINNET_RPC_URL
        == ("https://api.mainnet-beta.solana.com")
    )


@pytest.mark.parametrize(
    "attribute",
    [
        "facilitator_api_key_secret",
        "asset_api_key",
        "store_url",
        "store_token",
        "internal_secret",
        "facilitator_wallet",
        "siwx_secret",
    ],
)
def test_unset_secret_defaults_to_empty(attribute: str) -> None:
    assert not getattr(load_settings(BASE), attribute)


def test_base_url_loses_its_trailing_slash() -> None:
    assert load_settings({"GATEWAY_BASE_URL": "https://gw.example.com/x402/"}).base_url == (
        "https://gw.example.com/x402"
    )


# --- every variable is read ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "attribute", "expected"),
    [
        ("PORT", "9090", "port", 9090),
        ("FACILITATOR_URL", "https://facilitator.example/x402", "facilitator_url", None),
        ("FACILITATOR_URL", "internal", "facilitator_url", None),
        ("X402_PAY_TO_WALLET", PAY_TO, "pay_to", None),
        ("X402_USDC_MINT", PAY_TO, "usdc_mint", None),
        ("RATE_LIMIT_RPC_RPS", "7", "rate_limit_rpc_rps", 7),
        ("RATE_LIMIT_DAS_RPS", "3", "rate_limit_das_rps", 3),
        ("RATE_LIMIT_TOKENS_PER_MINUTE", "11", "rate_limit_tokens_per_minute", 11),
        ("RATE_LIMIT_CHALLENGE_PER_MINUTE", "99", "rate_limit_challenge_per_minute", 99),
        ("UPSTREAM_TIMEOUT_SECONDS", "2.5", "upstream_timeout_s", 2.5),
        ("STATE_STORE_TIMEOUT_SECONDS", "7.5", "store_timeout_s", 7.5),
        ("MAX_BODY_BYTES", "4096", "max_body_bytes", 4096),
        ("RPC_BATCH_MAX_ITEMS", "5", "rpc_batch_max_items", 5),
        ("LOG_LEVEL", "debug", "log_level", "DEBUG"),
        ("FACILITATOR_API_KEY_ID", "key-id", "facilitator_api_key_id", None),
        ("FACILITATOR_SETTLEMENT_FEE_MICRO_USDC", "1500", "facilitator_settlement_fee_micro_usdc", 1500),
        ("FACILITATOR_DOWN_SECONDS", "12.5", "facilitator_down_s", 12.5),
        ("FACILITATOR_PROBE_SECONDS", "2", "facilitator_probe_s", 2.0),
    ],
    # A random wallet must not name the test: parallel workers collect the same ids.
    ids=lambda value: "wallet" if value == PAY_TO else None,
)
def test_plain_variable_is_read(variable: str, value: str, attribute: str, expected: Any) -> None:
    env = {**BASE, variable: value}
    if variable == "FACILITATOR_API_KEY_ID":
        env["FACILITATOR_API_KEY_SECRET"] = _cdp_secret()

    assert getattr(load_settings(env), attribute) == (value if expected is None else expected)


@pytest.mark.parametrize(
    ("variable", "attribute"),
    [
        ("SOLANA_MAINNET_RPC_URL", "solana_mainnet_rpc_url"),
        ("ASSET_API_KEY", "asset_api_key"),
        ("STATE_STORE_REST_URL", "store_url"),
        ("STATE_STORE_REST_TOKEN", "store_token"),
        ("INTERNAL_SETTLEMENT_SECRET", "internal_secret"),
        ("SIWX_SECRET", "siwx_secret"),
    ],
)
def test_secret_variable_is_read(variable: str, attribute: str) -> None:
    settings = load_settings({**BASE, variable: SECRET_MARKERS[variable]})

    assert getattr(settings, attribute).reveal() == SECRET_MARKERS[variable]


def test_facilitator_wallet_is_read() -> None:
    wallet = _wallet_base58()

    assert load_settings({**BASE, "FACILITATOR_WALLET_BASE58": wallet}).facilitator_wallet.reveal() == wallet


def test_facilitator_api_key_secret_is_read() -> None:
    secret = _cdp_secret()
    env = {**BASE, "FACILITATOR_API_KEY_ID": "id", "FACILITATOR_API_KEY_SECRET": secret}

    assert load_settings(env).facilitator_api_key_secret.reveal() == secret


@pytest.mark.parametrize(
    ("variable", "upstream"),
    [
        ("PROVIDER_A_MAINNET_RPC_URL", "provider_a_mainnet"),
        ("PROVIDER_A_DEVNET_RPC_URL", "provider_a_devnet"),
        ("PROVIDER_B_MAINNET_RPC_URL", "provider_b_mainnet"),
        ("PROVIDER_B_DEVNET_RPC_URL", "provider_b_devnet"),
        ("ASSET_API_BASE_URL", "asset_api"),
    ],
)
def test_upstream_url_is_read(variable: str, upstream: str) -> None:
    url = "https://upstream.example/v1/?api-key=k"

    assert load_settings({**BASE, variable: url}).upstream_url(upstream) == url


def test_trusted_proxies_are_parsed_as_networks() -> None:
    settings = load_settings({**BASE, "TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.7 ,::1"})

    assert settings.trusted_proxies == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.168.1.7/32"),
        ipaddress.ip_network("::1/128"),
    )


def test_an_ipv6_client_is_keyed_by_its_slash_64_unless_configured() -> None:
    assert load_settings(BASE).client_ipv6_prefix_length == 64
    assert load_settings({**BASE, "CLIENT_IPV6_PREFIX_LENGTH": "56"}).client_ipv6_prefix_length == 56


def test_routes_file_is_read(tmp_path: Path) -> None:
    table = tmp_path / "routes.yaml"
    table.write_text("routes: []\n")

    assert load_settings({**BASE, "ROUTES_FILE": str(table)}).routes_file == table


# --- problems ------------------------------------------------------------------------------------


def test_missing_base_url_is_a_config_error() -> None:
    problems = _problems({})

    assert len(problems) == 1
    assert problems[0].startswith("GATEWAY_BASE_URL is required")


@pytest.mark.parametrize(
    "base_url",
    [
        "gateway.example.com",
        "/relative",
        "ftp://gateway.example.com",
        "https://gateway.example.com/?x=1",
        "https://gateway.example.com/#top",
        "https://user:pw@gateway.example.com",
        "http://[::1",
    ],
)
def test_invalid_base_url_is_a_config_error(base_url: str) -> None:
    problems = _problems({"GATEWAY_BASE_URL": base_url})

    assert len(problems) == 1
    assert problems[0].startswith("GATEWAY_BASE_URL must be an absolute http(s) URL")


@pytest.mark.parametrize("value", ["abc", "80_80", "+8080", "8080.0", "\uff18\uff10\uff18\uff10", "1e3"])
def test_malformed_integer_is_a_config_error(value: str) -> None:
    assert _problems({**BASE, "PORT": value}) == [f"PORT must be an integer, got {value!r}"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PORT", "0"),
        ("PORT", "65536"),
        ("RATE_LIMIT_RPC_RPS", "0"),
        ("MAX_BODY_BYTES", "10"),
        ("RPC_BATCH_MAX_ITEMS", "0"),
        ("RPC_BATCH_MAX_ITEMS", "101"),
        ("FACILITATOR_SETTLEMENT_FEE_MICRO_USDC", "-1"),
        ("FACILITATOR_SETTLEMENT_FEE_MICRO_USDC", "1000001"),
        ("CLIENT_IPV6_PREFIX_LENGTH", "31"),
        ("CLIENT_IPV6_PREFIX_LENGTH", "129"),
    ],
)
def test_integer_out_of_range_is_a_config_error(variable: str, value: str) -> None:
    (problem,) = _problems({**BASE, variable: value})

    assert problem.startswith(f"{variable} must be between")


def test_an_external_facilitators_settlement_fee_defaults_to_none() -> None:
    assert load_settings(BASE).facilitator_settlement_fee_micro_usdc == 0


def test_a_settlement_fee_for_the_internal_facilitator_is_refused_naming_where_its_fee_is_set() -> None:
    env = {**BASE, "FACILITATOR_URL": "internal", "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "0"}

    assert _problems(env) == [
        "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC is an external facilitator's fee: with "
        "FACILITATOR_URL=internal the fee is routes.yaml's pricing.settlement_fee_micro_usdc; unset it"
    ]


@pytest.mark.parametrize(
    ("down", "probe"),
    [("8", "5"), ("4", "1"), ("", "27"), ("3", "")],
    ids=["8-5", "4-1", "default-27", "3-default"],
)
def test_a_down_mark_that_lapses_before_the_next_probe_has_answered_is_refused(down: str, probe: str) -> None:
    env = {**BASE, "FACILITATOR_DOWN_SECONDS": down, "FACILITATOR_PROBE_SECONDS": probe}

    assert _problems(env) == [
        "FACILITATOR_DOWN_SECONDS must exceed FACILITATOR_PROBE_SECONDS plus the probe's 3 s timeout, "
        "or a dead facilitator is offered first between two probes"
    ]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FACILITATOR_DOWN_SECONDS", "0.5"),
        ("FACILITATOR_DOWN_SECONDS", "3601"),
        ("FACILITATOR_PROBE_SECONDS", "0.1"),
        ("STATE_STORE_TIMEOUT_SECONDS", "0.05"),
        ("STATE_STORE_TIMEOUT_SECONDS", "31"),
    ],
)
def test_timing_settings_out_of_range_are_a_config_error(variable: str, value: str) -> None:
    assert any(p.startswith(f"{variable} must be between") for p in _problems({**BASE, variable: value}))


@pytest.mark.parametrize("value", ["fast", "1_5", "nan", "inf", "-1", "0", "301"])
def test_bad_upstream_timeout_is_a_config_error(value: str) -> None:
    (problem,) = _problems({**BASE, "UPSTREAM_TIMEOUT_SECONDS": value})

    assert problem.startswith("UPSTREAM_TIMEOUT_SECONDS must be")


@pytest.mark.parametrize("variable", ["X402_PAY_TO_WALLET", "X402_USDC_MINT"])
def test_invalid_solana_address_is_a_config_error(variable: str) -> None:
    assert _problems({**BASE, variable: "not-a-pubkey"}) == [f"{variable} is not a valid Solana address"]


def test_unknown_log_level_is_a_config_error() -> None:
    (problem,) = _problems({**BASE, "LOG_LEVEL": "chatty"})

    assert problem.startswith("LOG_LEVEL must be one of")


def test_bad_trusted_proxy_entry_is_a_config_error() -> None:
    (problem,) = _problems({**BASE, "TRUSTED_PROXIES": "10.0.0.0/8,proxy.internal"})

    assert "TRUSTED_PROXIES entry 'proxy.internal'" in problem


def test_store_url_with_unknown_scheme_is_a_config_error() -> None:
    (problem,) = _problems({**BASE, "STATE_STORE_REST_URL": "postgres://db/1"})

    assert problem.startswith("STATE_STORE_REST_URL must start with")
    assert "redis+cluster://" in problem


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://10.0.0.1:7000",
        "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000",
        "rediss+cluster://user:s3cret@cache.example:6380",
    ],
)
def test_a_redis_cluster_url_is_a_shared_store_url(url: str) -> None:
    settings = load_settings({**BASE, "STATE_STORE_REST_URL": url})

    assert settings.store_url.reveal() == url and settings.persistent_store


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://:s3cret@10.0.0.1",
        "redis+cluster://10.0.0.1:7000,",
        "redis+cluster://10.0.0.1:70000",
        "redis+cluster://10.0.0.1:7000/2",
    ],
)
def test_a_cluster_url_without_its_nodes_is_a_config_error_naming_no_secret(url: str) -> None:
    (problem,) = _problems({**BASE, "STATE_STORE_REST_URL": url})

    assert problem.startswith("STATE_STORE_REST_URL must") and "s3cret" not in problem


def test_missing_routes_file_is_a_config_error(tmp_path: Path) -> None:
    (problem,) = _problems({**BASE, "ROUTES_FILE": str(tmp_path / "absent.yaml")})

    assert problem.startswith("ROUTES_FILE") and "does not exist" in problem


def test_a_directory_as_routes_file_is_reported_as_a_directory(tmp_path: Path) -> None:
    (problem,) = _problems({**BASE, "ROUTES_FILE": str(tmp_path)})

    assert problem == f"ROUTES_FILE {str(tmp_path)!r} is a directory, not a route table file"


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        ("gw.example.com", "gw.example.com"),
        ("ftp://gw.example.com", "ftp://gw.example.com"),
        ("https://gw.example.com/?key=LEAK", "https://gw.example.com/?***"),
        ("https://user:LEAK@gw.example.com", "https://***@gw.example.com"),
    ],
)
def test_a_malformed_base_url_is_echoed_as_typed_with_secrets_redacted(typed: str, shown: str) -> None:
    (problem,) = _problems({"GATEWAY_BASE_URL": typed})

    assert problem.endswith(f"got {shown!r}")
    assert "LEAK" not in problem


def test_short_siwx_secret_is_a_config_error() -> None:
    (problem,) = _problems({**BASE, "SIWX_SECRET": "short"})

    assert problem.startswith("SIWX_SECRET must be at least 32 characters")


def test_facilitator_wallet_as_json_array_is_refused() -> None:
    array = str(list(bytes(Keypair())))

    (problem,) = _problems({**BASE, "FACILITATOR_WALLET_BASE58": array})

    assert "JSON array" in problem


def test_internal_facilitator_keys_are_checked_at_start_up_without_echoing_them() -> None:
    wallet = _wallet_base58()

    (problem,) = _problems({**BASE, "FACILITATOR_WALLET_BASE58": wallet[:-4]})
    notes = startup_notes(load_settings({**BASE, "INTERNAL_SETTLEMENT_SECRET": "too-short"}))

    assert "FACILITATOR_WALLET_BASE58" in problem and wallet[:-4] not in problem
    assert "INTERNAL_SETTLEMENT_SECRET is shorter than 32 characters: use a longer random secret" in notes


def test_a_trusted_subnet_wider_than_a_slash_24_is_noted_at_start_up() -> None:
    wide = startup_notes(load_settings({**BASE, "TRUSTED_PROXIES": "10.0.0.0/8, 172.30.80.2, 10.9.8.0/24"}))
    narrow = startup_notes(load_settings({**BASE, "TRUSTED_PROXIES": "172.30.80.2, 10.9.8.0/24, fd00::/120"}))

    assert [n for n in wide if n.startswith("TRUSTED_PROXIES")] == [
        "TRUSTED_PROXIES 10.0.0.0/8 trusts 16,777,216 addresses: any of them that a client can send "
        "from picks its own rate-limit bucket; name only your proxy's addresses"
    ]
    assert not [n for n in narrow if n.startswith("TRUSTED_PROXIES")]


def test_every_problem_is_listed_in_one_message() -> None:
    env = {
        "PORT": "eighty",
        "PROVIDER_A_MAINNET_RPC_URL": "not a url",
        "RATE_LIMIT_DAS_RPS": "-5",
        "X402_PAY_TO_WALLET": "nope",
        "LOG_LEVEL": "loud",
        "TRUSTED_PROXIES": "nowhere",
    }

    with pytest.raises(ConfigError) as caught:
        load_settings(env)

    message = str(caught.value)
    named = [
        "GATEWAY_BASE_URL",
        "PORT",
        "PROVIDER_A_MAINNET_RPC_URL",
        "RATE_LIMIT_DAS_RPS",
        "X402_PAY_TO_WALLET",
        "LOG_LEVEL",
        "TRUSTED_PROXIES",
    ]
    assert len(caught.value.problems) == len(named)
    assert all(name in message for name in named)
    assert message.startswith("invalid configuration:\n")


# --- secrets never print -------------------------------------------------------------------------


def test_malformed_secret_values_never_appear_in_the_message() -> None:
    env = {
        "GATEWAY_BASE_URL": "https://gateway.example.com/?api-key=LEAK-BASE-QUERY",
        "PROVIDER_A_MAINNET_RPC_URL": "ftp://a.example/?api-key=LEAK-A-MAINNET",
        "PROVIDER_B_DEVNET_RPC_URL": "LEAK-B-DEVNET-not-a-url",
        "SOLANA_MAINNET_RPC_URL": "LEAK-SOLANA-RPC",
        "ASSET_API_BASE_URL": "gopher://LEAK-ASSET-HOST",
        "SIWX_SECRET": "LEAK-SIWX",
        "FACILITATOR_WALLET_BASE58": "LEAK0WALLET0lI",
        "FACILITATOR_API_KEY_ID": "key-id",
        "FACILITATOR_API_KEY_SECRET": "LEAK-CDP-SECRET",
    }

    with pytest.raises(ConfigError) as caught:
        load_settings(env)

    assert len(caught.value.problems) == 8
    assert "LEAK" not in str(caught.value)


def test_repr_of_settings_never_shows_a_secret() -> None:
    wallet, cdp_secret = _wallet_base58(), _cdp_secret()
    env = {
        **BASE,
        **SECRET_MARKERS,
        "FACILITATOR_WALLET_BASE58": wallet,
        "FACILITATOR_API_KEY_ID": "key-id",
        "FACILITATOR_API_KEY_SECRET": cdp_secret,
    }
    settings = load_settings(env)

    shown = repr(settings) + str(settings)

    assert "LEAK" not in shown
    assert wallet not in shown
    assert cdp_secret not in shown
    assert "api-key" not in shown


# --- required settings: every group is served unless ROUTE_GROUPS switches it off ------------------

PAID_ENV = {
    **BASE,
    "X402_PAY_TO_WALLET": PAY_TO,
    "FACILITATOR_URL": "internal",
    "FACILITATOR_WALLET_BASE58": base58.b58encode(bytes(Keypair())).decode(),
    "PROVIDER_A_MAINNET_RPC_URL": "https://a.example/k",
    "PROVIDER_A_DEVNET_RPC_URL": "https://a-dev.example/k",
    "PROVIDER_B_MAINNET_RPC_URL": "https://b.example/k",
    "PROVIDER_B_DEVNET_RPC_URL": "https://b-dev.example/k",
}
ALL_ENV = {**PAID_ENV, "ASSET_API_BASE_URL": "https://assets.example", "ASSET_API_KEY": "k"}


def _plan(env: dict[str, str]) -> RoutePlan:
    settings = load_settings(env)
    return route_plan(load_routes(settings.routes_file, named_limits(settings)), settings)


def _groups(plan: RoutePlan) -> set[str]:
    return {r.group for r in plan.mounted}


def test_every_group_is_served_when_everything_is_set() -> None:
    plan = _plan(ALL_ENV)

    assert (_groups(plan), plan.warnings, plan.problems) == (
        {"service", "internal", "provider_a", "provider_b", "tokens"},
        [],
        [],
    )


def test_only_base_url_lists_every_missing_required_variable_at_once() -> None:
    problems = _plan(BASE).problems

    assert sorted(p.split(" ", 1)[0] for p in problems) == sorted(
        [
            "ASSET_API_BASE_URL",
            "ASSET_API_KEY",
            "PROVIDER_A_MAINNET_RPC_URL",
            "PROVIDER_A_DEVNET_RPC_URL",
            "PROVIDER_B_MAINNET_RPC_URL",
            "PROVIDER_B_DEVNET_RPC_URL",
            "X402_PAY_TO_WALLET",
            "FACILITATOR_API_KEY_ID",
            "FACILITATOR_API_KEY_SECRET",
        ]
    )
    assert (
        "X402_PAY_TO_WALLET is required by route group provider_a, provider_b (set it, or switch the group "
        "off with ROUTE_GROUPS, now unset: every group)"
    ) in problems


def test_plan_routes_refuses_to_start_without_a_required_variable() -> None:
    settings = load_settings({**ALL_ENV, "ASSET_API_KEY": ""})

    with pytest.raises(ConfigError) as caught:
        plan_routes(load_routes(settings.routes_file, named_limits(settings)), settings)

    assert [p.split(" ", 1)[0] for p in caught.value.problems] == ["ASSET_API_KEY"]


def test_the_internal_facilitator_needs_its_wallet_not_an_api_key() -> None:
    env = {**ALL_ENV, "FACILITATOR_WALLET_BASE58": ""}

    assert [p.split(" ", 1)[0] for p in _plan(env).problems] == ["FACILITATOR_WALLET_BASE58"]


def test_an_external_facilitator_needs_its_api_key() -> None:
    env = {**ALL_ENV, "FACILITATOR_URL": "https://facilitator.example", "FACILITATOR_WALLET_BASE58": ""}

    assert sorted(p.split(" ", 1)[0] for p in _plan(env).problems) == [
        "FACILITATOR_API_KEY_ID",
        "FACILITATOR_API_KEY_SECRET",
    ]


def test_a_group_switched_off_needs_nothing_and_is_a_warning_with_the_reason() -> None:
    env = {**PAID_ENV, "ROUTE_GROUPS": "provider_a,provider_b"}

    plan = _plan(env)

    assert plan.problems == []
    assert _groups(plan) == {"service", "internal", "provider_a", "provider_b"}
    assert plan.warnings == [
        "route group tokens is off (19 route(s) not served): ROUTE_GROUPS=provider_a,provider_b leaves it out"
    ]


def test_route_groups_none_serves_only_the_service_and_internal_routes() -> None:
    plan = _plan({**BASE, "ROUTE_GROUPS": "none"})

    assert plan.problems == []
    assert _groups(plan) == {"service", "internal"}
    assert sorted(plan.warnings) == [
        "route group provider_a is off (15 route(s) not served): ROUTE_GROUPS=none leaves it out",
        "route group provider_b is off (18 route(s) not served): ROUTE_GROUPS=none leaves it out",
        "route group tokens is off (19 route(s) not served): ROUTE_GROUPS=none leaves it out",
    ]


def test_route_groups_all_is_the_default() -> None:
    assert _groups(_plan({**ALL_ENV, "ROUTE_GROUPS": "all"})) == _groups(_plan(ALL_ENV))


def test_an_unknown_route_group_is_a_problem_naming_the_real_ones() -> None:
    problems = _plan({**BASE, "ROUTE_GROUPS": "tokens,provider_c"}).problems

    assert (
        "ROUTE_GROUPS names unknown group(s) provider_c "
        "(the route groups are credits, provider_a, provider_b, tokens; or all, or none)"
    ) in problems


def test_a_malformed_route_group_entry_is_a_config_error() -> None:
    (problem,) = _problems({**BASE, "ROUTE_GROUPS": "tokens,pro vider"})

    assert problem == "ROUTE_GROUPS entry 'pro vider' is not a route group name"
