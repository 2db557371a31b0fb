"""Finding: a paying agent got about two calls a second per IP, since every 402 counted against
the per-IP unpaid-challenge limit, the 402s it answered with a payment or a sign-in on credit
included (and, for a client that looks for credit first, the sign-in that found none too). A 402
answered with a credential the gateway admits is not an unpaid challenge: its count is handed
back, with the credit probe that came before it.

The whole gateway is served (hypercorn on loopback) with credit on, over a real Redis
(single-node, then a 3-master Redis Cluster), settling with its own fee payer on a LiteSVM
chain, at low limits: 40 challenges a minute per IP, 8 calls a second per wallet and 16 per RPC
scope. From one client IP (forwarded by a trusted proxy), for five seconds, each agent at 4
calls a second, within its own limits (60 402s and 20 probes, twice the challenge limit; a 402
counts until its payment arrives, and on a loaded machine the agents can be seconds behind their
402s):

* an agent paying per call with the reference x402 client, on provider_a's getBalance;
* an agent paying per call with the reference client and its sign-in hook, whose wallet has no
  credit: each call's sign-in is refused ``insufficient_credit``, then it pays (provider_a);
* an agent spending credit with the reference sign-in hook, on provider_b's getBalance.

No 429; every call answered and charged once, on chain or from credit. Then a client on the same
IP that takes 402s and never pays gets exactly the limit of them (everything the agents answered
was handed back), then 429 ``challenge:ip`` with ``Retry-After``.

Before the hand-back, the agents' 41st 402 was a 429 ``challenge:ip``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from solders.keypair import Keypair

from tests.support.adversarial_credit import CALL_CREDIT, credit_env, credit_of, fund
from tests.support.adversarial_paid import Money, funded_wallet, via
from tests.support.cdp_facilitator import close_sdk_rpc_clients
from tests.support.gateway_server import run_gateway
from tests.support.paid_fixtures import GET_BALANCE, GET_BALANCE_PRICE_INTERNAL, balance_body
from tests.support.redis_fixtures import on_redis_and_cluster, store_at
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]

redis_url = on_redis_and_cluster()

CHALLENGES_PER_MINUTE = 40
WALLET_RPS = 8
SCOPE_RPS = 16
PACE = 4
"""Each agent's calls a second, twice what one IP got before (and 12 a second from the IP): half
its wallet's limit, and two of them on one scope half its limit. Nearer the limits, a loaded
machine that delays a few calls and then sends them together exceeds them, and is rightly
refused."""
SECONDS = 5
CALLS = PACE * SECONDS
"""Each agent's calls."""
CLIENT_IP = "198.51.100.20"
LOADED_TIMEOUT_S = 10.0
ON_CREDIT = "/v1/x402/solana/mainnet/provider_b/rpc/getBalance"
FUNDED = 1_000_000


@asynccontextmanager
async def reference_http(signer_key: Keypair, rpc_url: str, sign_in: bool) -> AsyncIterator[Any]:
    """The reference SDK's httpx client paying with exact SVM, with the sign-in-with-x hook
    registered beside it when ``sign_in``, from ``CLIENT_IP``."""
    from x402 import x402Client
    from x402.extensions.sign_in_with_x import create_siwx_client_hook
    from x402.http import x402HTTPClient
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.register import register_exact_svm_client

    signer = KeypairSigner(signer_key)
    client = x402Client()
    register_exact_svm_client(client, signer, rpc_url=rpc_url)
    payer: Any = (
        x402HTTPClient(client).on_payment_required(create_siwx_client_hook(signer)) if sign_in else client
    )
    try:
        async with x402HttpxClient(payer, timeout=30, headers=via(CLIENT_IP)) as http:
            yield http
    finally:
        for schemes in client._schemes.values():  # the SDK cannot close its RPC clients itself
            for scheme in schemes.values():
                close_sdk_rpc_clients(scheme)


async def paced(call: Callable[[int], Awaitable[Any]], rate: int = PACE, n: int = CALLS) -> list[Any]:
    """``n`` calls started ``1 / rate`` s apart, whether or not the earlier ones answered."""
    start = time.monotonic()

    async def at(i: int) -> Any:
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        return await call(i)

    return list(await asyncio.gather(*(at(i) for i in range(n))))


async def test_agents_on_one_ip_sustain_their_own_limits_and_a_non_payer_is_still_limited(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], redis_url: str
) -> None:
    chain, rpc = chain_rpc
    provider = Upstream()
    await provider.start()
    env = credit_env(
        chain,
        rpc,
        provider,
        redis_url,
        TRUSTED_PROXIES="127.0.0.1",
        RATE_LIMIT_RPC_RPS=str(SCOPE_RPS),
        RATE_LIMIT_WALLET_RPS=str(WALLET_RPS),
        RATE_LIMIT_CHALLENGE_PER_MINUTE=str(CHALLENGES_PER_MINUTE),
    )
    credit_wallet = Keypair()
    prober, prober_ata = funded_wallet(chain, FUNDED)
    # Served in this process, beside three reference clients signing at full speed: on a loaded
    # machine they hold the event loop for seconds, past a store's default 2 s timeout.
    store = store_at(redis_url, LOADED_TIMEOUT_S)
    try:
        async with run_gateway(env, store=store) as gateway:
            await fund(store, credit_wallet, FUNDED)
            async with (
                reference_http(chain.payer, rpc.url, sign_in=False) as paying,
                reference_http(prober, rpc.url, sign_in=True) as probing,
                reference_http(credit_wallet, rpc.url, sign_in=True) as crediting,
            ):
                # Each paying agent has paid before: a record of 4 settled payments allows it 9
                # settlements in flight (a new payer 1, each waiting for the last to confirm,
                # which a loaded machine can stretch past the 5 s a settlement waits its turn).
                for http in (paying, probing):
                    for n in range(4):
                        reply = await http.post(gateway.url + GET_BALANCE, json=balance_body(request_id=n))
                        assert reply.status_code == 200, reply.text
                provider.calls.clear()
                before, prober_before = Money.of(chain), Money.of(chain, prober_ata)
                paid, probed, on_credit = await asyncio.gather(
                    *(
                        paced(
                            lambda i, http=http, path=path: http.post(
                                gateway.url + path, json=balance_body(request_id=i)
                            )
                        )
                        for http, path in (
                            (paying, GET_BALANCE),
                            (probing, GET_BALANCE),
                            (crediting, ON_CREDIT),
                        )
                    )
                )
            spent, prober_spent = (
                Money.of(chain).minus(before),
                Money.of(chain, prober_ata).minus(prober_before),
            )
            left = await credit_of(store, credit_wallet)

            async with aiohttp.ClientSession() as http:
                never_paying = []
                for _ in range(CHALLENGES_PER_MINUTE + 1):
                    async with http.post(
                        gateway.url + GET_BALANCE, json=balance_body(), headers=via(CLIENT_IP)
                    ) as reply:
                        never_paying.append(
                            (reply.status, reply.headers.get("retry-after"), await reply.read())
                        )
    finally:
        await provider.stop()
        await store.close()

    refused = [r.text for r in [*paid, *probed, *on_credit] if r.status_code != 200][:1]
    price = CALLS * GET_BALANCE_PRICE_INTERNAL
    assert [r.status_code for r in paid] == [200] * CALLS, refused
    assert [r.status_code for r in probed] == [200] * CALLS, refused
    for reply in [*paid, *probed]:
        assert "payment-response" in reply.headers and "x-credit-balance" not in reply.headers
    assert (prober_spent.client_usdc, spent.client_usdc) == (-price, -price)
    assert spent.pay_to_usdc == 2 * price

    assert [r.status_code for r in on_credit] == [200] * CALLS, refused
    assert all("payment-response" not in r.headers for r in on_credit)
    assert left.balance == FUNDED - CALLS * CALL_CREDIT
    assert len(provider.calls) == 3 * CALLS

    statuses = [status for status, _, _ in never_paying]
    assert statuses == [402] * CHALLENGES_PER_MINUTE + [429]
    _, retry_after, raw = never_paying[-1]
    body = json.loads(raw)
    assert body["error"]["code"] == "rate_limited"
    assert body["error"]["details"]["scope"] == "challenge:ip"
    assert retry_after is not None and int(retry_after) >= 1
