"""An unpaid request always gets its 402, whatever the facilitator is doing.

The challenge's ``extra.feePayer`` comes from the internal facilitator's own key, else the
external facilitator's last ``/supported`` answer (in memory, or kept in the shared store by any
replica: single-node Redis, and a 3-master cluster), else ``FACILITATOR_FEE_PAYER``. Only a paid
request fails (503) while the facilitator is down, and then nothing is called, claimed or charged.
"""

from __future__ import annotations

from solders.keypair import Keypair

from gateway.store import keys
from tests.support.adversarial_paid import Money
from tests.support.cdp_facilitator import closed_port_url
from tests.support.paid_fixtures import (
    GET_BALANCE,
    PaidGateway,
    Reply,
    StartPaidGateway,
    balance_body,
)
from tests.support.paid_processes import eventually
from tests.support.redis_cluster import keys_matching
from tests.support.redis_fixtures import on_redis_and_cluster

FEE_PAYER_KEYS = keys.FEE_PAYER + "*"
redis_url = on_redis_and_cluster()


def advertised_fee_payer(paid: PaidGateway, reply: Reply) -> str:
    """The fee payer a challenge names; it asks the price of ``paid``'s own facilitator."""
    assert reply.status == 402, reply.body
    assert reply.headers["cache-control"] == "no-store"
    header = reply.header_json("payment-required")
    (accepted,) = header["accepts"]
    assert accepted["amount"] == str(paid.balance_price)
    assert reply.json()["accepts"][0]["extra"] == accepted["extra"]
    fee_payer: str = accepted["extra"]["feePayer"]
    return fee_payer


async def assert_paid_request_is_503(paid: PaidGateway) -> None:
    """A real payment of the challenge, while the facilitator is down: nothing happens."""
    payment = await paid.payment()
    before = Money.of(paid.chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503, reply.body
    assert reply.error_code == "facilitator_unavailable"
    assert paid.upstream_calls == 0
    assert Money.of(paid.chain) == before


async def test_a_facilitator_down_from_the_start_still_gets_the_configured_fee_payer_challenged(
    start_paid_gateway: StartPaidGateway,
) -> None:
    configured = str(Keypair().pubkey())
    paid = await start_paid_gateway(
        env={"FACILITATOR_URL": closed_port_url(), "FACILITATOR_FEE_PAYER": configured}
    )

    assert advertised_fee_payer(paid, await paid.post(GET_BALANCE, balance_body())) == configured
    await assert_paid_request_is_503(paid)


async def test_a_new_replica_challenges_with_the_fee_payer_another_replica_kept_in_the_store(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    store = {"STATE_STORE_REST_URL": clean_redis_url}
    first = await start_paid_gateway(env=store)
    assert first.facilitator is not None
    fee_payer = str(first.chain.fee_payer.pubkey())
    assert advertised_fee_payer(first, await first.post(GET_BALANCE, balance_body())) == fee_payer
    await eventually(
        lambda: bool(keys_matching(clean_redis_url, FEE_PAYER_KEYS)), what="the fee payer kept in the store"
    )
    await first.facilitator.stop()  # down before the new replica ever reaches it

    second = await start_paid_gateway(env={**store, "FACILITATOR_URL": first.facilitator.base_url})

    assert advertised_fee_payer(second, await second.post(GET_BALANCE, balance_body())) == fee_payer
    await assert_paid_request_is_503(second)
    assert first.facilitator.count("verify") == first.facilitator.count("settle") == 0


async def test_the_internal_facilitator_challenges_with_its_own_key_with_its_chain_unreachable(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(internal=True, env={"SOLANA_MAINNET_RPC_URL": closed_port_url("/")})

    reply = await paid.post(GET_BALANCE, balance_body())

    assert advertised_fee_payer(paid, reply) == str(paid.chain.fee_payer.pubkey())
    assert paid.upstream_calls == 0
