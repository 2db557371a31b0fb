"""One payment message buys one answer, however many client signatures it carries.

An ed25519 signer may choose its nonce, so the client can attach any number of valid signatures
to one payment message (tests/support/adversarial_paid.py builds them with libsodium's group
operations and checks each with solders). The gateway knows a payment by its message: the first
request claims it, every other copy is refused, the provider is called once, the money moves once.
Settlements are real: the internal facilitator, or the reference facilitator through the fake CDP
server, signing and broadcasting on LiteSVM. The claims live in the shared store: single-node
Redis, then a 3-master Redis Cluster.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.adversarial_paid import (
    ONE_SETTLEMENT_FEE,
    LateConfirmationBackend,
    Money,
    another_client_signature,
)
from tests.support.cdp_facilitator import ReferenceBackend
from tests.support.paid_fixtures import (
    GET_BALANCE,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    assert_challenge,
    balance_body,
    paid_gateways_on_the_store,
)
from tests.support.paid_processes import eventually
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")
redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()


def assert_one_answered(replies: list[Reply], price: int) -> Reply:
    """Exactly one reply carries the paid answer; every other one is refused as a reuse."""
    answered = [r for r in replies if r.status == 200]
    assert len(answered) == 1, [(r.status, r.body) for r in replies]
    assert_answered(answered[0])
    for reply in replies:
        if reply is not answered[0]:
            assert_challenge(reply, "payment_already_used", price)
    return answered[0]


def assert_one_sale(paid: PaidGateway, rpc: LiteSvmRpcServer, before: Money) -> None:
    """The provider was called once and the money moved once, by one landed transaction: the
    client paid the price of ``paid``'s facilitator to payTo, the fee payer one transaction fee."""
    assert paid.upstream_calls == 1
    assert len(set(rpc.sent)) == 1
    one_sale = Money(-paid.balance_price, paid.balance_price, -ONE_SETTLEMENT_FEE)
    assert Money.of(paid.chain).minus(before) == one_sale


async def _internal(start_paid_gateway: StartPaidGateway) -> PaidGateway:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    return paid


async def test_copies_of_one_message_with_other_client_signatures_are_refused_after_the_first(
    start_paid_gateway: StartPaidGateway, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _internal(start_paid_gateway)
    first = await paid.payment()
    copies = [another_client_signature(first, paid.chain.payer) for _ in range(2)]
    assert len({p.payload["transaction"] for p in [first, *copies]}) == 3
    before = Money.of(paid.chain)

    answered = await paid.pay(GET_BALANCE, balance_body(), first)
    refused = [await paid.pay(GET_BALANCE, balance_body(), copy) for copy in copies]

    assert_answered(answered)
    for reply in refused:
        assert_challenge(reply, "payment_already_used", paid.balance_price)
    assert_one_sale(paid, solana_rpc_server, before)


async def test_copies_of_one_message_sent_at_once_reach_the_provider_once(
    start_paid_gateway: StartPaidGateway, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _internal(start_paid_gateway)
    first = await paid.payment()
    payments = [first, *(another_client_signature(first, paid.chain.payer) for _ in range(3))]
    before = Money.of(paid.chain)

    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), p) for p in payments))

    assert_one_answered(replies, paid.balance_price)
    assert_one_sale(paid, solana_rpc_server, before)


async def test_copies_of_one_message_sent_at_once_ask_the_facilitator_once(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The claim comes before the verify: of copies of one message under other client
    signatures sent at once, only the one holding the claim costs a facilitator call (the
    reference facilitator, verifying and settling for real)."""
    backend = ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url)
    paid = await start_paid_gateway(backend=backend)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    first = await paid.payment()
    payments = [first, *(another_client_signature(first, usdc_chain.payer) for _ in range(5))]
    before = Money.of(usdc_chain)

    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), p) for p in payments))

    assert_one_answered(replies, paid.balance_price)
    assert paid.verify_calls() == paid.settle_calls() == 1
    assert_one_sale(paid, solana_rpc_server, before)


async def test_a_payment_identifier_retry_with_another_signature_replays_without_paying_again(
    start_paid_gateway: StartPaidGateway, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The payment-identifier record is keyed on the message too: a copy re-signed by the client
    is the same payment, so it gets the stored answer; nothing is called or settled again."""
    paid = await _internal(start_paid_gateway)
    first = await paid.payment(payment_id="retry-same-message-0001")
    before = Money.of(paid.chain)
    assert_answered(await paid.pay(GET_BALANCE, balance_body(), first))

    replay = await paid.pay(GET_BALANCE, balance_body(), another_client_signature(first, paid.chain.payer))

    assert_answered(replay)
    assert_one_sale(paid, solana_rpc_server, before)


async def test_retries_of_a_pending_settlement_with_three_client_signatures_get_one_answer(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The attack as reported: a settlement confirms slowly (settlement_pending), then the client
    retries with three signatures of the one message. Each retry reconciles the pending
    settlement; exactly one of them gets the withheld answer, the others are refused."""
    backend = LateConfirmationBackend(usdc_chain, solana_rpc_server)
    paid = await start_paid_gateway(backend=backend)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    first = await paid.payment()
    before = Money.of(paid.chain)
    request = asyncio.create_task(paid.pay(GET_BALANCE, balance_body(), first))
    await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the settlement broadcast")
    backend.signer.release.set()  # the facilitator stops waiting: settlement_pending
    pending = await request
    assert pending.status == 503, pending.body
    assert pending.error_code == "settlement_pending"
    assert pending.headers["retry-after"] == "2"
    assert str(MARKER) not in pending.body.decode()

    retries = [first, *(another_client_signature(first, paid.chain.payer) for _ in range(2))]
    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), p) for p in retries))

    answered = assert_one_answered(replies, paid.balance_price)
    assert answered.header_json("payment-response")["transaction"] == solana_rpc_server.sent[0]
    assert_one_sale(paid, solana_rpc_server, before)
