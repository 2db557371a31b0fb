"""Prepaid credit as a payment method: a wallet that bought credit signs in (x402
sign-in-with-x) instead of paying, and the call's credit price is taken from its balance.

Beside ``exact`` on a paid route, its part of the 402 is the ``sign-in-with-x`` extension, bound
to the route (the signed resource is the route's URL, so a sign-in cannot be moved to another
route, and its nonce is used once). A sign-in is checked like any other (signature, times,
resource), then one atomic store step finds its nonce unused, the wallet's free credit covering
the call's credit price, and the route's per-wallet and shared limits allowing it, and only then
uses the nonce and holds the price (:class:`gateway.methods.sign_in.SignInGate` with a hold ordered by
:class:`gateway.methods.credit.book.CreditBook`): a wallet whose free credit does not cover it is refused
with ``insufficient_credit`` and the route's full 402, so a client pays per call instead. The
hold is taken once the provider answered and released when it did not; a process that dies in
between leaves a hold that lapses by itself, so nothing is taken.

The text a wallet signs here names what it authorises: the route, its credit price and the
gateway (:func:`spend_statement`), and a sign-in that signed other words is refused. Each call is
named by its sign-in's nonce (:mod:`gateway.methods.credit.calls`): the identical request retried with
the same sign-in (a client whose connection dropped) gets the answer it was charged for, kept
with the take; nothing is taken twice.

A call may instead carry a credit session (``X-CREDIT-SESSION``, :mod:`gateway.methods.credit.sessions`):
one store round trip spends it, with no 402 and no signature, within the cap its wallet signed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.ledger.recorder import MoneyRecorder
from gateway.limits.rate_limiter import Limited, RateLimiter
from gateway.methods.credit.book import CreditBook, CreditHold
from gateway.methods.credit.calls import AnswerAgain, CreditCall, NotAgain, StillInFlight, credit_call
from gateway.methods.credit.metrics import CREDIT_SPENT
from gateway.methods.credit.sessions import (
    SESSION_CAP_REACHED,
    SESSION_HEADER,
    SESSION_UNKNOWN,
    CreditSessions,
    token_wallet,
)
from gateway.methods.exact.ledger import StoredResponse
from gateway.methods.results import Delivered, InProgress, Refused, Replay, Settled
from gateway.methods.seam import Admitted, Answer, Asked, Checked, Incoming, Offer, credential_headers
from gateway.methods.sign_in import Admitted as SignedIn
from gateway.methods.sign_in import Replayed, SignInGate, SignInSequence, Uncovered
from gateway.routing.pricing import usd_display
from gateway.routing.routes import RouteSpec, credit_price
from gateway.routing.validation import RequestValidator
from gateway.routing.vocabulary import CREDIT_METHOD, PAYMENT_METHODS, AccessMode, Outcome
from gateway.store import SessionSpent, Store, StoreUnavailable
from gateway.telemetry.logs import log_event
from gateway.x402.headers import encode_header
from gateway.x402.siwx import EXTENSION_KEY, SiwxIssuer, SiwxReason

if TYPE_CHECKING:
    from gateway.methods.shared import SharedParts

INSUFFICIENT_CREDIT = "insufficient_credit"
_SESSION_HEADER = SESSION_HEADER.lower()


def spend_statement(route: RouteSpec, price: int, origin: str) -> str:
    """What a wallet signs to spend credit on ``route``: the most it may take, where, from whom."""
    most = usd_display(price).removeprefix("$")
    return f"Spend at most {most} USDC of prepaid credit on {route.name} ({route.path}) at {origin}."


class CreditMethod:
    """One paid route's calls on prepaid credit."""

    credential_headers = credential_headers(PAYMENT_METHODS[CREDIT_METHOD])

    def __init__(
        self,
        *,
        route: RouteSpec,
        price: int,
        issuer: SiwxIssuer,
        gate: SignInGate,
        book: CreditBook,
        recorder: MoneyRecorder | None = None,
        sessions: CreditSessions | None = None,
    ) -> None:
        self.route_name = route.name
        self.description = route.description
        self.price = price
        self.issuer = issuer
        self.gate = gate
        self.sign_in = SignInSequence(issuer, gate)
        self.book = book
        self.recorder = recorder or MoneyRecorder()
        self.sessions = sessions or CreditSessions(gate.store, issuer.base_url, book)
        self.validator = RequestValidator(route.input)
        self.spent = CREDIT_SPENT.labels(route.name)
        self.statement = spend_statement(route, price, issuer.base_url)

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """The sign-in challenge alone (credit is accepted beside another method, whose 402 this
        method only extends; this is its 402 were it ever a route's own)."""
        resource = self.sign_in.resource(asked.path)
        document = self.issuer.challenge(
            resource,
            error=error,
            description=self.description,
            mime_type="application/json",
            statement=self.statement,
        )
        document.extensions = {**(document.extensions or {}), **extensions}
        body = msgspec.json.encode(document)
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            (b"payment-required", encode_header(document).encode("ascii")),
        ]
        return Offer(body, headers)

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
        """A fresh sign-in challenge for this route's URL (its nonce is single-use)."""
        resource = self.sign_in.resource(asked.path)
        return {EXTENSION_KEY: self.issuer.extension(resource, statement=self.statement)}

    async def check(self, incoming: Incoming) -> Checked[CreditHold]:
        if incoming.header == _SESSION_HEADER:
            return await self._check_session(incoming)
        resource = self.sign_in.resource(incoming.path)
        signed = self.sign_in.verify(incoming.credential, resource, self.statement, Outcome.REJECTED)
        if isinstance(signed, Refused):
            return Checked(signed)
        wallet = signed.address
        raw = await incoming.read_body()
        body = self.validator.body(raw)
        # The credit is checked before any bucket, in the same round trip as the nonce: a wallet
        # without enough of it (any throwaway key signs in for free) spends no nonce and no
        # bucket other clients share. The call's record is claimed in that step too.
        order = self.book.order(wallet, self.price)
        # Its answer is kept while the sign-in verifies: no retry can present it later.
        call = credit_call(self.route_name, wallet, signed.nonce, raw, order.ttl_ms, signed.replay_ttl_ms)
        match await self.sign_in.admit(signed, incoming.client_ip, order, call.in_flight()):
            case SignedIn(held=held) if held is not None:
                grant = self.book.held(order, held, call)
                return Checked(Admitted(grant, body, str(self.price)), wallet)
            case Replayed(call=found):
                return Checked(self._again(call, found, wallet), wallet)
            case Limited() as limited:
                return Checked(limited, wallet)
            case Uncovered():
                short = "the wallet's credit does not cover this call"
                uncovered = Refused(INSUFFICIENT_CREDIT, short, wallet, Outcome.CREDIT_UNCOVERED)
                return Checked(uncovered, wallet)
        raise StoreUnavailable("state store admitted a sign-in without holding its credit")

    @staticmethod
    def _again(call: CreditCall, found: str | None, wallet: str) -> Replay | InProgress | Refused:
        """A used sign-in: the answer its identical request was charged for, a 409 while that
        request is still answered, else refused as replayed (nothing taken either way)."""
        match call.earlier(found):
            case AnswerAgain(response=response):
                return Replay(response)
            case StillInFlight():
                return InProgress("the call made with this sign-in is still being answered; retry it")
            case NotAgain(message=message):
                return Refused(SiwxReason.REPLAYED.value, message, wallet)

    async def _check_session(self, incoming: Incoming) -> Checked[CreditHold]:
        """A call on a credit session: the body first (400 spends nothing), then one store round
        trip holds the price within the session's cap, the wallet's credit and the buckets."""
        token = incoming.credential
        wallet = token_wallet(token)
        if wallet is None:
            return Checked(Refused(SESSION_UNKNOWN, f"{SESSION_HEADER} is not a credit session token"))
        body = self.validator.body(await incoming.read_body())
        gate = self.gate
        call = await self.sessions.spend(
            token, wallet, self.price, gate.limiter, gate.limits, incoming.client_ip
        )
        match call.outcome:
            case SessionSpent.SPENT if call.hold is not None:
                return Checked(Admitted(call.hold, body, str(self.price)), wallet)
            case SessionSpent.UNKNOWN:
                unknown = "no live credit session under this token (expired, revoked or never opened)"
                return Checked(Refused(SESSION_UNKNOWN, unknown, wallet), wallet)
            case SessionSpent.CAP:
                capped = "the credit session's cap less what it spent does not cover this call"
                return Checked(Refused(SESSION_CAP_REACHED, capped, wallet), wallet)
            case SessionSpent.UNCOVERED:
                short = Refused(INSUFFICIENT_CREDIT, "the wallet's credit does not cover this call", wallet)
                return Checked(short, wallet)
            case SessionSpent.LIMITED if call.limited is not None:
                return Checked(call.limited, wallet)
        raise StoreUnavailable("state store neither refused nor held a credit session call")

    async def finish(self, grant: CreditHold, answer: Answer) -> Settled:
        """Take the held price, keeping the answer for the call's identical retries in the same
        step; a hold that lapsed meanwhile is taken only if the credit still covers it, else the
        answer is withheld (nothing is served unpaid, nothing kept)."""
        kept = StoredResponse(200, answer.body, answer.content_type)
        keep = [grant.call.answered(kept)] if grant.call is not None else []
        balance = await self.book.take(grant, keep)
        if balance is None:
            await self._failed(grant)
            if grant.session:
                await self._release(grant)
            lapsed = "the credit held for this call lapsed and was spent"
            return Refused(INSUFFICIENT_CREDIT, lapsed, grant.wallet)
        self.spent.inc(grant.amount)
        self.recorder.credit_spent(
            hold=grant.token, route=self.route_name, wallet=grant.wallet, amount_micro=grant.amount
        )
        log_event(
            "credit spent",
            route=self.route_name,
            wallet=grant.wallet,
            amount=str(grant.amount),
            balance=str(balance.balance),
        )
        left = str(balance.balance)
        response = StoredResponse(200, answer.body, answer.content_type, credit_balance=left)
        return Delivered(response, "", Outcome.CREDIT_SPENT)

    async def abandon(self, grant: CreditHold) -> None:
        """The provider failed: nothing is taken, and the call's retry is told so."""
        await asyncio.gather(self._release(grant), self._failed(grant))

    async def _failed(self, hold: CreditHold) -> None:
        """Record that the call took nothing; a store outage leaves it in flight until its hold
        would have lapsed (its retry hears 409 meanwhile, then ``siwx_replayed``)."""
        if hold.call is None:
            return
        failed = hold.call.failed()
        try:
            await self.book.store.put(failed.key, failed.value, failed.ttl_ms)
        except StoreUnavailable:
            log_event(
                "credit call left in flight: store unavailable", route=self.route_name, wallet=hold.wallet
            )

    async def _release(self, hold: CreditHold) -> None:
        """Give the held price back; a store outage leaves the hold to lapse by itself."""
        try:
            if hold.session:
                await self.sessions.refund(hold)
            else:
                await self.book.release(hold)
            self.recorder.credit_released(
                hold=hold.token, route=self.route_name, wallet=hold.wallet, amount_micro=hold.amount
            )
        except StoreUnavailable:
            log_event(
                "credit hold left to lapse: store unavailable", route=self.route_name, wallet=hold.wallet
            )


@dataclass(frozen=True, slots=True)
class CreditDeps:
    """What credit routes use: the sign-in issuer, the store, the limiter and the book."""

    issuer: SiwxIssuer
    store: Store
    limiter: RateLimiter
    book: CreditBook
    recorder: MoneyRecorder


@dataclass(frozen=True, slots=True)
class Credit:
    """The ``credit`` way of paying (:mod:`gateway.methods.registry`): prepaid credit, spent by
    signing in or on a credit session."""

    name: str = CREDIT_METHOD
    mode: AccessMode = PAYMENT_METHODS[CREDIT_METHOD]

    def dependencies(self, parts: SharedParts) -> CreditDeps:
        return CreditDeps(parts.siwx, parts.store, parts.limiter, parts.credit_book, parts.recorder)

    def bind(self, route: RouteSpec, deps: CreditDeps) -> CreditMethod:
        price = credit_price(route)
        assert price is not None, f"route {route.name} takes no credit"
        return CreditMethod(
            route=route,
            price=price,
            issuer=deps.issuer,
            gate=SignInGate(deps.store, deps.limiter, route.rate_limits),
            book=deps.book,
            recorder=deps.recorder,
        )


CREDIT = Credit()
