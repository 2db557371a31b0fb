"""``x402-gateway check | routes | serve`` as processes of their own: reports, start-up, shutdown, and
log lines. Short commands run forked from the CLI's fork server (``run_cli``); one ``check`` and
one ``routes`` go through the console script in a fresh interpreter (``run_script``), as do the
``serve`` tests (``script=True``) and the closed-pipe tests, which are about the process itself."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import base58
import pytest
from solders.keypair import Keypair

from tests.support import gateway_process
from tests.support.gateway_process import clean_env, run_cli, run_script, serve
from tests.support.ports import free_port

PAY_TO = str(Keypair().pubkey())
# Every secret carries the marker LEAK so one search finds any of them in any output.
SECRET_ENV = {
    "FACILITATOR_URL": "http://127.0.0.1:9/",
    "X402_PAY_TO_WALLET": PAY_TO,
    "PROVIDER_A_MAINNET_RPC_URL": "http://127.0.0.1:9/v2/LEAKPATHA/?api-key=LEAKKEYA",
    "PROVIDER_A_DEVNET_RPC_URL": "http://127.0.0.1:9/v2/?api-key=LEAKKEYADEV",
    "PROVIDER_B_MAINNET_RPC_URL": "http://LEAKUSER:LEAKPASS@127.0.0.1:9/LEAKKEYB",
    "PROVIDER_B_DEVNET_RPC_URL": "http://127.0.0.1:9/LEAKKEYBDEV",
    "SOLANA_MAINNET_RPC_URL": "http://127.0.0.1:9/?api-key=LEAKSOLANA",
    "ASSET_API_BASE_URL": "http://127.0.0.1:9/assets",
    "ASSET_API_KEY": "LEAKASSETKEY",
    "STATE_STORE_REST_TOKEN": "LEAKSTORETOKEN",
    "INTERNAL_SETTLEMENT_SECRET": "LEAK-internal-secret-0123456789abcdef",
    "SIWX_SECRET": "LEAK-siwx-secret-0123456789abcdef0123456",
    "FACILITATOR_API_KEY_ID": "LEAKKEYID",
    "FACILITATOR_API_KEY_SECRET": base64.b64encode(bytes(Keypair())).decode(),
}
SERVICE_ONLY = {"ROUTE_GROUPS": "none"}
REQUIRED = [
    "ASSET_API_BASE_URL",
    "ASSET_API_KEY",
    "FACILITATOR_API_KEY_ID",
    "FACILITATOR_API_KEY_SECRET",
    "PROVIDER_A_DEVNET_RPC_URL",
    "PROVIDER_A_MAINNET_RPC_URL",
    "PROVIDER_B_DEVNET_RPC_URL",
    "PROVIDER_B_MAINNET_RPC_URL",
    "X402_PAY_TO_WALLET",
]
"""What a gateway serving every route group needs beyond GATEWAY_BASE_URL."""


def _listed(stderr: str) -> list[str]:
    """The variable each ``  - `` line of a configuration error starts with."""
    return sorted(line[4:].split(" ", 1)[0] for line in stderr.splitlines() if line.startswith("  - "))


def _request(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- check -------------------------------------------------------------------------------------------


def test_check_with_a_malformed_variable_prints_one_message_and_exits_1() -> None:
    result = run_cli(
        {
            "GATEWAY_BASE_URL": "https://gw.example",
            "PORT": "http",
            "RATE_LIMIT_RPC_RPS": "lots",
            **SERVICE_ONLY,
        },
        "check",
    )

    assert result.returncode == 1
    assert result.stderr == (
        "invalid configuration:\n"
        "  - PORT must be an integer, got 'http'\n"
        "  - RATE_LIMIT_RPC_RPS must be an integer, got 'lots'\n"
    )
    assert result.stdout == ""


def test_check_without_any_configuration_lists_every_required_variable_at_once() -> None:
    result = run_cli({}, "check")

    assert result.returncode == 1
    assert _listed(result.stderr) == sorted(["GATEWAY_BASE_URL", *REQUIRED])
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_check_echoes_a_malformed_base_url_as_typed() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "gw.example.com", **SERVICE_ONLY}, "check")

    assert result.returncode == 1
    assert result.stderr == (
        "invalid configuration:\n"
        "  - GATEWAY_BASE_URL must be an absolute http(s) URL without query, fragment or credentials, "
        "got 'gw.example.com'\n"
    )


def test_check_never_prints_a_malformed_secret() -> None:
    env = {
        "GATEWAY_BASE_URL": "https://gw.example",
        "PROVIDER_A_MAINNET_RPC_URL": "LEAKKEYA-not-a-url",
        "FACILITATOR_WALLET_BASE58": "LEAK0WALLET",
    }

    result = run_cli(env, "check")

    assert result.returncode == 1
    assert "PROVIDER_A_MAINNET_RPC_URL" in result.stderr and "FACILITATOR_WALLET_BASE58" in result.stderr
    assert "LEAK" not in result.stderr + result.stdout


INTERNAL_ENV = {
    **SECRET_ENV,
    "FACILITATOR_URL": "internal",
    "FACILITATOR_WALLET_BASE58": base58.b58encode(bytes(Keypair())).decode(),
}
"""SECRET_ENV settling through the internal facilitator: our own fee payer pays the Solana fees."""


def _lines(stdout: str, prefix: str) -> list[str]:
    return [row for row in stdout.splitlines() if row.startswith(prefix)]


def _table(stdout: str) -> list[list[str]]:
    """The route table after the first blank line, each row split on whitespace."""
    return [row.split() for row in stdout.split("\n\n", 1)[1].splitlines()]


def test_check_prints_the_worst_case_settlement_fee_against_the_internal_facilitators_fee() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example", **INTERNAL_ENV}, "check")

    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout, "settlement:") == [
        "settlement: worst case 11000 lamports per settlement (2 signatures + compute caps "
        "50000 CU x 20000 micro-lamports/CU); the settlement fee of every price, 2200 micro-USDC, "
        "covers 11000 lamports at the SOL price routes.yaml states"
    ]
    assert _lines(result.stdout, "prices:") == [
        "prices: provider part + 2200 micro-USDC settlement fee of the internal facilitator "
        "(routes.yaml pricing.settlement_fee_micro_usdc: our fee payer pays the Solana fees)"
    ]
    table = _table(result.stdout)
    assert table[0][:5] == ["METHOD", "ACCESS", "PRICE(uUSDC)", "PROVIDER", "FEE"]
    assert ["POST", "exact", "2416", "216", "2200", "216"] in [
        row[:6] for row in table if row[-1].endswith("/searchAssets")
    ]


def test_check_with_an_external_facilitator_prices_its_configured_fee_only() -> None:
    env = {
        "GATEWAY_BASE_URL": "https://gw.example",
        **SECRET_ENV,
        "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "300",
    }

    result = run_cli(env, "check")

    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout, "settlement:") == [
        "settlement: the external facilitator pays the Solana fees; our fee payer pays none"
    ]
    assert _lines(result.stdout, "prices:") == [
        "prices: provider part + 300 micro-USDC settlement fee of the external facilitator "
        "http://127.0.0.1:9 (FACILITATOR_SETTLEMENT_FEE_MICRO_USDC: it pays the Solana fees); "
        "with FACILITATOR_URL=internal the fee is 2200 micro-USDC "
        "(routes.yaml pricing.settlement_fee_micro_usdc)"
    ]
    balance = [row for row in _table(result.stdout) if row[-1].endswith("/mainnet/provider_a/rpc/getBalance")]
    assert [row[:5] for row in balance] == [["POST", "exact", "305", "5", "300"]]


def test_serve_refuses_compute_caps_under_which_a_settlement_costs_more_than_it_earns() -> None:
    env = {"GATEWAY_BASE_URL": "https://gw.example", **INTERNAL_ENV, "X402_MAX_COMPUTE_UNIT_PRICE": "5000000"}

    for command in ("check", "serve"):
        result = run_cli(env, command)
        assert result.returncode == 1, result.stdout
        assert (
            "one settlement can cost the fee payer 260000 lamports under X402_MAX_COMPUTE_UNIT_LIMIT=50000 "
            "and X402_MAX_COMPUTE_UNIT_PRICE=5000000, but the internal facilitator's settlement fee of "
            "2200 micro-USDC earns only 11000 lamports at the SOL price routes.yaml states" in result.stderr
        )


def test_caps_an_external_facilitator_pays_for_are_not_the_operators_to_cover() -> None:
    env = {"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV, "X402_MAX_COMPUTE_UNIT_PRICE": "5000000"}

    result = run_cli(env, "check")

    assert result.returncode == 0, result.stderr


def test_check_with_good_config_prints_the_report_and_route_table() -> None:
    result = run_script({"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV}, "check")

    assert result.returncode == 0, result.stderr
    assert "base URL:     https://gw.example" in result.stdout
    assert f"payTo:        {PAY_TO}" in result.stdout
    assert (
        "upstreams:    asset_api=http://127.0.0.1:9/***, provider_a_devnet=http://127.0.0.1:9/***"
        in result.stdout
    )
    table = _table(result.stdout)
    assert table[0] == ["METHOD", "ACCESS", "PRICE(uUSDC)", "PROVIDER", "FEE", "CREDIT", "LIMITS", "PATH"]
    assert len(table) == 1 + 63  # the prepaid-credit routes are off: CREDITS_ENABLED is not set
    assert any(  # the default facilitator configured without a fee: the provider part alone
        row[:5] == ["POST", "exact", "216", "216", "0"] and row[-1].endswith("/das/searchAssets")
        for row in table
    )
    assert any(  # every limit in full, however long the column gets
        row[6] == "tokens:upstream-key=30/60s,tokens:wallet/wallet=8/60s(share),tokens:ip/ip=8/60s(share)"
        and row[-1].endswith("/v1/x402/tokens/assets/{assetId}/risk-details")
        for row in table
    )


def test_check_redacts_every_secret() -> None:
    store = "redis://:LEAKSTOREPASS@127.0.0.1:6379/0"
    env = {"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV, "STATE_STORE_REST_URL": store}

    result = run_cli(env, "check")

    assert result.returncode == 0
    assert "store:        redis at redis://127.0.0.1:6379/***" in result.stdout
    assert "LEAK" not in result.stdout + result.stderr


def test_check_notes_each_group_switched_off_once_with_its_reason() -> None:
    env = {"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV, "ROUTE_GROUPS": "provider_a,tokens"}

    result = run_cli(env, "check")

    notes = [line for line in result.stdout.splitlines() if line.startswith("note:") and " is off " in line]
    assert result.returncode == 0, result.stderr
    assert notes == [
        "note:         route group provider_b is off (18 route(s) not served): "
        "ROUTE_GROUPS=provider_a,tokens leaves it out"
    ]


def test_check_lists_only_what_the_served_groups_need() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example", "ROUTE_GROUPS": "tokens"}, "check")

    assert result.returncode == 1
    assert _listed(result.stderr) == ["ASSET_API_BASE_URL", "ASSET_API_KEY"]


def test_check_with_a_broken_routes_file_names_the_location(tmp_path: Any) -> None:
    table = tmp_path / "routes.yaml"
    table.write_text("routes:\n  - {name: a, path: /a, method: GET, access: open, handler: health}\n")

    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example", "ROUTES_FILE": str(table)}, "check")

    assert result.returncode == 1
    assert f"{table}:2: routes[0] (a).access: 'open' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_lists_environment_and_route_table_problems_together(tmp_path: Any) -> None:
    table = tmp_path / "routes.yaml"
    table.write_text("version: 3\nroutes: []\n")

    result = run_cli({"ROUTES_FILE": str(table), "ROUTE_GROUPS": "none"}, "check")

    assert result.returncode == 1
    assert result.stderr == (
        "invalid configuration:\n"
        "  - GATEWAY_BASE_URL is required (for example https://gateway.example.com)\n"
        f"  - {table}:1: version: unsupported version 3 (this gateway reads version 1)\n"
    )


def test_routes_prints_the_whole_expanded_table_without_any_environment() -> None:
    result = run_script({}, "routes")

    assert result.returncode == 0, result.stderr
    table = _table(result.stdout)
    assert len(table) == 1 + 69  # the whole table, the prepaid-credit routes included
    assert (
        ["POST", "exact", "5000000", "5000000", "0", "-"]
        in [  # a top-up: its credit, no fee
            row[:6] for row in table if row[-1] == "/v1/x402/credits/top-up/5"
        ]
    )
    # Priced through the default facilitator (no fee configured), saying what internal would add.
    assert _lines(result.stdout, "prices:") == [
        "prices: provider part + 0 micro-USDC settlement fee of the external facilitator "
        "https://api.cdp.coinbase.com/*** (FACILITATOR_SETTLEMENT_FEE_MICRO_USDC: it pays the Solana fees); "
        "with FACILITATOR_URL=internal the fee is 2200 micro-USDC "
        "(routes.yaml pricing.settlement_fee_micro_usdc)"
    ]
    balance = [row for row in _table(result.stdout) if row[-1].endswith("/devnet/provider_b/rpc/getBalance")]
    assert [row[:5] for row in balance] == [["POST", "exact", "5", "5", "0"]]


@pytest.mark.parametrize(
    ("env", "price"),
    [
        ({"FACILITATOR_URL": "internal"}, ["2250", "50", "2200"]),
        ({"FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "25"}, ["75", "50", "25"]),
    ],
    ids=["internal", "external-with-a-fee"],
)
def test_routes_prices_through_the_facilitator_the_environment_names(
    env: dict[str, str], price: list[str]
) -> None:
    result = run_cli(env, "routes")

    assert result.returncode == 0, result.stderr
    search = [
        row for row in _table(result.stdout) if row[-1].endswith("/mainnet/provider_b/das/searchAssets")
    ]
    assert [row[2:5] for row in search] == [price]


def test_routes_refuses_a_malformed_settlement_fee_rather_than_price_without_it() -> None:
    result = run_cli({"FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "lots"}, "routes")

    assert result.returncode == 1
    assert result.stderr == (
        "invalid configuration:\n  - FACILITATOR_SETTLEMENT_FEE_MICRO_USDC must be an integer, got 'lots'\n"
    )


def test_routes_names_a_broken_routes_file() -> None:
    result = run_cli({"ROUTES_FILE": "/nonexistent/routes.yaml"}, "routes")

    assert result.returncode == 1
    assert (
        result.stderr == "invalid configuration:\n  - ROUTES_FILE '/nonexistent/routes.yaml' does not exist\n"
    )


def test_help_texts_describe_every_option_without_markup() -> None:
    for args in ([], ["serve"], ["check"], ["routes"]):
        result = run_cli({}, *args, "--help")

        assert result.returncode == 0
        assert "``" not in result.stdout
    serve_help = " ".join(run_cli({}, "serve", "--help").stdout.split())
    for described in (
        "--host HOST address to listen on (default: 0.0.0.0)",
        "--port PORT TCP port (default: $PORT or 8080)",
        "--workers WORKERS worker processes; more than 1 needs a shared STATE_STORE_REST_URL (default: 1)",
        "--graceful-timeout SECONDS seconds in-flight requests get to finish on SIGTERM (default: 20.0)",
    ):
        assert described in serve_help


def test_serve_with_every_group_off_warns_of_each_answers_the_public_routes_and_stops_on_sigterm() -> None:
    """One process for both halves: what it serves, and what it said at start-up (it is never
    ready, having nothing to sell)."""
    with serve(SERVICE_ONLY, script=True) as gateway:
        health = _request(f"{gateway.url}/healthz")
        catalog = _request(f"{gateway.url}/v1/catalog")
        preflight = _request(f"{gateway.url}/v1/catalog", "OPTIONS")
        head = _request(f"{gateway.url}/healthz", "HEAD")

        exit_code = gateway.terminate()
        lines = _json_lines(gateway.stdout())

    assert (health[0], json.loads(health[2])) == (
        200,
        {"ok": True, "service": "x402-gateway", "status": "healthy"},
    )
    assert catalog[0] == 200
    assert [r["path"] for r in json.loads(catalog[2])["routes"]] == ["/healthz", "/v1/catalog"]
    assert preflight[0] == 204 and preflight[1]["access-control-allow-origin"] == "*"
    assert head[0] == 200 and head[2] == b"" and head[1]["content-length"] == health[1]["content-length"]
    assert exit_code == 0

    messages = [line["msg"] for line in lines]
    assert any(msg.startswith("state store: in-memory") for msg in messages)
    assert sorted(
        (line["level"], line["msg"]) for line in lines if line["msg"].startswith("route group ")
    ) == [
        (
            "warning",
            "route group provider_a is off (15 route(s) not served): ROUTE_GROUPS=none leaves it out",
        ),
        (
            "warning",
            "route group provider_b is off (18 route(s) not served): ROUTE_GROUPS=none leaves it out",
        ),
        ("warning", "route group tokens is off (19 route(s) not served): ROUTE_GROUPS=none leaves it out"),
    ]
    assert "gateway ready" not in messages
    assert any(
        line["level"] == "warning" and line["msg"].startswith("gateway up with nothing to sell")
        for line in lines
    )


def test_serve_says_ready_once_it_can_sell() -> None:
    with serve({**SECRET_ENV, "ROUTE_GROUPS": "tokens"}, script=True) as gateway:
        _request(f"{gateway.url}/healthz")
        gateway.terminate()
        messages = [line["msg"] for line in _json_lines(gateway.stdout())]

    assert "gateway ready" in messages


def test_serve_with_a_missing_required_variable_exits_1_listing_all_of_them() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example"}, "serve", "--port", str(free_port()))

    assert result.returncode == 1
    assert _listed(result.stderr) == REQUIRED
    assert "Traceback" not in result.stderr


def test_serve_refuses_two_workers_on_the_memory_store() -> None:
    result = run_cli(
        {"GATEWAY_BASE_URL": "https://gw.example", **SERVICE_ONLY},
        "serve",
        "--port",
        str(free_port()),
        "--workers",
        "2",
    )

    assert result.returncode == 1
    assert "refusing --workers > 1 on the in-memory store" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_a_malformed_variable_exits_1_without_a_traceback() -> None:
    result = run_cli(
        {"GATEWAY_BASE_URL": "https://gw.example", "MAX_BODY_BYTES": "big", **SERVICE_ONLY},
        "serve",
        "--port",
        str(free_port()),
    )

    assert result.returncode == 1
    assert result.stderr == "invalid configuration:\n  - MAX_BODY_BYTES must be an integer, got 'big'\n"


# --- logs ----------------------------------------------------------------------------------------------


REQUESTS = [
    ("GET", "/healthz", 200),
    ("GET", "/v1/catalog?provider=tokens", 200),
    ("GET", "/v1/catalog?provider=nope", 400),
    ("OPTIONS", "/v1/catalog", 204),
    ("HEAD", "/healthz", 200),
    ("DELETE", "/healthz", 405),
    ("GET", "/no/such/path?api-key=whatever", 404),
    ("GET", "/v1/x402/tokens/assets/solana", 402),
    ("GET", "/metrics", 200),
]


def test_serve_logs_one_json_line_per_request_and_never_a_secret() -> None:
    wallet = base58.b58encode(bytes(Keypair())).decode()
    cdp_secret = base64.b64encode(bytes(Keypair())).decode()
    env = {**SECRET_ENV, "FACILITATOR_WALLET_BASE58": wallet, "FACILITATOR_API_KEY_SECRET": cdp_secret}
    env["LOG_CHALLENGES"] = "all"  # the two 402 challenges too (by default they are counted instead)

    with serve(env, script=True) as gateway:
        statuses = [_request(f"{gateway.url}{path}", method)[0] for method, path, _ in REQUESTS]
        paid = _request(f"{gateway.url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance", "POST", b"{}")[0]
        assert gateway.terminate() == 0
        stdout, stderr = gateway.stdout(), gateway.stderr()

    assert statuses == [status for _, _, status in REQUESTS]
    lines = _json_lines(stdout)  # every stdout line is one JSON object
    logged = [line for line in lines if line["msg"] == "request"]
    assert [(line["method"], line["status"]) for line in logged] == [
        *((method, status) for method, _, status in REQUESTS),
        ("POST", paid),
    ]
    for line in logged:
        assert {"route", "status", "latency_ms", "access", "outcome"} <= set(line)
        assert isinstance(line["latency_ms"], float | int)
    assert [line["route"] for line in logged[:3]] == ["health", "catalog", "catalog"]
    assert logged[6]["route"] == "unmatched"
    for secret in ("LEAK", wallet, cdp_secret, "api-key=LEAK"):
        assert secret not in stdout
        assert secret not in stderr


# --- a CLI that never shows a traceback ----------------------------------------------------------


def run_cli_into_closed_pipe(
    env: dict[str, str], *args: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a command whose stdout is a pipe the reader has already left: every write to it fails
    (EPIPE), as with ``| head -1`` once head has read its line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [*gateway_process.command(), *args],
            env=clean_env(env),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        os.close(write_end)


def run_cli_into_head(env: dict[str, str], *args: str, count: int = 10) -> tuple[int, str, bytes]:
    """``x402-gateway ARGS | head -c COUNT``: the exit code, stderr and what head printed."""
    cli = subprocess.Popen(
        [*gateway_process.command(), *args],
        env=clean_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert cli.stdout is not None and cli.stderr is not None
    head = subprocess.run(["head", "-c", str(count)], stdin=cli.stdout, capture_output=True, check=True)
    cli.stdout.close()
    stderr = cli.stderr.read().decode()
    return cli.wait(timeout=30), stderr, head.stdout


PORT_RANGE = "is out of range: a TCP port from 1 to 65535"
GOOD_ENV = {"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV}


@pytest.mark.parametrize(
    ("env", "args"),
    [({}, ("routes",)), (GOOD_ENV, ("check",)), ({}, ("--help",)), ({}, ("sandbox", "--help"))],
)
def test_a_closed_pipe_ends_the_command_quietly(env: dict[str, str], args: tuple[str, ...]) -> None:
    closed = run_cli_into_closed_pipe(env, *args)

    assert (closed.returncode, closed.stderr) == (0, "")
    code, stderr, head = run_cli_into_head(env, *args)
    assert (code, stderr, len(head)) == (0, "", 10)


def test_a_failing_check_into_a_closed_pipe_still_lists_its_problems_on_stderr() -> None:
    closed = run_cli_into_closed_pipe({}, "check")

    assert closed.returncode == 1
    assert "Traceback" not in closed.stderr
    assert "X402_PAY_TO_WALLET is required" in closed.stderr


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (("sandbox", "--port", "99999"), f"argument --port: 99999 {PORT_RANGE}"),
        (("sandbox", "--port", "-5"), f"argument --port: -5 {PORT_RANGE}"),
        (("sandbox", "--port", "0"), f"argument --port: 0 {PORT_RANGE}"),
        (("sandbox", "--chain-port", "70000"), "argument --chain-port: 70000 is out of range"),
        (("sandbox", "--assets-port", "x"), "argument --assets-port: 'x' is not a TCP port"),
        (("sandbox", "--confirm-delay-ms", "-1"), "argument --confirm-delay-ms: -1 is out of range"),
        (("sandbox", "--confirm-delay-ms", "60001"), "argument --confirm-delay-ms: 60001 is out of range"),
        (("serve", "--port", "99999"), f"argument --port: 99999 {PORT_RANGE}"),
        (("serve", "--workers", "0"), "argument --workers: 0 is out of range: a number of workers from 1"),
        (("serve", "--graceful-timeout", "nan"), "argument --graceful-timeout: nan is out of range"),
        (("serve", "--graceful-timeout", "-1"), "argument --graceful-timeout: -1 is out of range"),
    ],
)
def test_every_numeric_option_is_range_checked_in_one_line(args: tuple[str, ...], refusal: str) -> None:
    result = run_cli({}, *args)

    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"x402-gateway {args[0]}: {refusal}")
    assert line.endswith(f"(see x402-gateway {args[0]} --help)")


def test_sandbox_refuses_a_port_variable_out_of_range_in_one_line() -> None:
    result = run_cli({"PORT": "99999"}, "sandbox")

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "sandbox: PORT 99999 is out of range: a TCP port from 1 to 65535\n"


# --- pay against a rate limit ----------------------------------------------------------------------

LIMITED_ROUTES = """\
version: 1
routes:
  - name: ping
    path: /ping
    method: GET
    access: public
    handler: health
    rate_limits:
      - {scope: ping, limit: 1, period_seconds: 3}
  - name: slow
    path: /slow
    method: GET
    access: public
    handler: health
    rate_limits:
      - {scope: slow, limit: 1, period_seconds: 120}
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A gateway whose /ping allows one call per 3 s and /slow one per 120 s; and a key file."""
    folder = tmp_path_factory.mktemp("limited")
    (folder / "routes.yaml").write_text(LIMITED_ROUTES)
    key_file = folder / "key.json"
    key_file.write_text(json.dumps(list(bytes(Keypair()))))
    with serve({"ROUTES_FILE": str(folder / "routes.yaml")}) as gateway:
        yield gateway.url, str(key_file)


def _spend_the_limit(url: str) -> dict[str, str]:
    """Call until the limit refuses (the previous test may have left it spent): its 429 headers."""
    while True:
        status, headers, _ = _request(url)
        if status == 429:
            return {name.lower(): value for name, value in headers.items()}
        assert status == 200


def test_pay_waits_out_retry_after_and_sends_again(limited: tuple[str, str]) -> None:
    base, key_file = limited
    headers = _spend_the_limit(base + "/ping")
    started = time.monotonic()

    done = run_cli({}, "pay", "GET", base + "/ping", "--keypair", key_file)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "healthy"
    [line] = done.stderr.splitlines()  # the waited call itself spends the limit: one wait only
    waited = re.fullmatch(
        r"HTTP 429 \(rate limited\): waiting ([123]) s as Retry-After asks, then sending again "
        r"\(--no-wait stops at once\)",
        line,
    )
    assert waited, line
    assert int(waited[1]) <= int(headers["retry-after"])
    assert time.monotonic() - started >= int(waited[1])


def test_pay_no_wait_exits_at_once_on_a_429_naming_retry_after(limited: tuple[str, str]) -> None:
    """On /slow: /ping's 3 s can pass while a loaded runner starts the command, and it is served."""
    base, key_file = limited
    _spend_the_limit(base + "/slow")

    done = run_cli({}, "pay", "GET", base + "/slow", "--keypair", key_file, "--no-wait")

    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["code"] == "rate_limited"
    [line] = done.stderr.splitlines()
    shown = re.fullmatch(
        r"x402-gateway pay: HTTP 429 \(Retry-After: ([0-9]+) s\): rate_limited: rate limit exceeded for "
        r"slow, retry after ([0-9]+) s",
        line,
    )
    assert shown and shown[1] == shown[2] and 0 < int(shown[1]) <= 120, line


def test_pay_does_not_wait_longer_than_its_bound(limited: tuple[str, str]) -> None:
    base, key_file = limited
    _spend_the_limit(base + "/slow")
    started = time.monotonic()

    done = run_cli({}, "pay", "GET", base + "/slow", "--keypair", key_file, "--json")

    assert time.monotonic() - started < 30
    assert done.returncode == 1 and done.stderr == ""
    answer = json.loads(done.stdout)
    assert answer["status"] == 429 and answer["error"].startswith("HTTP 429 (Retry-After: 1")


def test_sandbox_refuses_two_parts_on_one_port_in_one_line() -> None:
    port = str(free_port())

    result = run_cli({}, "sandbox", "--port", port, "--chain-port", port)

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"sandbox: the gateway and the local chain would both listen on port {port}: "
        "give --chain-port another\n"
    )


@pytest.mark.parametrize(
    ("option", "value", "unit"),
    [("--usdc", "-1", "USDC from 0 to 1000000"), ("--sol", "1001", "SOL from 0 to 1000")],
)
def test_sandbox_fund_amounts_are_range_checked_in_one_line(option: str, value: str, unit: str) -> None:
    result = run_cli({}, "sandbox", "fund", str(Keypair().pubkey()), option, value)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"x402-gateway sandbox fund: argument {option}: {value} is out of range: {unit}, with at most "
        f"{6 if option == '--usdc' else 9} decimals (see x402-gateway sandbox fund --help)\n"
    )
