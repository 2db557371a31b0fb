"""Sign-in-with-x: the one sign-in sequence, and the zero-price way in built on it.

Every way in by signing in (the asset-data routes here, prepaid credit in
:mod:`gateway.methods.credit.method`) runs the same sequence (:class:`SignInSequence`): the
sign-in verified for this request's resource URL and the statement the route's challenge gave,
then admitted once by :class:`SignInGate`. :class:`SignInMethod` is sign-in-with-x as a payment
method at $0.00 (access ``siwx``): its 402 is the sign-in challenge alone, an admitted sign-in
reaches the handler with nothing to collect (:class:`~gateway.methods.seam.Passed`).

Its order never changes: no ``SIGN-IN-WITH-X`` header -> 402 challenge before the body is read
(a challenge has no side effect: it is not counted against any limit); a header -> verify it
(refused: 402 with a fresh challenge whose ``error`` is the reason) -> validate path, query and
body (400/413) -> the gate admits it (replayed: 402; over a limit: 429) -> the handler. Every
refusal, a 429 included, counts against the client IP's challenge limit, so re-sending a
refused sign-in is not free; the wallet, IP and upstream-key buckets are spent by credible
sign-ins alone.

A route whose sign-in authorises terms given in its query (a credit session's cap and lifetime:
:class:`SignedTerms`) validates the query first (400 before any challenge), and its challenge's
resource URL carries the terms, so the wallet's signature covers them, and its statement names
them; a sign-in whose signed statement is not that one is refused (``siwx_statement_mismatch``),
so a relay cannot show the wallet other words for the same terms.

The sign-in's signature, times and resource are checked by :class:`gateway.x402.siwx.SiwxIssuer`;
this core decides, in one store round trip, whether a verified sign-in may reach the upstream:
its nonce unused, then (for a call paid from prepaid credit) the wallet's free credit covering
the call's price, then the wallet's and the client IP's own buckets, then the budget every
wallet shares, and only then the nonce recorded as used, the price held and the record of the
call it pays for claimed (``gateway.methods.credit.calls``). A sign-in refused
by its credit or a limit spends nothing shared and keeps its nonce, to be sent again once it
may. Every expected result is a value; only an outage (``StoreUnavailable``) raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.limits.rate_limiter import Limited, RateLimiter
from gateway.methods.credit.sessions import SessionTerms
from gateway.methods.results import Refused, Settled
from gateway.methods.seam import Answer, Asked, Checked, Incoming, Offer, Passed, credential_headers
from gateway.routing.routes import RateLimitSpec, RouteSpec
from gateway.routing.validation import RequestValidator, ValidatedInput
from gateway.routing.vocabulary import PAYMENT_METHODS, SIGN_IN_METHOD, AccessMode, Outcome
from gateway.store import CreditHoldOrder, CreditState, Entry, Store, StoreUnavailable, keys
from gateway.store.limits import check_then_limit
from gateway.x402.headers import encode_header
from gateway.x402.siwx import SiwxError, SiwxIssuer, SiwxReason, VerifiedSignIn

if TYPE_CHECKING:
    from gateway.methods.shared import SharedParts


@dataclass(frozen=True, slots=True)
class Admitted:
    """The nonce is now used, every bucket charged and the credit ordered held: call the upstream."""

    held: CreditState | None = None
    """The wallet's credit after the hold, when one was ordered."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """The nonce was used already: a replayed sign-in."""

    call: str | None = None
    """The raw value at the key of the ``call`` record given to :meth:`SignInGate.admit`, if any:
    the caller tells its call's identical retry from another request under the same nonce."""


@dataclass(frozen=True, slots=True)
class Uncovered:
    """The wallet's free credit does not cover the hold ordered: nothing was spent or held."""


Admission = Admitted | Replayed | Limited | Uncovered
"""``Limited``: a bucket refused the sign-in; nothing shared was spent."""


class SignInGate:
    """Admits verified sign-ins on one route."""

    def __init__(self, store: Store, limiter: RateLimiter, limits: Sequence[RateLimitSpec]) -> None:
        self.store = store
        self.limiter = limiter
        self.limits = tuple(limits)

    async def admit(
        self,
        signed: VerifiedSignIn,
        client_ip: str,
        hold: CreditHoldOrder | None = None,
        call: Entry | None = None,
    ) -> Admission:
        """Use the nonce once across every replica, for as long as it could still verify, and make
        ``hold`` (the signed-in wallet's credit) and write ``call`` (the record of the call it
        pays for, a claim of its own) in the same atomic step."""
        key = keys.sign_in_nonce(signed.address, signed.nonce)
        plan = self.limiter.plan(self.limits, wallet=signed.address, ip=client_ip)
        checked, puts = [key], [Entry(key, signed.address, signed.replay_ttl_ms)]
        if call is not None:
            checked.append(call.key)
            puts.append(call)
        found = await check_then_limit(self.store, checked, plan.buckets, puts, hold)
        if any(value is not None for value in found.values):
            return Replayed(found.values[1] if call is not None else None)
        limited = plan.refusal(found.decisions)
        if limited is not None:
            return limited
        if found.written and (hold is None or found.held is not None):
            return Admitted(found.held)
        if hold is not None and not found.written and not found.decisions:
            return Uncovered()
        raise StoreUnavailable("state store neither refused nor recorded the sign-in")


class SignInSequence:
    """The one sign-in sequence: verify the sign-in for this request, then admit it once."""

    def __init__(self, issuer: SiwxIssuer, gate: SignInGate) -> None:
        self.issuer = issuer
        self.gate = gate

    def resource(self, path: str) -> str:
        """The URL a sign-in for ``path`` signs: the route's, so it cannot be moved elsewhere."""
        return self.issuer.resource_url(path)

    def verify(
        self, credential: str, resource: str, statement: str | None, refused_as: str
    ) -> VerifiedSignIn | Refused:
        """The verified sign-in, or its refusal (counted as ``refused_as``): signature, times,
        resource, and with a ``statement`` the words the wallet had to sign."""
        try:
            return self.issuer.verify(credential, resource, statement=statement)
        except SiwxError as refused:
            return Refused(refused.reason.value, str(refused), outcome=refused_as)

    async def admit(
        self,
        signed: VerifiedSignIn,
        client_ip: str,
        hold: CreditHoldOrder | None = None,
        call: Entry | None = None,
    ) -> Admission:
        return await self.gate.admit(signed, client_ip, hold, call)


class SignedTerms(Protocol):
    def signed(self, resource: str, query: Mapping[str, Any]) -> tuple[str, str]:
        """The resource URL the wallet signs for ``query`` (the terms in it) and the statement
        naming them."""
        ...


class SignInMethod:
    """One sign-in route: nothing is paid and nothing is settled; a verified sign-in, used once,
    reaches the handler, which reads it from the request's context."""

    credential_headers = credential_headers(PAYMENT_METHODS[SIGN_IN_METHOD])

    def __init__(self, *, route: RouteSpec, sign_in: SignInSequence, terms: SignedTerms | None) -> None:
        self.description = route.description
        self.sign_in = sign_in
        self.terms = terms
        self.validator = RequestValidator(route.input)

    def _signed(self, asked: Asked) -> tuple[str, str | None]:
        """The resource URL a sign-in signs here and the statement it must have signed (a route
        with terms: 400 for terms the route's query schema refuses)."""
        resource = self.sign_in.resource(asked.path)
        if self.terms is None:
            return resource, None
        return self.terms.signed(resource, self.validator.query(asked.query))

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """A 402 with a fresh challenge, as JSON body and base64 ``PAYMENT-REQUIRED`` header."""
        resource, statement = self._signed(asked)
        document = self.sign_in.issuer.challenge(
            resource,
            error=error,
            description=self.description,
            mime_type="application/json",
            statement=statement,
        )
        if extensions:
            document.extensions = {**(document.extensions or {}), **extensions}
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            (b"payment-required", encode_header(document).encode("ascii")),
        ]
        return Offer(msgspec.json.encode(document), headers)

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
        return {}

    async def check(self, incoming: Incoming) -> Checked[None]:
        resource, statement = self._signed(incoming.asked)
        verified = self.sign_in.verify(incoming.credential, resource, statement, Outcome.REFUSED)
        if isinstance(verified, Refused):
            return Checked(verified)
        wallet = verified.address
        validated = await self._validate(incoming)
        match await self.sign_in.admit(verified, incoming.client_ip):
            case Replayed():
                replayed = Refused(SiwxReason.REPLAYED.value, "sign-in already used", outcome=Outcome.REFUSED)
                return Checked(replayed, wallet=wallet)
            case Limited() as limited:
                return Checked(limited, wallet=wallet, limit_counted=True)
            case Admitted():
                return Checked(Passed(validated, Outcome.SIGNED_IN, verified), wallet=wallet)
        raise StoreUnavailable("state store neither refused nor recorded the sign-in")

    async def _validate(self, incoming: Incoming) -> ValidatedInput:
        """The route's declared input: ``InvalidInput`` (400 naming the parameter) or 413 for an
        oversized body."""
        path = self.validator.path(incoming.path_params)
        query = self.validator.query(incoming.query)
        body = self.validator.body(await incoming.read_body()) if self.validator.has_body else None
        return ValidatedInput(path=path, query=query, body=body)

    async def finish(self, grant: None, answer: Answer) -> Settled:
        """Never called: a sign-in is ``Passed``, never ``Admitted`` (nothing to collect)."""
        raise AssertionError("a sign-in passes: nothing is finished")

    async def abandon(self, grant: None) -> None:
        """Nothing was held."""


@dataclass(frozen=True, slots=True)
class SignInDeps:
    """What sign-in routes use: the issuer of their challenges, the store and the limiter."""

    issuer: SiwxIssuer
    store: Store
    limiter: RateLimiter


@dataclass(frozen=True, slots=True)
class SignIn:
    """The ``siwx`` way in (:mod:`gateway.methods.registry`): sign-in-with-x at $0.00."""

    name: str = SIGN_IN_METHOD
    mode: AccessMode = PAYMENT_METHODS[SIGN_IN_METHOD]

    def dependencies(self, parts: SharedParts) -> SignInDeps:
        return SignInDeps(parts.siwx, parts.store, parts.limiter)

    def bind(self, route: RouteSpec, deps: SignInDeps) -> SignInMethod:
        gate = SignInGate(deps.store, deps.limiter, route.rate_limits)
        # opening a credit session signs its cap and lifetime, given in the query
        terms = SessionTerms(deps.issuer.base_url) if route.handler == "credit_session_open" else None
        return SignInMethod(route=route, sign_in=SignInSequence(deps.issuer, gate), terms=terms)


SIGN_IN = SignIn()
