"""Facilitator failover: several facilitators in FACILITATOR_URL, in order of preference.

Two fake CDP facilitators on loopback, each settling for real through the reference facilitator
on LiteSVM with a fee payer of its own. The 402 offers one ``accepts`` entry per facilitator,
healthy ones first, each naming its own fee payer; a payment is verified and settled by the one
it names. The preferred one is taken down mid-run: the payment signed for it is answered 503
(nothing charged), the next 402 offers the other first, and paid calls keep succeeding through
it. No payment is settled twice: each facilitator settled exactly the payments that named it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
from solders.keypair import Keypair

from gateway.payments.facilitator_health import FacilitatorHealth
from gateway.store.memory import MemoryStore
from gateway.x402.types import PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import Money
from tests.support.cdp_facilitator import CdpCredentials, ReferenceBackend
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.gateway_server import run_gateway
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    PaidGateway,
    balance_body,
    paid_env,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream


def _offers(paid: PaidGateway, header: dict[str, Any]) -> list[tuple[PaymentRequirements, str]]:
    """(requirements, fee payer) of each ``accepts`` entry of a PAYMENT-REQUIRED header, in order."""
    accepts = header["accepts"]
    return [(msgspec.convert(a, PaymentRequirements), a["extra"]["feePayer"]) for a in accepts]


async def _pay_first_offer(paid: PaidGateway, request_id: int) -> tuple[int, str]:
    """What an x402 client does: read the 402, pay its first offer; (status, fee payer used)."""
    header = (await paid.challenge()).header_json("payment-required")
    requirements, fee_payer = _offers(paid, header)[0]
    resource = msgspec.convert(header["resource"], ResourceInfo)
    payment = paid.sign(requirements, resource)
    reply = await paid.pay(GET_BALANCE, balance_body(request_id=request_id), payment)
    return reply.status, fee_payer


async def test_paid_calls_fail_over_to_the_next_facilitator_and_nothing_is_settled_twice(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    other_fee_payer = Keypair()
    usdc_chain.svm.airdrop(other_fee_payer.pubkey(), 1_000_000_000)
    preferred = await start_cdp_facilitator(
        credentials=cdp_credentials, backend=ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url)
    )
    fallback = await start_cdp_facilitator(backend=ReferenceBackend(other_fee_payer, solana_rpc_server.url))
    env = {
        **paid_env(usdc_chain, solana_rpc_server, upstream, preferred),
        "FACILITATOR_URL": f"{preferred.base_url},{fallback.base_url}",
    }
    before = Money.of(usdc_chain)
    async with run_gateway(env) as running, aiohttp.ClientSession() as http:
        paid = PaidGateway(running, usdc_chain, solana_rpc_server, upstream, preferred, http)
        header = (await paid.challenge()).header_json("payment-required")
        offered = _offers(paid, header)
        assert [fee_payer for _, fee_payer in offered] == [
            str(usdc_chain.fee_payer.pubkey()),
            str(other_fee_payer.pubkey()),
        ]
        assert {r.amount for r, _ in offered} == {str(GET_BALANCE_PROVIDER_PRICE)}  # neither adds a fee

        first = [await _pay_first_offer(paid, n) for n in range(3)]
        stale = header  # a client that read the 402 before the outage
        await preferred.stop()
        requirements, _ = _offers(paid, stale)[0]
        resource = msgspec.convert(stale["resource"], ResourceInfo)
        refused = await paid.pay(GET_BALANCE, balance_body(request_id=10), paid.sign(requirements, resource))
        after = [await _pay_first_offer(paid, 20 + n) for n in range(3)]

    assert first == [(200, str(usdc_chain.fee_payer.pubkey()))] * 3
    assert (refused.status, refused.error_code) == (503, "facilitator_unavailable")
    assert after == [(200, str(other_fee_payer.pubkey()))] * 3
    # Each facilitator settled exactly the payments that named its fee payer; six sales in all.
    assert preferred.count("settle") == 3 and fallback.count("settle") == 3
    assert len(solana_rpc_server.sent) == 6
    spent = Money.of(usdc_chain).minus(before)
    six = 6 * GET_BALANCE_PROVIDER_PRICE
    assert (spent.client_usdc, spent.pay_to_usdc) == (-six, six)


async def test_a_facilitator_marked_down_is_offered_last_on_every_replica_and_probed_back() -> None:
    store = MemoryStore()
    answers = {"a": False}

    async def probe_a() -> object:
        if not answers["a"]:
            raise ConnectionError("down")
        return {}

    async def probe_b() -> object:
        return {}

    replica_1 = FacilitatorHealth(store, {"a": probe_a, "b": probe_b}, probe_s=0.0)
    replica_2 = FacilitatorHealth(store, {"a": probe_a, "b": probe_b}, probe_s=0.0)
    assert replica_1.order() == ["a", "b"]

    await replica_1.mark_down("a")
    await replica_2.sync()  # reads the mark; its probe of "a" still fails

    assert replica_1.order() == replica_2.order() == ["b", "a"]
    answers["a"] = True
    await replica_2.sync()  # the probe answers: "a" is offered first again, everywhere
    await replica_1.sync()
    assert replica_1.order() == replica_2.order() == ["a", "b"]
