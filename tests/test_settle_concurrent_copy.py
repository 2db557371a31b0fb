"""A concurrent copy of a paid request reconciles its settlement while the request that claimed
the payment is still settling it: whichever of the two the facilitator reports first, the
payment settled once, exactly one of them delivers the answer, and the other is told
``payment_already_used``, never ``settlement_failed`` (which would invite the client to pay
again for a payment that settled).

The interleaving is forced, not hoped for: the facilitator (a third party, so a stand-in) holds
the claim holder's settle until the copy has landed the payment, and answers as a real one does
for one message: ``success`` to the settle that lands it, ``duplicate_settlement`` naming the
same transaction to every other. The whole paid pipeline runs in-process over a real store
(memory, Redis and a 3-master Redis Cluster), with real signed payments.

Our own fee payer does not settle for a client IP cooling down after a failure; nothing is asked
of the facilitator then. That is final for a payment nobody else is settling, but not for a
retry whose first broadcast may have landed, nor for a request whose copy is reconciling its
intent (the store is held still at the cool-down's read to force that one): both are pending,
never failed.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest
import pytest_asyncio

from gateway.methods.exact.fee_guard import FeeGuard, Party
from gateway.methods.exact.ledger import PendingSettlement, StoredResponse
from gateway.methods.exact.offer import Option, RouteOffers
from gateway.methods.exact.settlement import Settlement
from gateway.methods.results import (
    Authorization,
    Candidate,
    Delivered,
    Failed,
    Paid,
    PaidRequest,
    Pending,
    Reconcile,
    Replay,
)
from gateway.routing.pricing import FacilitatorFee
from gateway.store import Script, Store, keys
from gateway.store.memory import MemoryStore
from gateway.x402 import svm
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, SettleResponse
from tests.support.inprocess import (
    CLIENT_IP,
    PROVIDER_ANSWER,
    Answer,
    PaidRoute,
    RecordingFacilitator,
    UpstreamStandIn,
    balance_body,
    call,
    paid_route,
    payment_header,
    settle_refused,
    settled,
)
from tests.support.redis_fixtures import STORE_KINDS, fresh_store
from tests.test_credits import store

__all__ = ["store"]  # the memory, Redis and cluster store, as the credit tests run on all three

LANDED = "5igLanded"


class OneMessageFacilitator(RecordingFacilitator):
    """Settles one payment as a real facilitator does: the first settle call is held until
    :attr:`release` is set (the claim holder, still waiting on the chain); the settle that lands
    the payment answers ``success``, every later one ``duplicate_settlement`` with its signature.
    With :attr:`hold_lander`, the settle that lands it answers only once :attr:`answer_lander`
    is set (its answer is slow to come back, the payment already recorded as settled)."""

    def __init__(self, fee_payer: str) -> None:
        super().__init__(fee_payer)
        self.first_waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.hold_lander = False
        self.answer_lander = asyncio.Event()
        self.lander_held = asyncio.Event()
        self.landed = False

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse:
        self.settled.append(payload)
        if len(self.settled) == 1:
            self.first_waiting.set()
            await self.release.wait()
        if self.landed:
            return settle_refused("duplicate_settlement", transaction=LANDED)
        self.landed = True
        if self.hold_lander:
            self.lander_held.set()
            await self.answer_lander.wait()
        return settled(LANDED)


@pytest_asyncio.fixture(params=STORE_KINDS)
async def route(
    request: pytest.FixtureRequest, upstash_url_and_token: tuple[str, str]
) -> AsyncIterator[PaidRoute]:
    store = fresh_store(request, request.param, upstash_url_and_token)
    try:
        yield paid_route(store, facilitator=OneMessageFacilitator)
    finally:
        await store.close()


def _facilitator(route: PaidRoute) -> OneMessageFacilitator:
    assert isinstance(route.facilitator, OneMessageFacilitator)
    return route.facilitator


def assert_delivered(answer: Answer) -> None:
    assert answer.status == 200, answer.body
    assert answer.body == PROVIDER_ANSWER
    receipt = json.loads(base64.b64decode(answer.headers["payment-response"]))
    assert (receipt["success"], receipt["transaction"]) == (True, LANDED)
    assert "errorReason" not in receipt


def assert_already_used(answer: Answer) -> None:
    assert answer.status == 402, answer.body
    assert answer.reason == "payment_already_used"
    assert PROVIDER_ANSWER not in answer.body  # the answer is not given twice
    assert "payment-response" not in answer.headers


async def test_the_claim_holder_hearing_its_copys_settlement_is_told_already_used(route: PaidRoute) -> None:
    """The copy lands the payment and delivers; the claim holder then hears the duplicate."""
    facilitator = _facilitator(route)
    upstream = UpstreamStandIn()
    app = route.pipeline(upstream)
    headers = payment_header(route.sign())

    holder = asyncio.create_task(call(app, headers=headers, body=balance_body()))
    await facilitator.first_waiting.wait()  # its intent is written, its settle is out
    copy = await call(app, headers=headers, body=balance_body())
    facilitator.release.set()
    first = await holder

    assert_delivered(copy)
    assert_already_used(first)
    assert upstream.calls == 1 and len(facilitator.verified) == 1 and len(facilitator.settled) == 2
    key, payer = _payment_key(route), str(route.wallets.payer.pubkey())
    assert await route.store.get(keys.delivery(payer, key)) is not None
    assert not await route.store.get(keys.pending_settlement(payer, key))  # the intent is closed


async def test_the_claim_holder_hearing_the_duplicate_first_delivers_and_the_copy_is_refused(
    route: PaidRoute,
) -> None:
    """The copy lands the payment, but its answer is slow: the claim holder hears the duplicate
    before the copy delivered, and delivers itself; the copy, answered later, is refused."""
    facilitator = _facilitator(route)
    facilitator.hold_lander = True
    app = route.pipeline(UpstreamStandIn())
    headers = payment_header(route.sign())

    holder = asyncio.create_task(call(app, headers=headers, body=balance_body()))
    await facilitator.first_waiting.wait()
    copy = asyncio.create_task(call(app, headers=headers, body=balance_body()))
    await facilitator.lander_held.wait()  # the copy's settle landed the payment; its answer is held
    facilitator.release.set()
    first = await holder
    facilitator.answer_lander.set()
    second = await copy

    assert_delivered(first)
    assert_already_used(second)
    assert len(facilitator.settled) == 2


def _payment_key(route: PaidRoute) -> str:
    """The one payment both requests offered (the facilitator saw it first)."""
    return svm.payment_key(svm.decode_transaction(route.facilitator.settled[0].payload["transaction"]))


# --- our own fee payer: a client cooling down ------------------------------------------------

ANSWER = StoredResponse(status=200, body=PROVIDER_ANSWER, content_type="application/json")
COOLING_IP = Party("ip", CLIENT_IP)


def _settled_by_our_fee_payer(route: PaidRoute) -> Settlement:
    """The route's settlement as the internal facilitator's: the fee guard holds client IPs."""
    option = next(iter(route.settlement.offers.options.values()))
    ours = dataclasses.replace(option.settling, fee=FacilitatorFee(internal=True))
    offers = RouteOffers([Option(ours, option.challenge)], route.settlement.offers.health)
    return Settlement(
        route_name=route.route.name,
        ledger=route.ledger,
        offers=offers,
        replay_cap_bytes=route.route.replay_cap_bytes,
        guard=FeeGuard(route.store),
    )


async def _authorize(route: PaidRoute, payment: PaymentPayload) -> Authorization:
    async def body() -> bytes:
        return balance_body()

    candidate = await route.gate.inspect(encode_header(payment), body)
    assert isinstance(candidate, Candidate), candidate
    return await route.gate.authorize(candidate, CLIENT_IP)


async def _intent(store: Store, paid: PaidRequest) -> PendingSettlement | None:
    raw = await store.get(keys.pending_settlement(paid.payer, paid.key))
    return msgspec.json.decode(raw, type=PendingSettlement) if raw else None


async def test_a_retry_whose_broadcast_may_have_landed_is_pending_while_its_client_cools_down(
    store: Store,
) -> None:
    route = paid_route(store)
    settlement = _settled_by_our_fee_payer(route)
    payment = route.sign()
    paid = await _authorize(route, payment)
    assert isinstance(paid, Paid)
    route.facilitator.settle_answers.append(settle_refused("settlement_pending", transaction="tx-sent"))
    assert await settlement.settle(paid.paid, ANSWER) == Pending()
    await FeeGuard(store).failed([COOLING_IP])  # another settlement of this client failed on chain

    retry = await _authorize(route, payment)
    assert isinstance(retry, Reconcile)
    assert await settlement.reconcile(retry) == Pending()

    assert len(route.facilitator.settled) == 1  # nothing asked while it cools down
    intent = await _intent(store, paid.paid)
    assert intent is not None and (intent.transaction, intent.retried) == ("tx-sent", True)


async def test_a_payment_nobody_settles_fails_while_its_client_cools_down(store: Store) -> None:
    route = paid_route(store)
    settlement = _settled_by_our_fee_payer(route)
    paid = await _authorize(route, route.sign())
    assert isinstance(paid, Paid)
    await FeeGuard(store).failed([COOLING_IP])

    assert await settlement.settle(paid.paid, ANSWER) == Failed("invalid_transaction_state")
    assert route.facilitator.settled == []
    assert await _intent(store, paid.paid) is None  # closed: nothing to reconcile


class HeldAtTheCoolDown(MemoryStore):
    """The in-process store, holding its first read of the client IP's cool-down until
    :attr:`release` is set: the claim holder stands there, between its intent and its settle."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> object:
        if COOLING_IP.cooldown_key in keys and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return await super().run(script, keys, args)


async def test_the_claim_holder_cooling_down_while_its_copy_settled_is_pending_not_failed() -> None:
    store = HeldAtTheCoolDown()
    route = paid_route(store)
    settlement = _settled_by_our_fee_payer(route)
    payment = route.sign()
    paid = await _authorize(route, payment)
    assert isinstance(paid, Paid)

    holder = asyncio.create_task(settlement.settle(paid.paid, ANSWER))
    await store.reached.wait()  # its intent is written; it is about to take its turn
    retry = await _authorize(route, payment)
    assert isinstance(retry, Reconcile)
    copy = await settlement.reconcile(retry)
    await FeeGuard(store).failed([COOLING_IP])  # then a settlement of this client fails
    store.release.set()
    first = await holder

    assert isinstance(copy, Delivered) and copy.settlement == "tx-1"
    assert first == Pending()  # not settlement_failed: its retry gets the answer
    assert len(route.facilitator.settled) == 1
    assert await _authorize(route, payment) == Replay(copy.response)  # the holder's retry: the answer
