"""Zero-latency third parties for the benchmark, each in its own process on loopback.

``python -m bench.stubs KIND PORT`` with KIND one of:

* ``provider``: a JSON-RPC provider answering every POST with one constant result (a batch: once
  per call, under its id);
* ``asset``: the asset-data API answering every GET with one constant JSON document;
* ``facilitator``: an x402 facilitator without authentication (``/supported``, ``/verify``,
  ``/settle``) that accepts every payment, like the fake CDP facilitator's ``StaticBackend``.

Every answer is encoded once at start-up; the handlers never parse the request body, so the
stubs cost the gateway's request as little as a loopback server can.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import msgspec
from aiohttp import web
from solders.keypair import Keypair

from gateway.x402.types import (
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    SettleResponse,
    SupportedKind,
    SupportedResponse,
    VerifyResponse,
)

FACILITATOR_BASE_PATH = "/x402"
FEE_PAYER = str(Keypair.from_seed(hashlib.sha256(b"x402-gateway-bench-fee-payer").digest()).pubkey())
SETTLEMENT_TX = "5" * 88
"""A constant base58 "transaction signature" for every settlement (nothing is broadcast)."""

RPC_RESULT = (
    b'{"jsonrpc":"2.0","id":1,"result":{"context":{"slot":312345678,"apiVersion":"2.1.0"},"value":1461600}}'
)
ASSET_RESULT = (
    b'{"id":"usd-coin","symbol":"USDC","name":"USD Coin","decimals":6,'
    b'"price":{"usd":1.0001,"updatedAt":1735689600},"marketCapUsd":60123456789}'
)


def _result(call_id: Any) -> bytes:
    return RPC_RESULT.replace(b'"id":1', b'"id":' + msgspec.json.encode(call_id), 1)


def _constant(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def provider_app() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if body.lstrip()[:1] == b"[":  # a JSON-RPC batch: the constant result once per call
            calls = msgspec.json.decode(body)
            return _constant(b"[" + b",".join(_result(call.get("id")) for call in calls) + b"]")
        return _constant(RPC_RESULT)

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    return app


def asset_app() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        return _constant(ASSET_RESULT)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return app


def facilitator_app() -> web.Application:
    encode = msgspec.json.encode
    supported = encode(
        SupportedResponse(
            kinds=[
                SupportedKind(2, "exact", n, {"feePayer": FEE_PAYER}) for n in (SOLANA_MAINNET, SOLANA_DEVNET)
            ],
            extensions=[],
            signers={"solana:*": [FEE_PAYER]},
        )
    )
    verified = encode(VerifyResponse(isValid=True))
    settled = encode(SettleResponse(success=True, network=SOLANA_MAINNET, transaction=SETTLEMENT_TX))

    async def handle_supported(request: web.Request) -> web.Response:
        return _constant(supported)

    async def handle_verify(request: web.Request) -> web.Response:
        await request.read()
        return _constant(verified)

    async def handle_settle(request: web.Request) -> web.Response:
        await request.read()
        return _constant(settled)

    app = web.Application()
    app.router.add_get(f"{FACILITATOR_BASE_PATH}/supported", handle_supported)
    app.router.add_post(f"{FACILITATOR_BASE_PATH}/verify", handle_verify)
    app.router.add_post(f"{FACILITATOR_BASE_PATH}/settle", handle_settle)
    return app


APPS = {"provider": provider_app, "asset": asset_app, "facilitator": facilitator_app}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(APPS))
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    web.run_app(APPS[args.kind](), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
