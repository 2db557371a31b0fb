"""The payment core, called directly: every outcome of PaymentGate and Settlement.

No HTTP at all: a real store (in-process and Redis), real signed Solana payments, and a recording facilitator
(the one third party). Each test says what was, and was not, verified, claimed and settled.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.errors import GatewayError
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.limits.rate_limiter import Limited
from gateway.methods.exact.ledger import ANSWER_CAP_BYTES, PaymentLedger, PendingSettlement, StoredResponse
from gateway.methods.exact.settlement import Settlement
from gateway.methods.results import (
    Authorization,
    Candidate,
    Conflict,
    Delivered,
    Failed,
    Interrupted,
    Paid,
    PaidRequest,
    Pending,
    Reconcile,
    Refused,
    Replay,
)
from gateway.routing.routes import RateLimitSpec
from gateway.routing.validation import InvalidInput
from gateway.store import Store, StoreUnavailable, keys
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.x402 import svm
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, VerifyResponse
from tests.support.adversarial_paid import another_client_signature
from tests.support.inprocess import (
    CLIENT_IP,
    PROVIDER_ANSWER,
    PaidRoute,
    RecordingFacilitator,
    balance_body,
    balance_route,
    paid_route,
    settle_refused,
)
from tests.support.ports import refusing_port
from tests.support.redis_server import RedisServer

PAYMENT_ID = "retry-me-0123456789"
ANSWER = StoredResponse(status=200, body=PROVIDER_ANSWER, content_type="application/json")


class Body:
    """A body reader that counts how often the gate asked for the body."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.reads = 0

    async def __call__(self) -> bytes:
        self.reads += 1
        return self.raw


@pytest_asyncio.fixture(params=["memory", "redis"])
async def route(request: pytest.FixtureRequest) -> AsyncIterator[PaidRoute]:
    """The same core over each real store: the one in-process and Redis (the shared one)."""
    if request.param == "memory":
        yield paid_route(MemoryStore())
        return
    store = RedisStore(request.getfixturevalue("clean_redis_url"))
    try:
        yield paid_route(store)
    finally:
        await store.close()


async def _candidate(route: PaidRoute, payment: PaymentPayload, body: bytes | None = None) -> Candidate:
    inspected = await route.gate.inspect(encode_header(payment), Body(body or balance_body()))
    assert isinstance(inspected, Candidate), inspected
    return inspected


async def _intent(route: PaidRoute, key: str) -> PendingSettlement | None:
    """The payment's write-ahead record as the store holds it (an empty one is closed)."""
    raw = await route.store.get(keys.pending_settlement(str(route.wallets.payer.pubkey()), key))
    return msgspec.json.decode(raw, type=PendingSettlement) if raw else None


async def _paid(route: PaidRoute, payment: PaymentPayload, body: bytes | None = None) -> PaidRequest:
    authorized = await route.gate.authorize(await _candidate(route, payment, body), CLIENT_IP)
    assert isinstance(authorized, Paid), authorized
    return authorized.paid


# --- inspect: the local checks --------------------------------------------------------------


async def test_an_undecodable_header_is_refused_before_the_body_is_read(route: PaidRoute) -> None:
    body = Body(balance_body())
    refused = await route.gate.inspect("not base64 json", body)
    assert isinstance(refused, Refused) and refused.reason == "invalid_payment_header"
    assert body.reads == 0


async def test_an_invalid_body_is_invalid_input_before_the_payment_is_looked_at(route: PaidRoute) -> None:
    with pytest.raises(InvalidInput) as invalid:
        await route.gate.inspect(encode_header(route.sign()), Body(b'{"jsonrpc": "2.0"}'))
    assert invalid.value.where == "method"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"amount": "1"}, "amount_mismatch"),
        ({"asset": "So11111111111111111111111111111111111111112"}, "asset_mismatch"),
        ({"network": "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"}, "invalid_network"),
        ({"scheme": "upto"}, "invalid_scheme"),
    ],
)
async def test_a_payment_for_other_terms_is_refused_by_name(
    route: PaidRoute, change: dict[str, str], reason: str
) -> None:
    payment = route.sign()
    assert payment.accepted is not None
    accepted = msgspec.structs.replace(payment.accepted, **change)
    tampered = PaymentPayload(x402Version=2, payload=payment.payload, accepted=accepted)
    refused = await route.gate.inspect(encode_header(tampered), Body(balance_body()))
    assert isinstance(refused, Refused) and refused.reason == reason
    assert refused.payer is None  # nothing learned about who pays: nothing logged against them


async def test_a_self_transfer_is_refused(route: PaidRoute) -> None:
    payment = route.sign(payer=route.wallets.pay_to)
    refused = await route.gate.inspect(encode_header(payment), Body(balance_body()))
    assert isinstance(refused, Refused) and refused.reason == "self_transfer"


async def test_a_client_signature_that_does_not_verify_is_refused(route: PaidRoute) -> None:
    payment = route.sign()
    raw = bytearray(base64.b64decode(payment.payload["transaction"]))
    raw[1 + 64 + 10] ^= 0xFF  # inside the client's signature (slot 1)
    forged = PaymentPayload(
        x402Version=2,
        payload={"transaction": base64.b64encode(bytes(raw)).decode()},
        accepted=payment.accepted,
    )
    refused = await route.gate.inspect(encode_header(forged), Body(balance_body()))
    assert isinstance(refused, Refused) and refused.reason == svm.Reason.TRANSACTION.value
    assert route.facilitator.verified == []


async def test_a_malformed_payment_identifier_is_refused_naming_the_payer(route: PaidRoute) -> None:
    refused = await route.gate.inspect(encode_header(route.sign(payment_id="short")), Body(balance_body()))
    assert isinstance(refused, Refused) and refused.reason == "invalid_payment_identifier"
    assert refused.payer == str(route.wallets.payer.pubkey())


# --- authorize: store, limits, facilitator, claim -----------------------------------------


async def test_a_good_payment_is_verified_once_claimed_and_paid(route: PaidRoute) -> None:
    payment = route.sign()
    candidate = await _candidate(route, payment)

    authorized = await route.gate.authorize(candidate, CLIENT_IP)

    assert isinstance(authorized, Paid)
    assert authorized.body["method"] == "getBalance"
    assert authorized.paid.payer == str(route.wallets.payer.pubkey())
    assert authorized.paid.requirements.extra == {"feePayer": route.facilitator.fee_payer}
    assert len(route.facilitator.verified) == 1 and route.facilitator.settled == []
    assert await route.store.get(keys.payment_claim(candidate.payer, candidate.key)) is not None


async def test_the_facilitator_refusing_is_refused_with_its_reason_and_nothing_claimed(
    route: PaidRoute,
) -> None:
    route.facilitator.verify_answers.append(VerifyResponse(isValid=False, invalidReason="insufficient_funds"))
    candidate = await _candidate(route, route.sign())

    refused = await route.gate.authorize(candidate, CLIENT_IP)

    assert refused == Refused("insufficient_funds", "", candidate.payer)
    assert await route.store.get(keys.payment_claim(candidate.payer, candidate.key)) is None


async def test_the_facilitator_naming_another_payer_is_refused(route: PaidRoute) -> None:
    route.facilitator.verify_answers.append(VerifyResponse(isValid=True, payer=str(Keypair().pubkey())))
    refused = await route.gate.authorize(await _candidate(route, route.sign()), CLIENT_IP)
    assert isinstance(refused, Refused) and refused.reason == "invalid_payload"


async def test_a_silent_facilitator_is_503_and_nothing_claimed(route: PaidRoute) -> None:
    route.facilitator.verify_answers.append(FacilitatorUnavailable("down"))
    candidate = await _candidate(route, route.sign())
    with pytest.raises(GatewayError) as error:
        await route.gate.authorize(candidate, CLIENT_IP)
    assert (error.value.status, error.value.code) == (503, "facilitator_unavailable")
    assert await route.store.get(keys.payment_claim(candidate.payer, candidate.key)) is None


async def test_a_payment_the_facilitator_refused_may_be_offered_again_and_is_then_paid(
    route: PaidRoute,
) -> None:
    """Its claim, taken before verify, is released when the facilitator refuses: the same signed
    payment, with the same identifier (once its wallet is funded, say), is verified again."""
    route.facilitator.verify_answers.append(VerifyResponse(isValid=False, invalidReason="insufficient_funds"))
    payment = route.sign(payment_id=PAYMENT_ID)

    refused = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)
    again = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    assert isinstance(refused, Refused) and refused.reason == "insufficient_funds"
    assert isinstance(again, Paid) and again.paid.payment_id == PAYMENT_ID
    assert len(route.facilitator.verified) == 2 and route.facilitator.settled == []


async def test_a_payment_whose_facilitator_was_silent_may_be_offered_again(route: PaidRoute) -> None:
    route.facilitator.verify_answers.append(FacilitatorUnavailable("down"))
    payment = route.sign()
    with pytest.raises(GatewayError):
        await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    assert isinstance(await route.gate.authorize(await _candidate(route, payment), CLIENT_IP), Paid)


async def test_of_concurrent_offers_of_one_payment_only_the_claim_holder_asks_the_facilitator(
    route: PaidRoute,
) -> None:
    payment = route.sign()
    candidates = [await _candidate(route, payment) for _ in range(8)]

    results = await asyncio.gather(*(route.gate.authorize(candidate, CLIENT_IP) for candidate in candidates))

    assert sum(isinstance(result, Paid) for result in results) == 1
    assert (
        sorted(result.reason for result in results if isinstance(result, Refused))
        == ["payment_already_used"] * 7
    )
    assert len(route.facilitator.verified) == 1


class StoreLostAtVerify(RecordingFacilitator):
    """Refuses the payment, but the store goes away while it is being asked."""

    def __init__(self, fee_payer: str, server: RedisServer) -> None:
        super().__init__(fee_payer)
        self.server = server

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse:
        await asyncio.to_thread(self.server.stop)
        self.verified.append(payload)
        return VerifyResponse(isValid=False, invalidReason="insufficient_funds")


async def test_a_refused_payment_is_refused_by_its_reason_even_when_its_release_fails(
    private_redis: RedisServer,
) -> None:
    """The store is lost between the claim and the refusal: the client still hears the reason
    (the payment stays claimed, so it signs a new one; nothing moved)."""
    store = RedisStore(private_redis.url, timeout_s=0.5)
    try:
        route = paid_route(store, facilitator=lambda fee_payer: StoreLostAtVerify(fee_payer, private_redis))
        facilitator = route.facilitator
        candidate = await _candidate(route, route.sign())

        refused = await route.gate.authorize(candidate, CLIENT_IP)
    finally:
        await store.close()

    assert refused == Refused("insufficient_funds", "", candidate.payer)
    assert len(facilitator.verified) == 1


async def test_a_used_payment_is_refused_from_the_store_without_asking_the_facilitator(
    route: PaidRoute,
) -> None:
    payment = route.sign()
    await _paid(route, payment)

    refused = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    assert isinstance(refused, Refused) and refused.reason == "payment_already_used"
    assert len(route.facilitator.verified) == 1


async def test_the_wallet_limit_is_spent_only_by_signed_payments() -> None:
    wallet = RateLimitSpec(scope="rpc:wallet", limit=1, period_ms=60_000, per="wallet")
    route = paid_route(MemoryStore(), balance_route(rate_limits=[wallet]))
    await _paid(route, route.sign())
    limited = await route.gate.authorize(await _candidate(route, route.sign()), CLIENT_IP)
    assert isinstance(limited, Limited)
    assert limited.error.status == 429 and limited.error.headers["Retry-After"]
    assert len(route.facilitator.verified) == 1  # the limit comes before the facilitator


async def test_a_payment_identifier_of_another_request_is_a_409(route: PaidRoute) -> None:
    await _paid(route, route.sign(payment_id=PAYMENT_ID))
    conflict = await _offer(route, route.sign(payment_id=PAYMENT_ID))
    assert conflict == Conflict("payment identifier was used with another payment or request")


async def test_a_settled_request_with_a_payment_identifier_replays_its_answer(route: PaidRoute) -> None:
    payment = route.sign(payment_id=PAYMENT_ID)
    paid = await _paid(route, payment)
    delivered = await route.settlement.settle(paid, ANSWER)
    assert isinstance(delivered, Delivered)

    replay = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    assert replay == Replay(delivered.response)
    assert replay.response.payment_response and replay.response.body == PROVIDER_ANSWER
    assert len(route.facilitator.verified) == 1 and len(route.facilitator.settled) == 1


async def test_the_request_whose_settlement_is_pending_is_told_to_reconcile(route: PaidRoute) -> None:
    payment = route.sign()
    paid = await _paid(route, payment)
    route.facilitator.settle_answers.append(FacilitatorUnavailable("silent"))
    assert await route.settlement.settle(paid, ANSWER) == Pending()

    retry = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    assert isinstance(retry, Reconcile)
    assert retry.paid.key == paid.key and retry.intent.response == ANSWER
    other = await _candidate(route, payment, balance_body(request_id=2))
    other_body = await route.gate.authorize(other, CLIENT_IP)
    assert isinstance(other_body, Refused) and other_body.reason == "payment_already_used"


# --- settle and reconcile -------------------------------------------------------------------


async def test_settling_delivers_the_answer_with_the_payment_response(route: PaidRoute) -> None:
    paid = await _paid(route, route.sign())

    delivered = await route.settlement.settle(paid, ANSWER)

    assert isinstance(delivered, Delivered) and delivered.settlement == "tx-1"
    header = json.loads(base64.b64decode(delivered.response.payment_response))
    assert header["success"] is True and header["transaction"] == "tx-1"
    assert await _intent(route, paid.key) is None  # the intent is closed
    assert len(route.facilitator.settled) == 1


async def test_an_unknown_outcome_is_pending_with_the_intent_kept(route: PaidRoute) -> None:
    paid = await _paid(route, route.sign())
    route.facilitator.settle_answers.append(settle_refused("settlement_pending", transaction="tx-sent"))

    assert await route.settlement.settle(paid, ANSWER) == Pending()

    intent = await _intent(route, paid.key)
    assert intent is not None and intent.transaction == "tx-sent" and intent.response == ANSWER


async def test_a_final_refusal_is_failed_and_the_intent_closed(route: PaidRoute) -> None:
    paid = await _paid(route, route.sign())
    route.facilitator.settle_answers.append(settle_refused("insufficient_funds"))

    assert await route.settlement.settle(paid, ANSWER) == Failed("insufficient_funds")
    assert await _intent(route, paid.key) is None
    # the payment stays used
    assert await route.store.get(keys.payment_claim(paid.payer, paid.key)) is not None


async def test_a_reconciled_duplicate_is_delivered_once_as_a_plain_success(route: PaidRoute) -> None:
    payment = route.sign()
    paid = await _paid(route, payment)
    route.facilitator.settle_answers += [
        settle_refused("settlement_pending", transaction="tx-first"),
        settle_refused("duplicate_settlement", transaction="tx-first"),
        settle_refused("duplicate_settlement", transaction="tx-first"),
    ]
    assert await route.settlement.settle(paid, ANSWER) == Pending()
    retry = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)
    assert isinstance(retry, Reconcile)

    delivered = await route.settlement.reconcile(retry)
    again = await route.settlement.reconcile(retry)

    assert isinstance(delivered, Delivered) and delivered.settlement == "tx-first"
    header = json.loads(base64.b64decode(delivered.response.payment_response))
    assert header["success"] is True and "errorReason" not in header
    assert isinstance(again, Refused) and again.reason == "payment_already_used"
    assert len(route.facilitator.settled) == 3


async def test_a_refusal_while_the_intent_is_open_stays_pending(route: PaidRoute) -> None:
    payment = route.sign()
    paid = await _paid(route, payment)
    route.facilitator.settle_answers += [
        FacilitatorUnavailable("silent"),
        settle_refused("duplicate_settlement"),
    ]
    assert await route.settlement.settle(paid, ANSWER) == Pending()
    retry = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)
    assert isinstance(retry, Reconcile)

    assert await route.settlement.reconcile(retry) == Pending()
    assert await _intent(route, paid.key) is not None  # nothing closed


async def test_a_shutdown_mid_settle_is_interrupted_with_the_intent_kept(route: PaidRoute) -> None:
    paid = await _paid(route, route.sign())
    route.facilitator.settle_answers.append(asyncio.CancelledError())

    assert await route.settlement.settle(paid, ANSWER) == Interrupted()
    assert await _intent(route, paid.key) is not None


async def test_without_a_store_the_intent_cannot_be_written_and_nothing_is_settled(route: PaidRoute) -> None:
    paid = await _paid(route, route.sign())
    down = RedisStore(f"redis://127.0.0.1:{refusing_port()}/0", timeout_s=0.2)  # nothing listens there
    settlement = Settlement(
        route_name=route.route.name,
        ledger=PaymentLedger(down),
        offers=route.settlement.offers,
        replay_cap_bytes=0,
    )
    try:
        with pytest.raises(StoreUnavailable):
            await settlement.settle(paid, ANSWER)
    finally:
        await down.close()
    assert route.facilitator.settled == []


# --- fair shares: what a refused payment may spend -------------------------------------------------

SCOPE = RateLimitSpec(scope="rpc:scope", limit=2, period_ms=60_000)
PAYER = RateLimitSpec(scope="rpc:wallet", limit=2, period_ms=60_000, per="wallet")
OTHER_IP = "198.51.100.20"


@pytest_asyncio.fixture(params=["memory", "redis"])
async def limited(request: pytest.FixtureRequest) -> AsyncIterator[PaidRoute]:
    """A route whose shared scope allows 2 paid calls a minute, each payer 2, and whose IPs and
    payers may have 3 payments refused by the facilitator a minute."""
    store: Store = (
        MemoryStore() if request.param == "memory" else RedisStore(request.getfixturevalue("clean_redis_url"))
    )
    try:
        yield paid_route(store, balance_route(rate_limits=(SCOPE, PAYER)), refused_per_minute=3)
    finally:
        await store.close()


def _refuse_verifies(route: PaidRoute, n: int) -> None:
    refusal = VerifyResponse(isValid=False, invalidReason="insufficient_funds")
    route.facilitator.verify_answers += [refusal] * n


async def _offer(
    route: PaidRoute, payment: PaymentPayload, ip: str = CLIENT_IP, body: bytes | None = None
) -> Authorization:
    return await route.gate.authorize(await _candidate(route, payment, body), ip)


async def _limited_scope(route: PaidRoute, payment: PaymentPayload, ip: str) -> str:
    limited = await route.gate.authorize(await _candidate(route, payment), ip)
    assert isinstance(limited, Limited)
    assert (limited.error.status, limited.error.code) == (429, "rate_limited")
    assert limited.error.details is not None
    return str(limited.error.details["scope"])


async def test_payments_the_facilitator_refuses_spend_nothing_of_the_shared_scope(limited: PaidRoute) -> None:
    _refuse_verifies(limited, 3)
    for _ in range(3):  # a fresh throwaway wallet each time: its own bucket never stops it
        refused = await _offer(limited, limited.sign(payer=Keypair()))
        assert isinstance(refused, Refused) and refused.reason == "insufficient_funds"

    honest = [await _offer(limited, limited.sign(), OTHER_IP) for _ in range(2)]

    assert all(isinstance(result, Paid) for result in honest)  # the whole scope was still there
    assert await _limited_scope(limited, limited.sign(payer=Keypair()), OTHER_IP) == "rpc:scope"


async def test_an_ip_whose_payments_were_refused_is_stopped_before_it_costs_another_verify(
    limited: PaidRoute,
) -> None:
    _refuse_verifies(limited, 3)
    for _ in range(3):
        await limited.gate.authorize(await _candidate(limited, limited.sign(payer=Keypair())), CLIENT_IP)

    scope = await _limited_scope(limited, limited.sign(payer=Keypair()), CLIENT_IP)

    assert scope == "payments-refused:ip"
    assert len(limited.facilitator.verified) == 3
    assert isinstance(await limited.gate.authorize(await _candidate(limited, limited.sign()), OTHER_IP), Paid)


async def test_a_payer_whose_payment_was_refused_from_many_ips_is_stopped_before_another_verify(
    limited: PaidRoute,
) -> None:
    """The same signed payment from an empty wallet, re-sent from ever new IPs (no per-payer rate
    limit on this route, so only the refusal guard can stop it)."""
    route = paid_route(limited.store, balance_route(rate_limits=(SCOPE,)), refused_per_minute=3)
    _refuse_verifies(route, 3)
    empty = route.sign()
    for n in range(3):
        refused = await _offer(route, empty, f"192.0.2.{n}")
        assert isinstance(refused, Refused) and refused.reason == "insufficient_funds"

    assert await _limited_scope(route, empty, "192.0.2.99") == "payments-refused:payer"
    assert len(route.facilitator.verified) == 3


async def test_a_silent_facilitator_hands_the_scope_back_and_counts_no_refusal(limited: PaidRoute) -> None:
    limited.facilitator.verify_answers += [FacilitatorUnavailable("down")] * 4
    for _ in range(4):
        with pytest.raises(GatewayError):
            await _offer(limited, limited.sign(payer=Keypair()))

    paid = [await _offer(limited, limited.sign()) for _ in range(2)]

    assert all(isinstance(result, Paid) for result in paid)


async def test_a_payer_over_its_own_limit_spends_nothing_shared(limited: PaidRoute) -> None:
    scope = RateLimitSpec(scope="rpc:scope-of-three", limit=3, period_ms=60_000)
    route = paid_route(limited.store, balance_route(rate_limits=(scope, PAYER)))
    for _ in range(2):
        assert isinstance(await route.gate.authorize(await _candidate(route, route.sign()), CLIENT_IP), Paid)
    for _ in range(5):  # its own bucket refuses first, before the scope is charged
        assert await _limited_scope(route, route.sign(), CLIENT_IP) == "rpc:wallet"

    other = await route.gate.authorize(await _candidate(route, route.sign(payer=Keypair())), OTHER_IP)

    assert isinstance(other, Paid)  # the scope's third slot was still free
    assert await _limited_scope(route, route.sign(payer=Keypair()), OTHER_IP) == "rpc:scope-of-three"


# --- the identical request again: the answer that was paid for ------------------------------------


async def _settle(route: PaidRoute, payment: PaymentPayload, body: bytes) -> None:
    paid = await _paid(route, payment, body)
    response = StoredResponse(status=200, body=body, content_type="application/json")
    assert isinstance(await route.settlement.settle(paid, response), Delivered)


async def test_the_identical_request_again_replays_its_answer_and_another_is_refused(
    route: PaidRoute,
) -> None:
    payment = route.sign()
    await _settle(route, payment, balance_body())

    again = await _offer(route, payment, OTHER_IP, balance_body())
    other = await _offer(route, payment, CLIENT_IP, balance_body(request_id=2))

    assert isinstance(again, Replay) and again.response.body == balance_body()
    assert again.response.payment_response  # the settlement's header goes with it
    assert isinstance(other, Refused) and other.reason == "payment_already_used"
    assert len(route.facilitator.verified) == len(route.facilitator.settled) == 1


async def test_a_copy_of_the_message_under_another_client_signature_gets_no_replay(route: PaidRoute) -> None:
    payment = route.sign()
    await _settle(route, payment, balance_body())
    copy = another_client_signature(payment, route.wallets.payer)

    refused = await route.gate.authorize(await _candidate(route, copy, balance_body()), CLIENT_IP)

    assert isinstance(refused, Refused) and refused.reason == "payment_already_used"


@pytest.mark.parametrize("payment_id", [None, PAYMENT_ID], ids=["no-identifier", "identifier"])
async def test_answers_over_the_cap_are_kept_only_for_a_payment_identifier(
    route: PaidRoute, payment_id: str | None
) -> None:
    big = balance_body(account="9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin") + b" " * ANSWER_CAP_BYTES
    payment = route.sign(payment_id=payment_id)
    paid = await _paid(route, payment)
    response = StoredResponse(status=200, body=big, content_type="application/json")
    assert isinstance(await route.settlement.settle(paid, response), Delivered)

    again = await route.gate.authorize(await _candidate(route, payment), CLIENT_IP)

    if payment_id is None:
        assert isinstance(again, Refused) and again.reason == "payment_already_used"
    else:
        assert isinstance(again, Replay) and again.response.body == big
