"""Prepaid credit in-process, over the real stores: a top-up credits its payer exactly once, a
sign-in spends credit without a transaction, and credit is never overdrawn or taken for nothing.

The facilitator is the recording stand-in (a third party); everything else is the gateway's own:
PaidAccess with the exact and credit methods, the credit book on MemoryStore and on Redis, real
ed25519 keys and Solana transactions, real sign-in-with-x signatures.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.methods.credit.book import CreditBook, TopUp
from gateway.methods.credit.handlers import TopUpHandler
from gateway.methods.credit.method import CreditMethod
from gateway.methods.exact.method import ExactMethod
from gateway.methods.exact.settlement import Settlement
from gateway.methods.sign_in import SignInGate
from gateway.routing.routes import RateLimitSpec, RouteSpec
from gateway.store import Entry, Store, keys, open_store
from gateway.store.claims import claim_then_put
from gateway.store.redis import RedisStore
from gateway.web.asgi import ASGIApp, Receive, Scope, Send, send_bytes
from gateway.web.context import request_context
from gateway.web.router import MethodDispatcher
from gateway.x402.siwx import SiwxIssuer
from gateway.x402.types import PaymentPayload, PaymentRequirements, SettleResponse
from middleware.paid_access import PaidAccess
from tests.support.inprocess import (
    BASE_URL,
    PROVIDER_ANSWER,
    PaidRoute,
    RecordingFacilitator,
    UpstreamStandIn,
    balance_body,
    balance_route,
    call,
    paid_route,
    payment_header,
    settle_refused,
    settled,
)
from tests.support.polling import read_until
from tests.support.redis_fixtures import STORE_KINDS, fresh_store
from tests.support.redis_server import RedisServer

TOP_UP = 1_000_000
CALL_PRICE = 5
"""The balance route's provider part: its price in credit (no settlement fee)."""


def _top_up_route() -> RouteSpec:
    return RouteSpec(
        name="credits.topUp.1",
        path="/v1/x402/credits/top-up/1",
        method="POST",
        access="exact",
        handler="credit_top_up",
        group="credits",
        description="Buy 1 USDC of credit",
        provider_price_micro_usdc=TOP_UP,
    )


def _book(store: Store) -> CreditBook:
    return CreditBook(store, lapse_days=365, upstream_timeout_s=1.0)


def _top_up_app(store: Store, facilitator: Any = RecordingFacilitator) -> tuple[ASGIApp, PaidRoute]:
    """The top-up route as the app builds it: exact, whose settlement books the credit."""
    route = paid_route(store, _top_up_route(), facilitator=facilitator)
    book = _book(store)
    settlement = Settlement(
        route_name=route.route.name,
        ledger=route.ledger,
        offers=route.method.offers,
        replay_cap_bytes=route.route.replay_cap_bytes,
        top_up=TopUp(book, TOP_UP, route.route.name),
    )
    method = ExactMethod(
        route_name=route.route.name, offers=route.method.offers, gate=route.gate, settlement=settlement
    )
    paid = PaidAccess(
        TopUpHandler(book, TOP_UP),
        route_name=route.route.name,
        methods=[method],
        limiter=route.limiter,
        max_body=4096,
    )
    return MethodDispatcher({"POST": (route.route, paid)}, "POST, OPTIONS"), route


def _spend_app(
    store: Store, upstream: ASGIApp, route: RouteSpec | None = None
) -> tuple[ASGIApp, PaidRoute, CreditBook]:
    """A paid route taking exact payments and, beside them, credit."""
    paid = paid_route(store, route)
    book = _book(store)
    credit = CreditMethod(
        route=paid.route,
        price=CALL_PRICE,
        issuer=SiwxIssuer(b"s" * 32, BASE_URL, "Sign in to spend credit."),
        gate=SignInGate(store, paid.limiter, paid.route.rate_limits),
        book=book,
    )
    access = PaidAccess(
        upstream,
        route_name=paid.route.name,
        methods=[paid.method, credit],
        limiter=paid.limiter,
        max_body=4096,
    )
    return MethodDispatcher({"POST": (paid.route, access)}, "POST, OPTIONS"), paid, book


@pytest_asyncio.fixture(params=STORE_KINDS)
async def store(
    request: pytest.FixtureRequest, upstash_url_and_token: tuple[str, str]
) -> AsyncIterator[Store]:
    opened = fresh_store(request, request.param, upstash_url_and_token)
    try:
        yield opened
    finally:
        await opened.close()


def _required(answer: Any) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.b64decode(answer.headers["payment-required"]))
    return decoded


async def _sign_in_header(app: ASGIApp, wallet: Keypair, path: str = "/v1/rpc/getBalance") -> str:
    """Ask the route for its 402 and sign the sign-in challenge it carries, as a client does."""
    challenge = await call(app, path=path, body=balance_body())
    assert challenge.status == 402
    return sign_in(_required(challenge)["extensions"]["sign-in-with-x"], wallet)


async def _fund(store: Store, wallet: str, amount: int) -> None:
    """Credit ``wallet`` the way a top-up's delivery does (the claim-then-put round trip)."""
    claim = Entry(keys.delivery(wallet, f"fund-{wallet}-{amount}"), "1", 60_000)
    assert await claim_then_put(store, [claim], [], _book(store).credits(wallet, amount)) == 1


async def _signed_in(
    store: Store, upstream: ASGIApp, credit: int
) -> tuple[ASGIApp, CreditBook, Keypair, dict[str, str]]:
    """A route taking credit, a fresh wallet holding ``credit`` and its sign-in header there."""
    app, _, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), credit)
    return app, book, wallet, {"sign-in-with-x": await _sign_in_header(app, wallet)}


# --- top-up -------------------------------------------------------------------------------


async def test_a_top_up_credits_its_payer_once_and_its_retry_gets_the_same_answer(store: Store) -> None:
    app, route = _top_up_app(store)
    payer = str(route.wallets.payer.pubkey())
    payment = route.sign()

    first = await call(app, path=route.route.path, headers=payment_header(payment))
    again = await call(app, path=route.route.path, headers=payment_header(payment))

    assert first.status == 200, first.body
    envelope = first.json()
    assert (envelope["ok"], envelope["provider"], envelope["surface"], envelope["method"]) == (
        True,
        "credits",
        "credits",
        "topUp",
    )
    assert envelope["result"]["wallet"] == payer
    assert envelope["result"]["balanceMicroUsdc"] == str(TOP_UP)
    assert envelope["result"]["expiresAt"] > 0
    assert first.headers["payment-response"]
    assert request_context(first.scope).outcome == "paid"
    assert (again.status, again.body) == (200, first.body)  # the identical retry: its answer again
    assert len(route.facilitator.settled) == 1
    balance = await _book(store).balance(payer)
    assert (balance.balance, balance.held) == (TOP_UP, 0)


async def test_a_top_up_is_priced_at_its_credit_whatever_the_settlement_fee(store: Store) -> None:
    app, route = _top_up_app(store)

    challenge = await call(app, path=route.route.path)

    assert challenge.status == 402
    assert [a["amount"] for a in _required(challenge)["accepts"]] == [str(TOP_UP)]


async def test_a_top_up_refused_at_settlement_credits_nothing(store: Store) -> None:
    app, route = _top_up_app(store)
    route.facilitator.settle_answers.append(settle_refused("insufficient_funds"))

    answer = await call(app, path=route.route.path, headers=payment_header(route.sign()))

    assert answer.status == 402 and answer.json()["error"] == "settlement_failed"
    balance = await _book(store).balance(str(route.wallets.payer.pubkey()))
    assert balance.balance == 0


class _StoreStallsAtSettle(RecordingFacilitator):
    """Settles, but the store stops answering (SIGSTOP) while it does: the delivery cannot be
    written, so the top-up's credit cannot be booked with it."""

    server: RedisServer

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse:
        if not self.settled:
            self.server.process.send_signal(signal.SIGSTOP)
        self.settled.append(payload)
        return settled(f"tx-{len(self.settled)}")


async def test_a_top_up_whose_delivery_meets_a_store_outage_is_pending_then_credited_once(
    private_redis: RedisServer,
) -> None:
    # Short enough to find the stopped store soon, long enough for a loaded runner once it runs.
    store = RedisStore(private_redis.url, timeout_s=1.0)
    stalls = _StoreStallsAtSettle
    stalls.server = private_redis
    try:
        app, route = _top_up_app(store, facilitator=stalls)
        payer = str(route.wallets.payer.pubkey())
        payment = route.sign()

        pending = await call(app, path=route.route.path, headers=payment_header(payment))
        private_redis.process.send_signal(signal.SIGCONT)
        assert await read_until(store.ping, bool, time.monotonic() + 10)  # it runs again
        before_retry = await _book(store).balance(payer)
        reconciled = await call(app, path=route.route.path, headers=payment_header(payment))
        replayed = await call(app, path=route.route.path, headers=payment_header(payment))
        after = await _book(store).balance(payer)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
        await store.close()

    assert pending.status == 503 and pending.json()["error"]["code"] == "settlement_pending"
    assert before_retry.balance == 0  # never delivered: never credited
    assert reconciled.status == 200, reconciled.body
    assert replayed.status == 200 and replayed.body == reconciled.body
    assert after.balance == TOP_UP  # once, however many retries
    assert len(route.facilitator.settled) == 2  # the settle and its reconciliation


# --- spending -----------------------------------------------------------------------------


async def test_a_paid_routes_402_offers_credit_beside_its_payment_options(store: Store) -> None:
    app, route, _ = _spend_app(store, UpstreamStandIn())

    challenge = await call(app, body=balance_body())

    required = _required(challenge)
    assert challenge.status == 402 and [a["scheme"] for a in required["accepts"]] == ["exact"]
    sign = required["extensions"]["sign-in-with-x"]
    assert sign["info"]["uri"] == BASE_URL + route.route.path
    assert "bazaar" in required["extensions"] and "payment-identifier" in required["extensions"]


async def test_a_sign_in_with_credit_is_served_without_a_transaction(store: Store) -> None:
    upstream = UpstreamStandIn()
    app, route, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 12)

    answer = await call(
        app, body=balance_body(), headers={"sign-in-with-x": await _sign_in_header(app, wallet)}
    )

    assert answer.status == 200 and answer.body == PROVIDER_ANSWER
    assert answer.headers["x-credit-balance"] == "7"
    assert "payment-response" not in answer.headers
    ctx = request_context(answer.scope)
    assert (ctx.outcome, ctx.payer, ctx.amount) == ("credit_spent", str(wallet.pubkey()), "5")
    assert upstream.calls == 1 and route.facilitator.verified == [] and route.facilitator.settled == []
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (7, 0)


async def test_without_enough_credit_the_routes_402_says_insufficient_credit(store: Store) -> None:
    upstream = UpstreamStandIn()
    app, _, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 4)

    answer = await call(
        app, body=balance_body(), headers={"sign-in-with-x": await _sign_in_header(app, wallet)}
    )

    assert answer.status == 402 and answer.json()["error"] == "insufficient_credit"
    required = _required(answer)
    assert required["error"] == "insufficient_credit"
    assert [a["scheme"] for a in required["accepts"]] == ["exact"]  # the client pays instead
    assert "sign-in-with-x" in required["extensions"]
    assert request_context(answer.scope).outcome == "no_credit"  # a probe, not a failed payment
    assert upstream.calls == 0
    assert (await book.balance(str(wallet.pubkey()))).balance == 4


async def test_the_sign_in_to_spend_credit_names_the_route_and_the_most_it_may_take(store: Store) -> None:
    app, route, _ = _spend_app(store, UpstreamStandIn())

    challenge = await call(app, body=balance_body())

    sign = _required(challenge)["extensions"]["sign-in-with-x"]
    spent_on = f"{route.route.name} ({route.route.path}) at {BASE_URL}"
    expected = f"Spend at most 0.000005 USDC of prepaid credit on {spent_on}."
    assert sign["info"]["statement"] == expected
    assert sign["statement"] == expected
    assert "No funds move" not in challenge.body.decode()


@pytest.mark.parametrize(
    "statement", ["Sign in to read asset data or your prepaid credit at this gateway. No funds move.", None]
)
async def test_a_sign_in_that_signed_other_words_spends_nothing(store: Store, statement: str | None) -> None:
    """A wallet that signed that no funds move (or no statement at all) never authorised a spend:
    refused before the store, nothing held or taken."""
    upstream = UpstreamStandIn()
    app, _, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 10)
    challenge = await call(app, body=balance_body())
    extension = _required(challenge)["extensions"]["sign-in-with-x"]
    extension["info"]["statement"] = statement

    answer = await call(app, body=balance_body(), headers={"sign-in-with-x": sign_in(extension, wallet)})

    assert answer.status == 402 and answer.json()["error"] == "siwx_statement_mismatch"
    assert request_context(answer.scope).outcome == "rejected"
    assert upstream.calls == 0
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (10, 0)


async def test_a_provider_failure_takes_no_credit(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn(502, b'{"ok":false}'))
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 10)

    answer = await call(
        app, body=balance_body(), headers={"sign-in-with-x": await _sign_in_header(app, wallet)}
    )

    assert answer.status == 502
    assert request_context(answer.scope).outcome == "upstream_failed"
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (10, 0)


async def test_a_sign_in_is_used_once_and_its_identical_retry_gets_the_answer_again(store: Store) -> None:
    """A client whose connection dropped after its call was charged retries the identical request
    with the same sign-in: the answer it paid for, from the store; nothing is taken twice and the
    provider is not called again."""
    upstream = UpstreamStandIn()
    app, book, wallet, header = await _signed_in(store, upstream, 100)

    first = await call(app, body=balance_body(), headers=header)
    retried = [await call(app, body=balance_body(), headers=header) for _ in range(3)]

    assert first.status == 200 and first.body == PROVIDER_ANSWER
    assert first.headers["x-credit-balance"] == "95"
    for again in retried:
        assert (again.status, again.body) == (200, PROVIDER_ANSWER)
        assert again.headers["content-type"] == first.headers["content-type"]
        assert "x-credit-balance" not in again.headers  # the answer again, not a new balance
        assert "payment-response" not in again.headers
        assert request_context(again.scope).outcome == "replayed"
    assert upstream.calls == 1
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (95, 0)


async def test_a_sign_in_used_for_one_request_is_refused_for_another(store: Store) -> None:
    """Another body (or another route, which the signed resource already refuses) under a used
    sign-in is not its call: refused as replayed, nothing taken, the provider not called."""
    upstream = UpstreamStandIn()
    app, book, wallet, header = await _signed_in(store, upstream, 100)

    first = await call(app, body=balance_body(), headers=header)
    other_body = await call(app, body=balance_body(request_id=2), headers=header)
    other_account = await call(app, body=balance_body(account="1" * 32), headers=header)

    assert first.status == 200
    for refused in (other_body, other_account):
        assert refused.status == 402 and refused.json()["error"] == "siwx_replayed"
        assert "x-credit-balance" not in refused.headers
        assert request_context(refused.scope).outcome == "rejected"
    assert upstream.calls == 1
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (95, 0)


class _HeldUpstream(UpstreamStandIn):
    """Answers only once the test lets it: a call in flight for as long as the test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called.set()
        await self.release.wait()
        await super().__call__(scope, receive, send)


async def test_a_retry_while_its_call_is_in_flight_is_told_to_retry_then_gets_the_answer(
    store: Store,
) -> None:
    upstream = _HeldUpstream()
    app, book, wallet, header = await _signed_in(store, upstream, 100)

    first = asyncio.create_task(call(app, body=balance_body(), headers=header))
    await upstream.called.wait()
    during = await call(app, body=balance_body(), headers=header)
    held = await book.balance(str(wallet.pubkey()))
    upstream.release.set()
    answered = await first
    after = await call(app, body=balance_body(), headers=header)

    assert during.status == 409
    assert during.json()["error"]["code"] == "call_in_progress"
    assert during.headers["retry-after"] == "1"
    assert (held.balance, held.held) == (100, 5)  # the first call's hold alone
    assert answered.status == 200 and answered.headers["x-credit-balance"] == "95"
    assert (after.status, after.body) == (200, PROVIDER_ANSWER)
    assert upstream.calls == 1
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (95, 0)


async def test_a_retry_of_a_call_whose_provider_failed_is_told_nothing_was_taken(store: Store) -> None:
    upstream = UpstreamStandIn(502, b'{"ok":false}')
    app, book, wallet, header = await _signed_in(store, upstream, 10)

    failed = await call(app, body=balance_body(), headers=header)
    upstream.status, upstream.body = 200, PROVIDER_ANSWER
    retried = await call(app, body=balance_body(), headers=header)
    fresh = await call(
        app, body=balance_body(), headers={"sign-in-with-x": await _sign_in_header(app, wallet)}
    )

    assert failed.status == 502
    assert retried.status == 402 and retried.json()["error"] == "siwx_replayed"
    assert fresh.status == 200 and fresh.headers["x-credit-balance"] == "5"
    assert upstream.calls == 2
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (5, 0)


async def test_an_answer_too_large_to_keep_is_taken_once_and_not_given_again(store: Store) -> None:
    large = b'{"jsonrpc":"2.0","id":1,"result":"' + b"x" * 17_000 + b'"}'
    upstream = UpstreamStandIn(200, large)
    app, book, wallet, header = await _signed_in(store, upstream, 10)

    first = await call(app, body=balance_body(), headers=header)
    retried = await call(app, body=balance_body(), headers=header)

    assert first.status == 200 and first.body == large
    assert retried.status == 402 and retried.json()["error"] == "siwx_replayed"
    assert upstream.calls == 1
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (5, 0)


async def test_sign_ins_without_credit_spend_nothing_others_share(store: Store) -> None:
    """Any throwaway key signs in for free: refused for want of credit before the route's shared
    scope (here 2 calls a minute) is charged, so a paying client is still served."""
    shared = (RateLimitSpec(scope="rpc", limit=2, period_ms=60_000),)
    upstream = UpstreamStandIn()
    app, _, book = _spend_app(store, upstream, balance_route(rate_limits=shared))
    funded = Keypair()
    await _fund(store, str(funded.pubkey()), 100)

    async def signed_call(wallet: Keypair) -> Any:
        signed = await _sign_in_header(app, wallet)
        return await call(app, body=balance_body(), headers={"sign-in-with-x": signed})

    flood = [await signed_call(Keypair()) for _ in range(5)]
    paying = await signed_call(funded)

    assert {(a.status, a.json()["error"]) for a in flood} == {(402, "insufficient_credit")}
    assert paying.status == 200 and upstream.calls == 1
    assert (await book.balance(str(funded.pubkey()))).balance == 95


async def test_a_replayed_sign_in_holds_nothing(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 10)
    header = {"sign-in-with-x": await _sign_in_header(app, wallet)}
    await call(app, body=balance_body(), headers=header)

    replayed = await call(app, body=balance_body(request_id=2), headers=header)

    assert replayed.status == 402 and replayed.json()["error"] == "siwx_replayed"
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (5, 0)


async def test_a_sign_in_moved_to_another_route_is_refused(store: Store) -> None:
    upstream = UpstreamStandIn()
    app, _, book = _spend_app(store, upstream)
    other = RouteSpec(**{**_as_fields(balance_route()), "name": "other", "path": "/v1/rpc/other"})
    other_app, _, _ = _spend_app(store, upstream, other)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    signed_for_other = await _sign_in_header(other_app, wallet, path="/v1/rpc/other")

    moved = await call(app, body=balance_body(), headers={"sign-in-with-x": signed_for_other})

    assert moved.status == 402 and moved.json()["error"].startswith("siwx_")
    assert upstream.calls == 0 and (await book.balance(str(wallet.pubkey()))).balance == 100


def _as_fields(route: RouteSpec) -> dict[str, Any]:
    return {f: getattr(route, f) for f in route.__struct_fields__}


class _SlowUpstream:
    """Answers after a pause, so calls overlap."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        await asyncio.sleep(0.05)
        await send_bytes(send, 200, PROVIDER_ANSWER)


@pytest.mark.parametrize("shared", ["clean_redis_url", "clean_cluster_url"], ids=["redis", "cluster"])
async def test_100_calls_at_once_on_credit_for_10_get_exactly_10_answers(
    shared: str, request: pytest.FixtureRequest
) -> None:
    """Two replicas (two apps, one Redis or one cluster): 100 sign-ins at once from a wallet whose
    credit covers 10 calls; never overdrawn, never taken for a call not served."""
    store = open_store(request.getfixturevalue(shared), None)
    try:
        upstream = _SlowUpstream()
        replica_a, _, book = _spend_app(store, upstream)
        replica_b, _, _ = _spend_app(store, upstream)
        wallet = Keypair()
        await _fund(store, str(wallet.pubkey()), 10 * CALL_PRICE)
        apps = [replica_a if i % 2 else replica_b for i in range(100)]
        headers = [await _sign_in_header(app, wallet) for app in apps]

        answers = await asyncio.gather(
            *(
                call(app, body=balance_body(), headers={"sign-in-with-x": h})
                for app, h in zip(apps, headers, strict=True)
            )
        )
        balance = await book.balance(str(wallet.pubkey()))
    finally:
        await store.close()

    served = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 402]
    assert len(served) == 10 and len(refused) == 90
    assert {a.json()["error"] for a in refused} == {"insufficient_credit"}
    assert upstream.calls == 10
    assert sorted(int(a.headers["x-credit-balance"]) for a in served) == [CALL_PRICE * i for i in range(10)]
    assert (balance.balance, balance.held) == (0, 0)


async def test_a_hold_left_by_a_dead_process_lapses_and_nothing_is_taken(store: Store) -> None:
    book = _book(store)
    book.hold_ttl_ms = 200
    wallet = str(Keypair().pubkey())
    await _fund(store, wallet, 10)

    held = await book.hold(wallet, 10)  # the process dies here: never taken, never released
    assert held is not None
    assert await book.hold(wallet, 1) is None  # all of it is held
    await asyncio.sleep(0.3)
    balance = await book.balance(wallet)

    assert (balance.balance, balance.held) == (10, 0)
    assert await book.hold(wallet, 10) is not None
