"""``x402-gateway check | routes | serve`` as subprocesses: reports, start-up, shutdown, and log lines."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import base58
from solders.keypair import Keypair

from tests.support.gateway_process import run_cli, serve
from tests.support.gateway_server import free_port

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
}


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
        {"GATEWAY_BASE_URL": "https://gw.example", "PORT": "http", "RATE_LIMIT_RPC_RPS": "lots"}, "check"
    )

    assert result.returncode == 1
    assert result.stderr == (
        "invalid configuration:\n"
        "  - PORT must be an integer, got 'http'\n"
        "  - RATE_LIMIT_RPC_RPS must be an integer, got 'lots'\n"
    )
    assert result.stdout == ""


def test_check_without_base_url_exits_1_without_a_traceback() -> None:
    result = run_cli({}, "check")

    assert result.returncode == 1
    assert "GATEWAY_BASE_URL is required" in result.stderr
    assert "Traceback" not in result.stderr


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


def test_check_with_good_config_prints_the_report_and_route_table() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV}, "check")

    assert result.returncode == 0, result.stderr
    assert "base URL:     https://gw.example" in result.stdout
    assert f"payTo:        {PAY_TO}" in result.stdout
    assert (
        "upstreams:    asset_api=http://127.0.0.1:9/***, provider_a_devnet=http://127.0.0.1:9/***"
        in result.stdout
    )
    table = result.stdout.split("\n\n", 1)[1].splitlines()
    assert table[0].split() == ["METHOD", "ACCESS", "PRICE(uUSDC)", "LIMITS", "PATH"]
    assert len(table) == 1 + 59
    assert any(
        row.split()[:3] == ["POST", "exact", "1216"] and row.endswith("/das/searchAssets") for row in table
    )


def test_check_redacts_every_secret() -> None:
    store = "redis://:LEAKSTOREPASS@127.0.0.1:6379/0"
    env = {"GATEWAY_BASE_URL": "https://gw.example", **SECRET_ENV, "STATE_STORE_REST_URL": store}

    result = run_cli(env, "check")

    assert result.returncode == 0
    assert "store:        redis at redis://127.0.0.1:6379/***" in result.stdout
    assert "LEAK" not in result.stdout + result.stderr


def test_check_notes_each_unmounted_group_once() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example"}, "check")

    notes = [
        line for line in result.stdout.splitlines() if line.startswith("note:") and "not mounted" in line
    ]
    assert result.returncode == 0
    assert len(notes) == 5
    assert "note:         not mounted: 19 route(s) of tokens (ASSET_API_BASE_URL unset)" in notes


def test_check_with_a_broken_routes_file_names_the_location(tmp_path: Any) -> None:
    table = tmp_path / "routes.yaml"
    table.write_text("routes:\n  - {name: a, path: /a, method: GET, access: open, handler: health}\n")

    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example", "ROUTES_FILE": str(table)}, "check")

    assert result.returncode == 1
    assert "routes[0] (a).access: 'open' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


def test_routes_prints_the_whole_expanded_table() -> None:
    result = run_cli({"GATEWAY_BASE_URL": "https://gw.example"}, "routes")

    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 1 + 59


# --- serve ---------------------------------------------------------------------------------------------


def test_serve_with_only_base_url_answers_the_public_routes_and_stops_on_sigterm() -> None:
    with serve({}) as gateway:
        health = _request(f"{gateway.url}/healthz")
        catalog = _request(f"{gateway.url}/v1/catalog")
        preflight = _request(f"{gateway.url}/v1/catalog", "OPTIONS")
        head = _request(f"{gateway.url}/healthz", "HEAD")

        exit_code = gateway.terminate()

    assert (health[0], json.loads(health[2])) == (
        200,
        {"ok": True, "service": "x402-gateway", "status": "healthy"},
    )
    assert catalog[0] == 200
    assert [r["path"] for r in json.loads(catalog[2])["routes"]] == ["/healthz", "/v1/catalog"]
    assert preflight[0] == 204 and preflight[1]["access-control-allow-origin"] == "*"
    assert head[0] == 200 and head[2] == b"" and head[1]["content-length"] == health[1]["content-length"]
    assert exit_code == 0


def test_serve_start_up_names_the_memory_store_and_each_unmounted_group_once() -> None:
    with serve({}) as gateway:
        _request(f"{gateway.url}/healthz")
        gateway.terminate()
        messages = [line["msg"] for line in _json_lines(gateway.stdout())]

    assert any(msg.startswith("state store: in-memory") for msg in messages)
    assert sorted(msg for msg in messages if msg.startswith("not mounted")) == [
        "not mounted: 19 route(s) of tokens (ASSET_API_BASE_URL unset)",
        "not mounted: 6 route(s) of provider_a (PROVIDER_A_DEVNET_RPC_URL unset)",
        "not mounted: 9 route(s) of provider_a (PROVIDER_A_MAINNET_RPC_URL unset)",
        "not mounted: 9 route(s) of provider_b (PROVIDER_B_DEVNET_RPC_URL unset)",
        "not mounted: 9 route(s) of provider_b (PROVIDER_B_MAINNET_RPC_URL unset)",
    ]


def test_serve_refuses_two_workers_on_the_memory_store() -> None:
    result = run_cli(
        {"GATEWAY_BASE_URL": "https://gw.example"}, "serve", "--port", str(free_port()), "--workers", "2"
    )

    assert result.returncode == 1
    assert "refusing --workers > 1 on the in-memory store" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_a_malformed_variable_exits_1_without_a_traceback() -> None:
    result = run_cli(
        {"GATEWAY_BASE_URL": "https://gw.example", "MAX_BODY_BYTES": "big"},
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
    env = {**SECRET_ENV, "FACILITATOR_WALLET_BASE58": wallet, "FACILITATOR_API_KEY_ID": "LEAKKEYID"}
    env["FACILITATOR_API_KEY_SECRET"] = cdp_secret

    with serve(env) as gateway:
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
