"""Prepaid credit from the reference Python SDK (PyPI ``x402``), unchanged: its httpx client, with
the exact SVM scheme and the sign-in-with-x client hook registered beside it, buys a top-up, then
calls a paid route on credit (no transaction, ``X-Credit-Balance`` falling), and once the credit
no longer covers a call pays per call by itself.

The gateway is the real one (CREDITS_ENABLED on Redis, the internal facilitator settling on
LiteSVM); getBalance is given a credit price of 0.4 USDC so that one USDC of credit runs out
after two calls. The SDK registers the hook either way it offers: as a client extension
(``x402Client.register_extension``) or as an ``on_payment_required`` hook of its HTTP client.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from gateway.config import load_settings
from gateway.routing.routes import RouteSpec, load_routes, named_limits
from tests.support.cdp_facilitator import close_sdk_rpc_clients
from tests.support.gateway_server import PAID_GROUPS, RunningGateway, run_gateway
from tests.support.paid_fixtures import GET_BALANCE, GET_BALANCE_PRICE_INTERNAL, balance_body, paid_env
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")

ONE_USDC = 1_000_000
CREDIT_PRICE = 400_000
"""getBalance's credit price here: one USDC of credit covers two calls, not a third."""
TOP_UP_1 = "/v1/x402/credits/top-up/1"
CREDITS = "/v1/x402/credits"


def _routes(env: dict[str, str]) -> list[RouteSpec]:
    """The packaged table, getBalance on provider_a taking ``CREDIT_PRICE`` from credit."""
    settings = load_settings({"GATEWAY_BASE_URL": "http://127.0.0.1", **env})
    routes = load_routes(settings.routes_file, named_limits(settings))
    return [
        msgspec.structs.replace(r, credit_price_micro_usdc=CREDIT_PRICE) if r.path == GET_BALANCE else r
        for r in routes
    ]


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(
    usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, upstream: Upstream, clean_redis_url: str
) -> AsyncIterator[RunningGateway]:
    env = {
        **paid_env(usdc_chain, solana_rpc_server, upstream, None),
        "CREDITS_ENABLED": "true",
        "STATE_STORE_REST_URL": clean_redis_url,
        "ROUTE_GROUPS": f"{PAID_GROUPS},credits",
    }
    async with run_gateway(env, routes=_routes(env)) as running:
        yield running


@contextmanager
def reference_client(chain: UsdcChain, rpc_url: str, registered: str) -> Iterator[Any]:
    """The SDK's client for ``x402HttpxClient``: exact SVM for the chain's payer, and the
    sign-in-with-x client hook, ``registered`` as an ``extension`` or an HTTP ``hook``."""
    from x402 import x402Client
    from x402.extensions.sign_in_with_x import (
        CreateSIWxClientExtensionOptions,
        create_siwx_client_extension,
        create_siwx_client_hook,
    )
    from x402.http import x402HTTPClient
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.register import register_exact_svm_client

    signer = KeypairSigner(chain.payer)
    client = x402Client()
    register_exact_svm_client(client, signer, rpc_url=rpc_url)
    try:
        if registered == "extension":
            options = CreateSIWxClientExtensionOptions(signers=[signer])
            yield client.register_extension(create_siwx_client_extension(options))
        else:
            yield x402HTTPClient(client).on_payment_required(create_siwx_client_hook(signer))
    finally:
        for schemes in client._schemes.values():  # the SDK cannot close its RPC clients itself
            for scheme in schemes.values():
                close_sdk_rpc_clients(scheme)


def _settled(headers: Any) -> dict[str, Any]:
    settled: dict[str, Any] = json.loads(base64.b64decode(headers["payment-response"]))
    assert settled["success"] is True
    return settled


@pytest.mark.parametrize("registered", ["extension", "hook"])
async def test_the_reference_sdk_tops_up_calls_on_credit_then_pays_per_call(
    gateway: RunningGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    registered: str,
) -> None:
    from x402.http.clients import x402HttpxClient

    def chain() -> tuple[int | None, int | None, int]:
        """The payer's USDC, payTo's, and the transactions sent so far."""
        payer, pay_to = usdc_chain.balance(usdc_chain.payer_ata), usdc_chain.balance(usdc_chain.pay_to_ata)
        return payer, pay_to, len(solana_rpc_server.sent)

    start, _, _ = chain()
    assert start is not None
    call = gateway.url + GET_BALANCE
    with reference_client(usdc_chain, solana_rpc_server.url, registered) as client:
        async with x402HttpxClient(client, timeout=30) as http:
            bought = await http.post(gateway.url + TOP_UP_1)
            after_top_up = chain()
            on_credit = [await http.post(call, json=balance_body()) for _ in range(2)]
            after_credit = chain()
            per_call = [await http.post(call, json=balance_body()) for _ in range(2)]
            balance = await http.get(gateway.url + CREDITS)

    assert bought.status_code == 200, bought.text
    assert bought.json()["result"]["balanceMicroUsdc"] == str(ONE_USDC)
    assert _settled(bought.headers)["transaction"] == solana_rpc_server.sent[0]
    assert after_top_up == (start - ONE_USDC, ONE_USDC, 1)

    assert [r.status_code for r in on_credit] == [200, 200], on_credit[-1].text
    assert [r.headers.get("x-credit-balance") for r in on_credit] == [
        str(ONE_USDC - CREDIT_PRICE),
        str(ONE_USDC - 2 * CREDIT_PRICE),
    ]
    assert not any("payment-response" in r.headers for r in on_credit)
    assert after_credit == after_top_up  # no transaction, no USDC moved

    assert [r.status_code for r in per_call] == [200, 200], per_call[-1].text
    assert [_settled(r.headers)["transaction"] for r in per_call] == solana_rpc_server.sent[1:3]
    assert not any("x-credit-balance" in r.headers for r in per_call)
    paid = 2 * GET_BALANCE_PRICE_INTERNAL
    assert chain() == (start - ONE_USDC - paid, ONE_USDC + paid, 3)

    assert all("result" in r.json() for r in [*on_credit, *per_call]) and len(upstream.calls) == 4
    assert balance.status_code == 200, balance.text
    assert balance.json()["result"]["balanceMicroUsdc"] == str(ONE_USDC - 2 * CREDIT_PRICE)
