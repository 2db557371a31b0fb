"""Each middleware called as an ASGI app in-process: scope, receive and send built by hand.

The parts are real (MemoryStore, rate limiter, SIWX issuer, signed Solana payments, the error
boundary); the facilitator (a third party) records what it was asked and the provider behind
the handler is a stand-in that answers like a handler. Every test checks status, body and
headers, and for paid routes what was and was not settled.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY
from solders.keypair import Keypair
from starlette.routing import Router

from client.siwx_signer import sign_in
from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.limits.rate_limiter import CHALLENGE_SCOPE, RateLimiter
from gateway.limits.synced import SyncedWindowLimit
from gateway.routing.routes import RateLimitSpec, RouteSpec
from gateway.routing.validation import InvalidInput, ValidatedInput
from gateway.store import StoreUnavailable
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.telemetry.metrics import Usage
from gateway.web.asgi import (
    ASGIApp,
    BodyReadDeadline,
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    replay_body,
    send_bytes,
)
from gateway.web.context import request_context
from gateway.web.router import MethodDispatcher, PathTable, not_found
from gateway.x402.headers import encode_header
from gateway.x402.siwx import SiwxIssuer, SiwxReason
from middleware.cors import CorsMiddleware
from middleware.ratelimit import ChallengeRateLimit, ScopeRateLimit
from middleware.telemetry import TelemetryMiddleware
from tests.support.inprocess import (
    BASE_URL,
    CLIENT_IP,
    PROVIDER_ANSWER,
    PaidRoute,
    UpstreamStandIn,
    balance_body,
    call,
    paid_route,
    payment_header,
    settle_refused,
    signed_in,
)
from tests.support.ports import refusing_port

PAYMENT_ID = "retry-me-0123456789"


@pytest.fixture
def route() -> PaidRoute:
    return paid_route(MemoryStore())


def _payment_response(headers: dict[str, str]) -> Any:
    assert headers["payment-response"] == headers["x-payment-response"]
    return json.loads(base64.b64decode(headers["payment-response"]))


# --- PaidAccess with the exact method -------------------------------------------------------


async def test_no_payment_is_a_402_challenge_and_nothing_else_happens(route: PaidRoute) -> None:
    upstream = UpstreamStandIn()
    reads = 0

    async def receive() -> Message:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": balance_body(), "more_body": False}

    answer = await call(route.pipeline(upstream), receive=receive)

    assert answer.status == 402
    assert answer.headers["cache-control"] == "no-store"
    required = json.loads(base64.b64decode(answer.headers["payment-required"]))
    accept = required["accepts"][0]
    assert (accept["amount"], accept["payTo"]) == ("2205", str(route.wallets.pay_to.pubkey()))
    assert accept["extra"]["feePayer"] == route.facilitator.fee_payer
    assert answer.json()["accepts"][0]["maxAmountRequired"] == "2205" and "error" not in answer.json()
    assert request_context(answer.scope).outcome == "challenged"
    assert upstream.calls == 0 and route.facilitator.verified == [] and route.facilitator.settled == []
    assert reads == 0, "the body of a request without payment is never read"


async def test_a_paid_request_reaches_the_handler_once_and_is_settled_once(route: PaidRoute) -> None:
    upstream = UpstreamStandIn()

    answer = await call(route.pipeline(upstream), headers=payment_header(route.sign()), body=balance_body())

    assert answer.status == 200 and answer.body == PROVIDER_ANSWER
    assert answer.headers["content-type"] == "application/json"
    assert _payment_response(answer.headers)["transaction"] == "tx-1"
    ctx = request_context(answer.scope)
    assert (ctx.outcome, ctx.amount, ctx.settlement) == ("paid", "2205", "tx-1")
    assert ctx.payer == str(route.wallets.payer.pubkey())
    assert upstream.inputs == [ValidatedInput(path={}, query={}, body=json.loads(balance_body()))]
    assert len(route.facilitator.verified) == 1 and len(route.facilitator.settled) == 1


async def test_a_v1_payment_header_is_spoken_to_the_facilitator_in_v2(route: PaidRoute) -> None:
    payment = route.sign()
    v1 = {"x402Version": 1, "scheme": "exact", "network": "solana", "payload": payment.payload}
    headers = {"x-payment": base64.b64encode(json.dumps(v1).encode()).decode()}

    answer = await call(route.pipeline(UpstreamStandIn()), headers=headers, body=balance_body())

    assert answer.status == 200, answer.body
    assert route.facilitator.settled[0].x402Version == 2
    assert route.facilitator.settled[0].accepted is not None


async def test_a_refusal_is_a_402_naming_the_reason_and_counts_as_a_challenge() -> None:
    route = paid_route(MemoryStore(), challenge_limit=1)
    app = route.pipeline(UpstreamStandIn())
    junk = {"payment-signature": "not-a-payment"}

    first = await call(app, headers=junk, body=balance_body())
    second = await call(app, headers=junk, body=balance_body())

    assert first.status == 402 and first.reason == "invalid_payment_header"
    assert (
        json.loads(base64.b64decode(first.headers["payment-required"]))["error"] == "invalid_payment_header"
    )
    assert request_context(first.scope).outcome == "rejected"
    assert second.status == 429 and second.reason == "rate_limited" and second.headers["retry-after"]
    assert route.facilitator.verified == []


async def test_an_invalid_body_is_a_400_before_anything_is_charged(route: PaidRoute) -> None:
    answer = await call(route.pipeline(UpstreamStandIn()), headers=payment_header(route.sign()), body=b"[1]")

    assert answer.status == 400
    assert answer.json()["error"]["details"] == {"parameter": "body"}
    assert answer.json()["error"]["message"].startswith("body: ")
    assert route.facilitator.verified == []


async def test_a_store_outage_is_a_503_and_nothing_is_charged() -> None:
    down = RedisStore(f"redis://127.0.0.1:{refusing_port()}/0", timeout_s=0.2)  # nothing listens there
    route = paid_route(down)
    try:
        answer = await call(
            route.pipeline(UpstreamStandIn()), headers=payment_header(route.sign()), body=balance_body()
        )
    finally:
        await down.close()

    assert answer.status == 503 and answer.reason == "store_unavailable"
    assert "nothing was charged" in answer.json()["error"]["message"]
    assert route.facilitator.verified == [] and route.facilitator.settled == []


async def test_an_upstream_failure_is_passed_on_unsettled_and_the_payment_is_spent(route: PaidRoute) -> None:
    failing = UpstreamStandIn(502, b'{"ok":false}')
    payment = route.sign()

    answer = await call(route.pipeline(failing), headers=payment_header(payment), body=balance_body())
    again = await call(
        route.pipeline(UpstreamStandIn()), headers=payment_header(payment), body=balance_body()
    )

    assert (
        answer.status == 502 and answer.body == b'{"ok":false}' and "payment-response" not in answer.headers
    )
    assert request_context(answer.scope).outcome == "upstream_failed"
    assert again.status == 402 and again.reason == "payment_already_used"
    assert route.facilitator.settled == []


async def test_a_failed_settlement_withholds_the_answer_behind_a_402(route: PaidRoute) -> None:
    route.facilitator.settle_answers.append(settle_refused("insufficient_funds"))

    answer = await call(
        route.pipeline(UpstreamStandIn()), headers=payment_header(route.sign()), body=balance_body()
    )

    assert answer.status == 402 and answer.reason == "settlement_failed"
    assert PROVIDER_ANSWER not in answer.body and "payment-response" not in answer.headers
    ctx = request_context(answer.scope)
    assert (ctx.outcome, ctx.error) == ("settle_failed", "insufficient_funds")
    assert len(route.facilitator.settled) == 1


async def test_a_pending_settlement_is_reconciled_by_the_retry_and_delivered_once(route: PaidRoute) -> None:
    route.facilitator.settle_answers += [
        FacilitatorUnavailable("silent"),
        settle_refused("duplicate_settlement", transaction="tx-landed"),
    ]
    payment = route.sign()
    upstream = UpstreamStandIn()
    app = route.pipeline(upstream)

    pending = await call(app, headers=payment_header(payment), body=balance_body())
    retry = await call(app, headers=payment_header(payment), body=balance_body())
    late = await call(app, headers=payment_header(payment), body=balance_body())
    other = await call(app, headers=payment_header(payment), body=balance_body(request_id=2))

    assert pending.status == 503 and pending.reason == "settlement_pending"
    assert (
        pending.headers["retry-after"] == "2"
        and "nothing was charged" not in pending.json()["error"]["message"]
    )
    assert retry.status == 200 and retry.body == PROVIDER_ANSWER
    settlement = _payment_response(retry.headers)
    assert settlement["transaction"] == "tx-landed" and settlement["success"] is True
    assert request_context(retry.scope).outcome == "paid"
    # The identical request once more gets what was paid for, from the store; another is refused.
    assert (late.status, late.body, late.headers["payment-response"]) == (
        200,
        PROVIDER_ANSWER,
        retry.headers["payment-response"],
    )
    assert request_context(late.scope).outcome == "replayed"
    assert other.status == 402 and other.reason == "payment_already_used"
    assert (
        upstream.calls == 1 and len(route.facilitator.settled) == 2 and len(route.facilitator.verified) == 1
    )


async def test_a_payment_identifier_replays_the_settled_answer(route: PaidRoute) -> None:
    payment = route.sign(payment_id=PAYMENT_ID)
    upstream = UpstreamStandIn()
    app = route.pipeline(upstream)

    first = await call(app, headers=payment_header(payment), body=balance_body())
    replay = await call(app, headers=payment_header(payment), body=balance_body())
    other = await call(app, headers=payment_header(route.sign(payment_id=PAYMENT_ID)), body=balance_body())

    assert first.status == replay.status == 200 and replay.body == first.body == PROVIDER_ANSWER
    assert replay.headers["payment-response"] == first.headers["payment-response"]
    assert request_context(replay.scope).outcome == "replayed"
    assert other.status == 409 and other.reason == "idempotency_conflict"
    assert upstream.calls == 1 and len(route.facilitator.settled) == 1


async def test_a_shutdown_mid_settle_tells_the_client_to_retry_and_keeps_stopping(route: PaidRoute) -> None:
    route.facilitator.settle_answers.append(asyncio.CancelledError())
    app = route.pipeline(UpstreamStandIn())
    sent: list[Message] = []

    async def record(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": balance_body(), "more_body": False}

    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/rpc/getBalance",
        "headers": [(b"payment-signature", encode_header(route.sign()).encode())],
        "client": (CLIENT_IP, 1),
        "state": {},
    }
    with pytest.raises(asyncio.CancelledError):
        await app(scope, receive, record)
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"]["code"] == "settlement_pending"
    assert request_context(scope).outcome == "settlement_pending"
    assert len(route.facilitator.settled) == 1


# --- sign-in-with-x (PaidAccess with the sign-in method) ----------------------------------------

SEARCH_ROUTE = RouteSpec(
    name="assets_search",
    path="/v1/assets/search",
    method="GET",
    access="siwx",
    handler="tokens",
    group="tokens",
    description="Search assets",
    input={
        "query": {
            "type": "object",
            "additionalProperties": False,
            "required": ["q"],
            "properties": {"q": {"type": "string", "maxLength": 8}},
        }
    },
)


def _signed_in_app(upstream: UpstreamStandIn, store: MemoryStore) -> Any:
    issuer = SiwxIssuer(b"s" * 32, BASE_URL, "Sign in to test.")
    limiter = RateLimiter(store)
    guarded = signed_in(upstream, SEARCH_ROUTE, issuer, store, limiter)
    return MethodDispatcher({"GET": (SEARCH_ROUTE, guarded)}, "GET, HEAD, OPTIONS")


async def test_sign_in_challenge_then_signed_request_then_replay_refused() -> None:
    upstream = UpstreamStandIn()
    app = _signed_in_app(upstream, MemoryStore())
    keypair = Keypair()

    challenge = await call(app, "GET", SEARCH_ROUTE.path, query=b"q=bonk")
    header = sign_in(challenge.json()["extensions"]["sign-in-with-x"], keypair)
    signed = await call(app, "GET", SEARCH_ROUTE.path, query=b"q=bonk", headers={"sign-in-with-x": header})
    replayed = await call(app, "GET", SEARCH_ROUTE.path, query=b"q=bonk", headers={"sign-in-with-x": header})

    assert (
        challenge.status == 402 and challenge.headers["payment-required"] and "error" not in challenge.json()
    )
    assert signed.status == 200 and signed.body == PROVIDER_ANSWER
    ctx = request_context(signed.scope)
    assert ctx.outcome == "signed_in" and ctx.sign_in is not None
    assert ctx.sign_in.address == ctx.wallet == str(keypair.pubkey())
    assert upstream.inputs == [ValidatedInput(path={}, query={"q": "bonk"}, body=None)]
    assert replayed.status == 402 and replayed.reason == SiwxReason.REPLAYED.value
    assert upstream.calls == 1


async def test_a_signed_request_with_invalid_input_is_a_400_naming_the_parameter() -> None:
    upstream = UpstreamStandIn()
    app = _signed_in_app(upstream, MemoryStore())
    challenge = await call(app, "GET", SEARCH_ROUTE.path)
    header = sign_in(challenge.json()["extensions"]["sign-in-with-x"], Keypair())

    answer = await call(
        app, "GET", SEARCH_ROUTE.path, query=b"q=far-too-long", headers={"sign-in-with-x": header}
    )

    assert answer.status == 400 and answer.reason == "invalid_request"
    assert answer.json()["error"]["details"] == {"parameter": "q"}
    assert upstream.calls == 0


async def test_a_forged_sign_in_is_refused_with_a_fresh_challenge() -> None:
    app = _signed_in_app(UpstreamStandIn(), MemoryStore())

    answer = await call(app, "GET", SEARCH_ROUTE.path, query=b"q=a", headers={"sign-in-with-x": "garbage"})

    assert answer.status == 402 and answer.headers["payment-required"]
    assert request_context(answer.scope).outcome == "refused"


# --- rate limits ----------------------------------------------------------------------------


async def test_challenge_rate_limit_counts_only_requests_without_a_credential() -> None:
    store = MemoryStore()
    limiter = RateLimiter(store, SyncedWindowLimit(store, CHALLENGE_SCOPE, 1, 60_000))
    upstream = UpstreamStandIn()
    limited = ChallengeRateLimit(upstream, limiter, (b"payment-signature",))
    app = MethodDispatcher({"POST": (SEARCH_ROUTE, limited)}, "POST, OPTIONS")

    first = await call(app)
    with_credential = await call(app, headers={"payment-signature": "x"})
    second = await call(app)
    other_ip = await call(app, client="198.51.100.1")

    assert (first.status, with_credential.status, other_ip.status) == (200, 200, 200)
    assert second.status == 429 and second.reason == "rate_limited"
    assert int(second.headers["retry-after"]) >= 1
    assert second.json()["error"]["details"]["scope"] == "challenge:ip"
    assert upstream.calls == 3


async def test_scope_rate_limit_applies_the_routes_scope_limits() -> None:
    limiter = RateLimiter(MemoryStore())
    specs = [RateLimitSpec(scope="catalog", limit=1, period_ms=60_000)]
    app = MethodDispatcher({"GET": (SEARCH_ROUTE, ScopeRateLimit(UpstreamStandIn(), limiter, specs))}, "GET")

    first = await call(app, "GET")
    second = await call(app, "GET", client="198.51.100.1")  # one bucket for the whole scope

    assert first.status == 200
    assert second.status == 429 and second.json()["error"]["details"]["limit"] == 1


# --- CORS, telemetry, method dispatch -------------------------------------------------------


async def test_cors_answers_preflight_and_adds_headers_to_every_answer() -> None:
    upstream = UpstreamStandIn()
    app = CorsMiddleware(upstream, ["GET"])

    preflight = await call(app, "OPTIONS")
    simple = await call(app, "GET")

    assert preflight.status == 204 and preflight.body == b""
    assert preflight.headers["access-control-allow-methods"] == "GET, OPTIONS"
    assert preflight.headers["allow"] == "GET, HEAD, OPTIONS"
    assert "PAYMENT-SIGNATURE" in preflight.headers["access-control-allow-headers"]
    assert simple.status == 200 and simple.body == PROVIDER_ANSWER
    assert simple.headers["access-control-allow-origin"] == "*"
    assert "PAYMENT-RESPONSE" in simple.headers["access-control-expose-headers"]
    assert upstream.calls == 1


async def _crash(scope: Scope, receive: Receive, send: Send) -> None:
    request_context(scope).route = "crashing"
    raise RuntimeError("secret upstream text")


def _requests(route: str, status: str) -> float:
    return (
        REGISTRY.get_sample_value("x402_requests_total", {"route": route, "method": "GET", "status": status})
        or 0.0
    )


async def test_telemetry_turns_an_unexpected_error_into_the_one_error_shape_and_counts_it() -> None:
    app = TelemetryMiddleware(_crash, Usage(MemoryStore(), []))
    before = _requests("crashing", "500")

    answer = await call(app, "GET")

    assert answer.status == 500 and answer.reason == "internal_error"
    assert b"secret" not in answer.body
    assert request_context(answer.scope).status == 500
    assert _requests("crashing", "500") == before + 1


async def test_telemetry_records_the_status_of_a_normal_answer() -> None:
    async def named(scope: Scope, receive: Receive, send: Send) -> None:
        request_context(scope).route = "named"
        await send_bytes(send, 200, b"{}")

    before = _requests("named", "200")
    answer = await call(TelemetryMiddleware(named, Usage(MemoryStore(), [])), "GET")

    assert answer.status == 200 and answer.body == b"{}"
    assert request_context(answer.scope).status == 200
    assert _requests("named", "200") == before + 1


async def test_method_dispatch_405_names_the_allowed_methods_and_head_is_get_without_body() -> None:
    app = MethodDispatcher({"GET": (SEARCH_ROUTE, UpstreamStandIn())}, "GET, HEAD, OPTIONS")

    wrong = await call(app, "DELETE")
    head = await call(app, "HEAD")

    assert wrong.status == 405 and wrong.reason == "method_not_allowed"
    assert wrong.headers["allow"] == "GET, HEAD, OPTIONS"
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == str(len(PROVIDER_ANSWER))
    assert request_context(head.scope).route == SEARCH_ROUTE.name


@pytest.mark.parametrize(
    ("failure", "status", "code", "details"),
    [
        (GatewayError(ErrorCode.UPSTREAM_TIMEOUT, "slow"), 504, "upstream_timeout", None),
        (StoreUnavailable("down"), 503, "store_unavailable", None),
        (InvalidInput("limit", "must be at most 100"), 400, "invalid_request", {"parameter": "limit"}),
    ],
)
async def test_method_dispatch_is_the_one_place_failures_become_the_error_shape(
    failure: Exception, status: int, code: str, details: dict[str, str] | None
) -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise failure

    answer = await call(MethodDispatcher({"GET": (SEARCH_ROUTE, failing)}, "GET"), "GET")

    assert answer.status == status and answer.reason == code
    assert answer.json()["ok"] is False and answer.json()["error"].get("details") == details
    assert answer.headers["content-type"] == "application/json"
    assert request_context(answer.scope).error == code


# --- BodyReadDeadline ----------------------------------------------------------------------------

DEADLINE_S = 0.05
WIDE_DEADLINE_S = 5.0
"""For a body that must arrive within the deadline: its pieces 10 ms apart, which a loaded runner
can stretch past 50 ms."""


def _dripping(first: bytes, pause_s: float) -> Receive:
    """A client that sends ``first`` and then nothing for ``pause_s`` (the rest never comes)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": first, "more_body": True}
        await asyncio.sleep(pause_s)
        return {"type": "http.request", "body": b"}", "more_body": False}

    return receive


class _BodyReader:
    """An inner app that reads the whole body (as every guard does before it verifies anything),
    then answers 200; ``finished`` says whether it got past the read."""

    def __init__(self, then_listen: bool = False) -> None:
        self.finished = False
        self.then_listen = then_listen
        self.heard: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive, 1 << 16)
        self.finished = True
        if self.then_listen:  # a disconnect listener, as a streaming handler keeps one
            self.heard.append((await receive())["type"])
        await send_bytes(send, 200, body)


async def test_a_body_dripped_past_the_deadline_is_408_before_the_reader_gets_past_it() -> None:
    reader = _BodyReader()
    app = BodyReadDeadline(MethodDispatcher({"POST": (SEARCH_ROUTE, reader)}, "POST"), DEADLINE_S)
    started = asyncio.get_running_loop().time()

    answer = await call(app, "POST", receive=_dripping(b'{"jsonrpc":', pause_s=5))

    assert answer.status == 408 and answer.reason == "request_timeout"
    assert answer.json()["error"]["details"] == {"timeoutSeconds": DEADLINE_S}
    assert not reader.finished
    assert asyncio.get_running_loop().time() - started < 4  # not after the 5 s pause (a loaded machine)


async def test_a_body_that_arrives_within_the_deadline_reaches_the_reader_whole() -> None:
    reader = _BodyReader()
    app = BodyReadDeadline(MethodDispatcher({"POST": (SEARCH_ROUTE, reader)}, "POST"), WIDE_DEADLINE_S)

    answer = await call(app, "POST", receive=_dripping(b'{"a":1', pause_s=DEADLINE_S / 5))

    assert answer.status == 200 and answer.body == b'{"a":1}'
    assert reader.finished


class _Answerer:
    """An inner app that answers at once without reading the body, as a 402 challenge does."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 402, b"{}")


def _late_body(pause_s: float, pieces: int = 2) -> tuple[Receive, list[int]]:
    """A body whose pieces arrive ``pause_s`` apart; the list counts the pieces read."""
    read: list[int] = []

    async def receive() -> Message:
        await asyncio.sleep(pause_s)
        read.append(1)
        return {"type": "http.request", "body": b"{}", "more_body": len(read) < pieces}

    return receive, read


async def test_an_answer_given_before_the_body_arrived_waits_for_it_and_keeps_the_connection() -> None:
    """Else the server, finding the body unread once the answer ended, would close a connection
    the client was told nothing about, and the client's next request on it would go unanswered."""
    receive, read = _late_body(DEADLINE_S / 5, pieces=3)
    app = BodyReadDeadline(_Answerer(), WIDE_DEADLINE_S)

    answer = await call(app, "POST", headers={"content-length": "6"}, receive=receive)

    assert answer.status == 402 and "connection" not in answer.headers
    assert len(read) == 3


async def test_an_answer_without_a_body_to_wait_for_reads_nothing() -> None:
    receive, read = _late_body(5)
    app = BodyReadDeadline(_Answerer(), DEADLINE_S)

    answer = await call(app, "GET", receive=receive)

    assert answer.status == 402 and "connection" not in answer.headers and read == []


async def test_an_answer_before_a_body_larger_than_the_drain_limit_closes_the_connection() -> None:
    receive, read = _late_body(5)
    app = BodyReadDeadline(_Answerer(), DEADLINE_S, drain_limit=1024)

    answer = await call(app, "POST", headers={"content-length": "1025"}, receive=receive)

    assert answer.status == 402 and answer.headers["connection"] == "close" and read == []


async def test_an_answer_before_a_chunked_body_that_outgrows_the_drain_limit_closes_the_connection() -> None:
    receive, read = _late_body(0, pieces=1000)
    app = BodyReadDeadline(_Answerer(), DEADLINE_S, drain_limit=10)

    answer = await call(app, "POST", headers={"transfer-encoding": "chunked"}, receive=receive)

    assert answer.status == 402 and answer.headers["connection"] == "close"
    assert len(read) == 6  # 12 bytes read: past the limit of 10, no further


async def test_an_answer_before_a_body_slower_than_the_drain_timeout_closes_the_connection() -> None:
    receive, _ = _late_body(5)
    app = BodyReadDeadline(_Answerer(), 10.0, drain_timeout_s=DEADLINE_S)
    started = asyncio.get_running_loop().time()

    answer = await call(app, "POST", headers={"content-length": "6"}, receive=receive)

    assert answer.status == 402 and answer.headers["connection"] == "close"
    assert asyncio.get_running_loop().time() - started < 4  # not after the 5 s pause (a loaded machine)


async def test_once_the_body_is_complete_receive_has_no_deadline() -> None:
    """A disconnect listener may wait for as long as the response takes."""
    reader = _BodyReader(then_listen=True)
    app = BodyReadDeadline(MethodDispatcher({"POST": (SEARCH_ROUTE, reader)}, "POST"), DEADLINE_S)
    whole = replay_body(b"{}")

    async def slow_disconnect() -> Message:
        message = await whole()
        if message["type"] == "http.disconnect":
            await asyncio.sleep(3 * DEADLINE_S)
        return message

    answer = await call(app, "POST", receive=slow_disconnect)

    assert answer.status == 200 and answer.body == b"{}"
    assert reader.heard == ["http.disconnect"]


# --- PathTable -----------------------------------------------------------------------------------


def _named(name: str) -> ASGIApp:
    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        params = json.dumps(scope.get("path_params", {}), sort_keys=True)
        await send_bytes(send, 200, f"{name} {params}".encode())

    return answer


def _path_table() -> Router:
    router = Router(
        routes=[
            PathTable(
                [
                    ("/v1/assets/{assetId}", _named("asset"), "asset"),
                    ("/v1/assets/search", _named("search"), "search"),
                ]
            )
        ]
    )
    router.default = not_found
    return router


async def test_a_fixed_path_wins_over_a_parameterised_one_whatever_their_order() -> None:
    table = _path_table()

    search = await call(table, "GET", "/v1/assets/search")
    asset = await call(table, "GET", "/v1/assets/usd-coin")

    assert (search.status, search.body) == (200, b"search {}")
    assert (asset.status, asset.body) == (200, b'asset {"assetId": "usd-coin"}')
    assert request_context(asset.scope).route == "asset"


async def test_an_encoded_slash_matches_no_route() -> None:
    scope_path = "/v1/assets/a/b"  # what %2F decodes to before routing

    answer = await call(_path_table(), "GET", scope_path, raw_path=b"/v1/assets/a%2Fb")

    assert answer.status == 404 and answer.reason == "not_found"
