"""Attacks the gateway already refuses, mounted against the running gateway so they stay refused:
payments for the wrong network or with versions mixed up, path tricks around the internal
facilitator (which signs with the operator's wallet), and hostile sign-ins. Each asserts the
status and reason, that the provider was not called, and that no money moved. The sign-ins run
over the shared store (single-node Redis, then a 3-master cluster), where a used nonce is kept;
the payment and path checks refuse before any state is read, so they run once, in memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_payload
from gateway.x402.headers import encode_header
from gateway.x402.types import SOLANA_DEVNET, SOLANA_MAINNET, PaymentPayload, SiwxExtension
from tests.support.adversarial_paid import Money
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.paid_fixtures import GET_BALANCE, StartPaidGateway, balance_body
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import UsdcChain
from tests.support.upstream import ASSET_API_KEY, Upstream

NO_MONEY_MOVED = Money(0, 0, 0)
HOUR = timedelta(hours=1)
INTERNAL_SECRET = "refusals-internal-secret-0123456789abcdef"
SETTLE = "/api/internal/facilitator/settle"
redis_url = on_redis_and_cluster()


# --- payments for the wrong network, versions mixed up -------------------------------------------


def _accepted(payment: PaymentPayload, **changes: object) -> PaymentPayload:
    assert payment.accepted is not None
    return msgspec.structs.replace(payment, accepted=msgspec.structs.replace(payment.accepted, **changes))


CONFUSIONS = {
    "a devnet payment on a mainnet route": (
        lambda p: _accepted(p, network=SOLANA_DEVNET),
        "invalid_network",
    ),
    "a v1 network name inside a v2 payment": (lambda p: _accepted(p, network="solana"), "invalid_network"),
    "x402 version 3": (lambda p: msgspec.structs.replace(p, x402Version=3), "invalid_x402_version"),
    "a v2 payment without the accepted requirements": (
        lambda p: msgspec.structs.replace(p, accepted=None),
        "invalid_x402_version",
    ),
    "a v1 payment naming devnet": (
        lambda p: PaymentPayload(x402Version=1, scheme="exact", network="solana-devnet", payload=p.payload),
        "invalid_network",
    ),
}


@pytest.mark.parametrize("confusion", sorted(CONFUSIONS))
async def test_network_and_version_confusion_is_refused_and_nothing_moves(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, confusion: str
) -> None:
    change, reason = CONFUSIONS[confusion]
    paid = await start_paid_gateway(internal=True)
    payment = change(await paid.payment())
    before = Money.of(usdc_chain)

    header = "x-payment" if payment.x402Version == 1 else "payment-signature"
    reply = await paid.pay(GET_BALANCE, balance_body(), payment, header=header)

    assert reply.status == 402 and reply.json()["error"] == reason, reply.body
    assert paid.upstream_calls == 0 and paid.rpc.sent == []
    assert Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED


# --- the internal facilitator behind path tricks -------------------------------------------------


async def _raw(port: int, method: str, target: str, body: bytes, secret: str | None) -> int:
    """Send ``target`` byte for byte (no client normalises it) and return the status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {target} HTTP/1.1", f"host: 127.0.0.1:{port}", "content-type: application/json"]
    lines += [f"content-length: {len(body)}", "connection: close"]
    if secret is not None:
        lines.append(f"x-gateway-internal-secret: {secret}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()
    writer.close()
    return int(status_line.split()[1])


TRICK_PATHS = [
    "//api/internal/facilitator/settle",
    "/api/internal/facilitator/settle/",
    "/api/internal//facilitator/settle",
    "/api/internal/facilitator%2Fsettle",
    "/api/internal/facilitator/./settle",
    "/api/internal/x/../facilitator/settle",
    "/API/internal/facilitator/settle",
    "/v1/../api/internal/facilitator/settle",
]


async def test_path_tricks_never_reach_the_internal_settle_and_the_real_path_does(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await start_paid_gateway(internal=True, env={"INTERNAL_SETTLEMENT_SECRET": INTERNAL_SECRET})
    requirements, _ = await paid.requirements()
    payment = await paid.payment()
    body = json.dumps(
        {
            "x402Version": 2,
            "paymentPayload": msgspec.to_builtins(payment),
            "paymentRequirements": msgspec.to_builtins(requirements),
        }
    ).encode()
    port = int(paid.url.rsplit(":", 1)[1])
    before = Money.of(usdc_chain)

    # (A percent-encoded unreserved letter, "%73ettle", is the same path by RFC 3986 and still
    # needs the secret; what must never happen is a different spelling reaching it without one.)
    for target in TRICK_PATHS:
        assert await _raw(port, "POST", target, body, None) in (400, 401, 404), target
        assert await _raw(port, "POST", target, body, INTERNAL_SECRET) in (400, 404), target
    for method in ("HEAD", "OPTIONS", "GET", "PUT"):
        assert await _raw(port, method, SETTLE, body, None) == 401, method  # the secret comes first
        assert await _raw(port, method, SETTLE, body, INTERNAL_SECRET) == 405, method
    assert await _raw(port, "POST", SETTLE, body, "not-the-secret") == 401
    assert paid.rpc.sent == [] and Money.of(usdc_chain).minus(before) == NO_MONEY_MOVED

    assert await _raw(port, "POST", SETTLE, body, INTERNAL_SECRET) == 200  # the control
    assert len(paid.rpc.sent) == 1


# --- hostile sign-ins --------------------------------------------------------------------------------

HEALTH = "/v1/x402/tokens/health"
SEARCH = "/v1/x402/tokens/assets/search?q=sol"


@pytest_asyncio.fixture(loop_scope="session")
async def tokens_gateway(asset_api: Upstream, clean_redis_url: str) -> AsyncIterator[RunningGateway]:
    env = {
        "STATE_STORE_REST_URL": clean_redis_url,
        "ASSET_API_BASE_URL": asset_api.url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": "refusals-siwx-secret-0123456789abcdef-01",
        "ROUTE_GROUPS": "tokens",
    }
    async with run_gateway(env) as running:
        yield running


async def _challenge(http: aiohttp.ClientSession, url: str) -> SiwxExtension:
    async with http.get(url) as resp:
        assert resp.status == 402
        return msgspec.convert((await resp.json())["extensions"]["sign-in-with-x"], SiwxExtension)


def _header(extension: SiwxExtension, wallet: Keypair, **info_changes: object) -> str:
    info = msgspec.structs.replace(extension.info, **info_changes)
    return encode_header(sign_payload(info, wallet, SOLANA_MAINNET))


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


async def _refused_reason(http: aiohttp.ClientSession, url: str, header: str) -> tuple[int, str]:
    async with http.get(url, headers={"sign-in-with-x": header}) as resp:
        return resp.status, (await resp.json()).get("error", "")


async def test_hostile_sign_ins_are_refused_and_the_upstream_is_never_called(
    tokens_gateway: RunningGateway, asset_api: Upstream
) -> None:
    wallet = Keypair()
    health, search = tokens_gateway.url + HEALTH, tokens_gateway.url + SEARCH
    async with aiohttp.ClientSession() as http:
        challenge = await _challenge(http, health)
        honest = _header(challenge, wallet)
        async with http.get(health, headers={"sign-in-with-x": honest}) as first:
            assert first.status == 200
        calls = len(asset_api.calls)
        forged_nonce = base64.b16encode(bytes(16)).decode().lower()
        attacks = {
            "replay": (health, honest, "siwx_replayed"),
            "another route": (search, _header(await _challenge(http, health), wallet), "siwx_uri_mismatch"),
            "another domain": (
                health,
                _header(await _challenge(http, health), wallet, domain="evil.example"),
                "siwx_domain_mismatch",
            ),
            "a forged nonce": (
                health,
                _header(await _challenge(http, health), wallet, nonce=forged_nonce),
                "siwx_nonce_invalid",
            ),
            "issued in the future": (
                health,
                _header(await _challenge(http, health), wallet, issuedAt=_iso(datetime.now(UTC) + HOUR)),
                "siwx_nonce_invalid",  # the nonce binds issuedAt: a shifted time breaks it
            ),
            "expired": (
                health,
                _header(
                    await _challenge(http, health),
                    wallet,
                    expirationTime=_iso(datetime.now(UTC) - timedelta(minutes=1)),
                ),
                "siwx_expired",
            ),
        }
        for name, (url, header, reason) in attacks.items():
            assert await _refused_reason(http, url, header) == (402, reason), name
    assert len(asset_api.calls) == calls
