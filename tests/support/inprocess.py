"""Parts for testing the payment core and the middlewares in-process: no server, no socket.

Everything is real (the MemoryStore, ed25519 keys, Solana transactions built and signed with
solders by our client-side builder) except the two things the gateway cannot own: the
facilitator, a third party, is :class:`RecordingFacilitator`, which answers as told and keeps
every verify and settle it was asked; and the provider behind the handler, stood in for by
:class:`UpstreamStandIn`, which answers like a handler does (a status and a body).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from solders.hash import Hash
from solders.keypair import Keypair

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.facilitators.health import FacilitatorHealth
from gateway.facilitators.http import ChallengeFeePayer
from gateway.limits.rate_limiter import CHALLENGE_SCOPE, RateLimiter
from gateway.limits.synced import SyncedWindowLimit
from gateway.methods.exact.gate import PaymentGate
from gateway.methods.exact.ledger import PaymentLedger
from gateway.methods.exact.method import ExactMethod
from gateway.methods.exact.offer import Option, RouteOffers, SettlingFacilitator, exact_challenge
from gateway.methods.exact.settlement import Settlement
from gateway.methods.sign_in import SIGN_IN, SignInDeps
from gateway.routing.pricing import FacilitatorFee
from gateway.routing.routes import RateLimitSpec, RouteSpec
from gateway.routing.validation import RequestValidator, ValidatedInput
from gateway.store import Store
from gateway.web.asgi import ASGIApp, Message, Receive, replay_body, send_bytes
from gateway.web.context import request_context
from gateway.web.router import MethodDispatcher
from gateway.x402.challenge import ExactChallenge
from gateway.x402.headers import encode_header
from gateway.x402.siwx import SiwxIssuer
from gateway.x402.types import (
    SOLANA_MAINNET,
    PaymentPayload,
    PaymentRequirements,
    SettleResponse,
    SupportedKind,
    SupportedResponse,
    VerifyResponse,
)
from middleware.paid_access import PaidAccess

USDC_MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
BASE_URL = "https://gateway.test"
CLIENT_IP = "203.0.113.7"
RECORDING_FACILITATOR_FEE = FacilitatorFee(internal=False, external_micro_usdc=2200)
"""The settlement fee configured for the recording facilitator: the balance route sells at 5 + 2200."""
PROVIDER_ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"context":{"slot":1},"value":5}}'

BALANCE_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["jsonrpc", "method", "params"],
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["integer", "string", "null"]},
        "method": {"const": "getBalance"},
        "params": {"type": "array", "minItems": 1, "maxItems": 2},
    },
}


def balance_route(*, rate_limits: Sequence[RateLimitSpec] = (), replay_cap_bytes: int = 65536) -> RouteSpec:
    return RouteSpec(
        name="rpc_getBalance",
        path="/v1/rpc/getBalance",
        method="POST",
        access="exact",
        handler="jsonrpc",
        group="rpc",
        description="Balance of an account",
        upstream="provider",
        operation="getBalance",
        provider_price_micro_usdc=5,
        rate_limits=tuple(rate_limits),
        input={"body": BALANCE_BODY_SCHEMA},
        replay_cap_bytes=replay_cap_bytes,
    )


def balance_body(account: str = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin", request_id: int = 1) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "getBalance", "params": [account]}
    ).encode()


def settled(transaction: str = "5ettled") -> SettleResponse:
    return SettleResponse(success=True, network=SOLANA_MAINNET, transaction=transaction)


def settle_refused(reason: str, transaction: str = "") -> SettleResponse:
    return SettleResponse(success=False, network=SOLANA_MAINNET, transaction=transaction, errorReason=reason)


class RecordingFacilitator:
    """A facilitator (a third party) that answers as told and records what it was asked."""

    url = "https://facilitator.test"

    def __init__(self, fee_payer: str) -> None:
        self.fee_payer = fee_payer
        self.verified: list[PaymentPayload] = []
        self.settled: list[PaymentPayload] = []
        self.verify_answers: list[VerifyResponse | BaseException] = []
        """Popped one per verify; when empty: valid."""
        self.settle_answers: list[SettleResponse | BaseException] = []
        """Popped one per settle; when empty: settled, transaction ``tx-<n>``."""

    async def supported(self) -> SupportedResponse:
        extra = {"feePayer": self.fee_payer}
        return SupportedResponse(
            kinds=[SupportedKind(x402Version=2, scheme="exact", network=SOLANA_MAINNET, extra=extra)]
        )

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse:
        self.verified.append(payload)
        answer = self.verify_answers.pop(0) if self.verify_answers else VerifyResponse(isValid=True)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse:
        self.settled.append(payload)
        answer = self.settle_answers.pop(0) if self.settle_answers else settled(f"tx-{len(self.settled)}")
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def close(self) -> None:
        return None


@dataclass
class Wallets:
    """Real ed25519 keys: who pays, who is paid, who pays the fees."""

    payer: Keypair = field(default_factory=Keypair)
    pay_to: Keypair = field(default_factory=Keypair)
    fee_payer: Keypair = field(default_factory=Keypair)

    def sign(
        self,
        requirements: PaymentRequirements,
        *,
        payer: Keypair | None = None,
        payment_id: str | None = None,
        memo: bytes | None = None,
    ) -> PaymentPayload:
        """A real partially signed exact payment of ``requirements`` (random blockhash: unique)."""
        mint = MintInfo(address=USDC_MINT, decimals=6)
        tx = build_exact_transaction(requirements, payer or self.payer, mint, Hash.new_unique(), memo=memo)
        extensions = None
        if payment_id is not None:
            extensions = {"payment-identifier": {"info": {"required": False, "id": payment_id}}}
        return build_payment_payload(requirements, tx, extensions=extensions)


@dataclass
class PaidRoute:
    """One exact route's payment core and adapters over a real store."""

    route: RouteSpec
    store: Store
    wallets: Wallets
    facilitator: RecordingFacilitator
    challenge: ExactChallenge
    ledger: PaymentLedger
    limiter: RateLimiter
    gate: PaymentGate
    settlement: Settlement
    method: ExactMethod

    def sign(self, **kwargs: Any) -> PaymentPayload:
        """A real payment of this route's challenge, as a client builds it from the 402."""
        requirements = self.challenge.requirements_for(self.facilitator.fee_payer)
        return self.wallets.sign(requirements, **kwargs)

    def pipeline(self, handler: ASGIApp) -> ASGIApp:
        """PaidAccess with the exact method -> ``handler``, behind the real error boundary."""
        paid = PaidAccess(
            handler, route_name="rpc", methods=[self.method], limiter=self.limiter, max_body=4096
        )
        return MethodDispatcher({"POST": (self.route, paid)}, "POST, OPTIONS")


def paid_route(
    store: Store,
    route: RouteSpec | None = None,
    *,
    challenge_limit: int = 1000,
    refused_per_minute: int = 10,
    facilitator: Callable[[str], RecordingFacilitator] = RecordingFacilitator,
) -> PaidRoute:
    """``facilitator`` makes the route's facilitator from its fee payer's address."""
    route = route or balance_route()
    wallets = Wallets()
    recording = facilitator(str(wallets.fee_payer.pubkey()))
    challenge = exact_challenge(
        route,
        base_url=BASE_URL,
        asset=USDC_MINT,
        pay_to=str(wallets.pay_to.pubkey()),
        timeout_s=60,
        facilitator_url=recording.url,
        fee=RECORDING_FACILITATOR_FEE,
    )
    ledger = PaymentLedger(store)
    limiter = RateLimiter(
        store,
        SyncedWindowLimit(store, CHALLENGE_SCOPE, challenge_limit, 60_000),
        refused_per_minute=refused_per_minute,
    )
    settling = SettlingFacilitator(
        recording.url, recording, ChallengeFeePayer(recording, store), RECORDING_FACILITATOR_FEE
    )
    async def answers() -> None:
        await recording.supported()

    health = FacilitatorHealth(store, {settling.name: answers})
    offers = RouteOffers([Option(settling, challenge)], health)
    gate = PaymentGate(
        route_name=route.name,
        offers=offers,
        validator=RequestValidator(route.input),
        ledger=ledger,
        limiter=limiter,
        limits=route.rate_limits,
    )
    settlement = Settlement(
        route_name=route.name, ledger=ledger, offers=offers, replay_cap_bytes=route.replay_cap_bytes
    )
    method = ExactMethod(route_name=route.name, offers=offers, gate=gate, settlement=settlement)
    return PaidRoute(route, store, wallets, recording, challenge, ledger, limiter, gate, settlement, method)


class UpstreamStandIn:
    """Stands where a handler calls its provider: answers ``status``/``body`` (a 200 is the
    upstream's success, as JsonRpcProxy sends it); keeps the input it was handed."""

    def __init__(self, status: int = 200, body: bytes = PROVIDER_ANSWER) -> None:
        self.status = status
        self.body = body
        self.inputs: list[ValidatedInput | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.inputs.append(request_context(scope).input)
        await send_bytes(send, self.status, self.body)

    @property
    def calls(self) -> int:
        return len(self.inputs)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    scope: dict[str, Any]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def reason(self) -> str | None:
        """The 402's ``error`` or the error shape's ``error.code``."""
        data = self.json()
        error = data.get("error")
        return error.get("code") if isinstance(error, dict) else error


def signed_in(
    app: ASGIApp,
    route: RouteSpec,
    issuer: SiwxIssuer,
    store: Store,
    limiter: RateLimiter,
    max_body: int = 4096,
) -> PaidAccess:
    """``app`` behind sign-in-with-x, as the app builds a ``siwx`` route: the one access layer
    with the sign-in method bound to ``route``."""
    method = SIGN_IN.bind(route, SignInDeps(issuer, store, limiter))
    return PaidAccess(app, route_name=route.name, methods=[method], limiter=limiter, max_body=max_body)


async def call(
    app: ASGIApp,
    method: str = "POST",
    path: str = "/v1/rpc/getBalance",
    *,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    query: bytes = b"",
    client: str = CLIENT_IP,
    receive: Receive | None = None,
    raw_path: bytes | None = None,
) -> Answer:
    """Run one HTTP request through ``app`` in-process, as a server would hand it over
    (``receive`` replaces the whole-body one, e.g. to drip the body; ``raw_path`` is the path as
    sent, before the server decoded it into ``path``)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    scope: dict[str, Any] = {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": (raw_path or path.encode()) + (b"?" + query if query else b""),
        "query_string": query,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs],
        "client": (client, 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    receive = receive or replay_body(body)
    messages: list[Message] = []

    async def send(message: Message) -> None:
        messages.append(message)

    await app(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    response_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])}
    content = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return Answer(start["status"], response_headers, content, scope)


def payment_header(payment: PaymentPayload) -> dict[str, str]:
    return {"payment-signature": encode_header(payment), "content-type": "application/json"}
