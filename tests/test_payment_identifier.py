"""The payment-identifier extension on paid routes: idempotent retries of one paid request.

Same id + same payment + same request within 10 minutes: the stored response again, with the
same payment-response headers, and neither the provider nor the facilitator is asked again.
Same id with another payment or request: 409 ``idempotency_conflict``. Without an id, reuse of
a payment is ``payment_already_used``.
"""

from __future__ import annotations

import pytest

from tests.support.cdp_facilitator import Fault
from tests.support.paid_fixtures import GET_BALANCE, PaidGateway, balance_body, reference_client_header
from tests.support.solana_rpc_server import LiteSvmRpcServer
from tests.support.upstream import static

PAYMENT_ID = "pay_0123456789abcdef0123"
PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 3}, "value": 5150}}

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")


async def test_retry_with_the_same_payment_identifier_returns_the_stored_response(paid: PaidGateway) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment(payment_id=PAYMENT_ID)
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert first.status == 200

    again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert again.status == 200
    assert again.body == first.body
    assert again.json() == PROVIDER_ANSWER
    assert again.headers["payment-response"] == first.headers["payment-response"]
    assert again.headers["x-payment-response"] == first.headers["x-payment-response"]
    assert paid.upstream_calls == 1
    assert paid.verify_calls() == paid.settle_calls() == 1


async def test_reference_client_payment_identifier_retry_is_idempotent(
    paid: PaidGateway, solana_rpc_server: LiteSvmRpcServer
) -> None:
    header = await reference_client_header(
        (await paid.challenge()).headers["payment-required"],
        paid.chain.payer,
        solana_rpc_server.url,
        with_payment_identifier=PAYMENT_ID,
    )
    first = await paid.pay(GET_BALANCE, balance_body(), header)
    assert first.status == 200, first.body

    again = await paid.pay(GET_BALANCE, balance_body(), header)

    assert again.status == 200
    assert again.headers["payment-response"] == first.headers["payment-response"]
    assert paid.upstream_calls == paid.settle_calls() == 1


async def test_same_payment_identifier_with_another_body_is_409(paid: PaidGateway) -> None:
    payment = await paid.payment(payment_id=PAYMENT_ID)
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 200

    reply = await paid.pay(GET_BALANCE, balance_body(request_id=99), payment)

    assert reply.status == 409
    assert reply.error_code == "idempotency_conflict"
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == paid.settle_calls() == paid.verify_calls() == 1


async def test_same_payment_identifier_with_another_payment_is_409(paid: PaidGateway) -> None:
    assert (
        await paid.pay(GET_BALANCE, balance_body(), await paid.payment(payment_id=PAYMENT_ID))
    ).status == 200
    other = await paid.payment(payment_id=PAYMENT_ID)

    reply = await paid.pay(GET_BALANCE, balance_body(), other)

    assert reply.status == 409
    assert reply.error_code == "idempotency_conflict"
    assert paid.upstream_calls == paid.settle_calls() == paid.verify_calls() == 1


async def test_payment_retried_without_its_identifier_gets_the_same_answer_once_paid(
    paid: PaidGateway,
) -> None:
    """The payment (its message), route and body are what was paid for; the identifier is only
    the client's name for the request."""
    with_id = await paid.payment(payment_id=PAYMENT_ID)
    first = await paid.pay(GET_BALANCE, balance_body(), with_id)
    assert first.status == 200
    without_id = type(with_id)(x402Version=2, payload=with_id.payload, accepted=with_id.accepted)

    again = await paid.pay(GET_BALANCE, balance_body(), without_id)
    other = await paid.pay(GET_BALANCE, balance_body(request_id=2), without_id)

    assert (again.status, again.body) == (200, first.body)
    assert other.status == 402
    assert other.json()["error"] == "payment_already_used"
    assert paid.upstream_calls == paid.settle_calls() == 1


@pytest.mark.parametrize(
    "payment_id",
    ["short", "has spaces in it, sixteen+", "x" * 129, "sixteen-chars-ok\n", "newline\ninside-0123"],
    ids=["short", "spaces", "too-long", "trailing-newline", "inner-newline"],
)
async def test_malformed_payment_identifier_is_402(paid: PaidGateway, payment_id: str) -> None:
    payment = await paid.payment(payment_id=payment_id)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402
    assert reply.json()["error"] == "invalid_payment_identifier"
    assert paid.verify_calls() == paid.upstream_calls == 0


async def test_pending_settlement_with_payment_identifier_reconciles_on_retry(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment(payment_id=PAYMENT_ID)
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 2


async def test_payment_identifier_replay_after_reconciliation_returns_the_stored_response(
    paid: PaidGateway,
) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment(payment_id=PAYMENT_ID)
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503
    settled = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert settled.status == 200

    again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert again.status == 200
    assert again.headers["payment-response"] == settled.headers["payment-response"]
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 2
