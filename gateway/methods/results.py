"""The values the payment core hands its callers: one paid request, and what each step came to.

Every outcome of a request is a tagged value here (a 402, a paid answer, a 409, a 429), so an
adapter renders it with one ``match`` and the core never speaks HTTP. Only invalid input (400)
and outages (503: the store, the facilitator) stay exceptions: they end the request wherever
they happen, converted once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.limits.rate_limiter import Limited
from gateway.methods.exact.ledger import PendingSettlement, StoredResponse
from gateway.routing.vocabulary import Outcome
from gateway.x402.types import PaymentPayload, PaymentRequirements


@dataclass(frozen=True, slots=True)
class PaidRequest:
    """A verified, claimed payment: everything settling it needs, in one value."""

    payload: PaymentPayload
    """In v2 form (a v1 payment names the requirements it accepted), as the facilitator hears it."""
    requirements: PaymentRequirements
    payer: str
    key: str
    """The payment key: SHA-256 of the transaction message (what is claimed and settled once)."""
    claimant: str
    """The exact signed transaction that claimed it (see ``gateway.methods.exact.ledger.claimant``)."""
    fingerprint: str
    """Route, payment and body: a retry must match it to reconcile or replay."""
    payment_id: str | None
    client_ip: str = ""
    """Who sent it: the fee guard counts a client IP's settlements in flight and cools it down
    after one of them failed on chain."""
    facilitator: str = ""
    """The name of the facilitator that verified it and settles it (never another)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A payment for this route, signed by its payer, with a valid body; not yet checked
    against the store or the facilitator."""

    payload: PaymentPayload
    body: Any
    """The validated JSON body."""
    payer: str
    key: str
    claimant: str
    fingerprint: str
    payment_id: str | None
    facilitator: str
    """The facilitator whose fee payer the payment names: the only one that may settle it."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A 402 with a fresh challenge whose ``error`` is ``reason``; counts against the challenge limit."""

    reason: str
    message: str = ""
    payer: str | None = None
    outcome: str = Outcome.REJECTED
    """How it is counted: a failed payment, unless it is a probe for credit that found none (or
    a refused sign-in, or a method's own word)."""

    @property
    def probe(self) -> bool:
        """A good credential that found nothing to spend (a sign-in without enough credit): the
        client pays another way next, and that payment's admission hands this count back too."""
        return self.outcome == Outcome.CREDIT_UNCOVERED


@dataclass(frozen=True, slots=True)
class Replay:
    """An identical earlier request (same payment identifier) was settled: its stored answer again."""

    response: StoredResponse


@dataclass(frozen=True, slots=True)
class Conflict:
    """A payment identifier that belongs to another request or payment: 409."""

    message: str


@dataclass(frozen=True, slots=True)
class InProgress:
    """The identical request under the same credential is still being answered: 409, retry it
    shortly (it will get that request's answer, or be told why not); nothing is taken twice."""

    message: str


@dataclass(frozen=True, slots=True)
class Reconcile:
    """The request whose settlement was left pending came again: settle it again, never re-pay."""

    paid: PaidRequest
    intent: PendingSettlement


@dataclass(frozen=True, slots=True)
class Paid:
    """Verified and claimed: the upstream may be called; settle after it succeeds."""

    paid: PaidRequest
    body: Any
    """The validated JSON body."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """Paid for: ``response`` carries its receipt (the payment-response header, or the credit
    left) and goes out exactly once."""

    response: StoredResponse
    settlement: str
    outcome: str = Outcome.PAID
    """``paid`` (settled, revenue), ``credit_spent`` (taken from prepaid credit), or a method's
    own word (one of its declared outcomes)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The settlement's outcome is not known: the client retries the same request, never re-pays."""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The process is stopping mid-settle: tell the client it is pending, then keep stopping."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The settlement failed for good: the answer is withheld behind a 402 ``settlement_failed``."""

    reason: str


Inspection = Refused | Candidate
Authorization = Replay | Refused | Reconcile | Paid | Conflict | Limited
Settled = Delivered | Pending | Interrupted | Failed | Refused
