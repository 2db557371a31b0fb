"""Calls on prepaid credit, named by a call id, so that a call paid once is answered again.

A client whose connection dropped after its call was charged retries the identical request
(same route, same body, same call id: for a per-call sign-in, its nonce). It must get the answer
it paid for, and nothing may be taken twice, as with an exact payment's delivery
(``gateway.methods.exact.ledger``). A call's record sits at ``keys.credit_call(wallet, call_id)``:

* **in flight**: written with the call's admission, in the same store step that holds its price
  (and, for a sign-in, uses its nonce), so of two identical requests only one is admitted; it
  lives as long as the hold (a process that dies mid-call leaves nothing for longer);
* **answered**: written by the take itself (``take_credit``'s ``keep``, ``gateway.store.credit``),
  so an answer is kept exactly when its price was taken; it holds the answer (up to
  :data:`~gateway.methods.exact.ledger.ANSWER_CAP_BYTES`) for as long as a retry could still present
  the call's credential (a sign-in: until it stops verifying), at most
  :data:`~gateway.methods.exact.ledger.ANSWER_TTL_MS`. Calls on credit are cheap, so nothing is
  kept longer than a retry could use it: the store holds at most one answer per call taken in
  that window, which the route's rate limits bound;
* **failed**: nothing was taken (the provider failed, or the credit was gone at the take); the
  call id is spent all the same.

Every record carries the request's fingerprint (route, call id, exact body): only the identical
request gets the answer again; any other under the same call id is refused. The call id is the
caller's to choose: the sign-in's nonce here, a client's idempotency key elsewhere, scoped by
the wallet in the key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import msgspec

from gateway.methods.exact.ledger import ANSWER_CAP_BYTES, ANSWER_TTL_MS, StoredResponse, fingerprint
from gateway.store import Entry, keys


class CallState(enum.StrEnum):
    IN_FLIGHT = "in_flight"
    ANSWERED = "answered"
    FAILED = "failed"


class CallRecord(msgspec.Struct, omit_defaults=True):
    """What the store keeps of one call: which request it is, where it stands, its answer."""

    fingerprint: str
    state: CallState
    response: StoredResponse | None = None
    """The answer paid for, when it was small enough to keep."""


@dataclass(frozen=True, slots=True)
class AnswerAgain:
    """The identical request was answered and charged: its answer again, nothing taken."""

    response: StoredResponse


@dataclass(frozen=True, slots=True)
class StillInFlight:
    """The identical request is still being answered: retry it shortly."""


@dataclass(frozen=True, slots=True)
class NotAgain:
    """The call id was spent on another request, or on this one with no answer to give again."""

    message: str


Earlier = AnswerAgain | StillInFlight | NotAgain
"""What a request finds when its call id was used before."""

_decode = msgspec.json.Decoder(CallRecord).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class CreditCall:
    """One call on a wallet's credit: its record's key and the fingerprint of its request."""

    key: str
    fingerprint: str
    in_flight_ttl_ms: int
    """How long the call may be in flight: its hold's lifetime."""
    answer_ttl_ms: int = ANSWER_TTL_MS
    """How long its answer is kept: while its credential could still be presented again."""

    def _entry(self, record: CallRecord, ttl_ms: int) -> Entry:
        return Entry(self.key, _encode(record).decode(), ttl_ms)

    def in_flight(self) -> Entry:
        """The record its admission writes (a claim: written only where none exists)."""
        return self._entry(CallRecord(self.fingerprint, CallState.IN_FLIGHT), self.in_flight_ttl_ms)

    def answered(self, response: StoredResponse) -> Entry:
        """The record its take writes: the answer, when it fits the cap."""
        kept = response if len(response.body) <= ANSWER_CAP_BYTES else None
        return self._entry(CallRecord(self.fingerprint, CallState.ANSWERED, kept), self.answer_ttl_ms)

    def failed(self) -> Entry:
        """The record of a call that took nothing."""
        return self._entry(CallRecord(self.fingerprint, CallState.FAILED), self.in_flight_ttl_ms)

    def earlier(self, raw: str | None) -> Earlier:
        """What the record found under this call's key (None: none, the call id was spent by a
        sign-in elsewhere) means for this request."""
        try:
            record = _decode(raw) if raw else None
        except msgspec.DecodeError:
            record = None
        if record is None or record.fingerprint != self.fingerprint:
            return NotAgain("this sign-in was used already")
        match record.state:
            case CallState.ANSWERED if record.response is not None:
                return AnswerAgain(record.response)
            case CallState.ANSWERED:
                return NotAgain("this sign-in's call was answered; its answer is too large to keep")
            case CallState.IN_FLIGHT:
                return StillInFlight()
        return NotAgain("this sign-in's call failed and took nothing: sign in again")


def credit_call(
    route: str,
    wallet: str,
    call_id: str,
    body: bytes,
    in_flight_ttl_ms: int,
    answer_ttl_ms: int = ANSWER_TTL_MS,
) -> CreditCall:
    """The call ``call_id`` of ``wallet`` on ``route`` with request body ``body``; its answer is
    kept for ``answer_ttl_ms`` (at most :data:`~gateway.methods.exact.ledger.ANSWER_TTL_MS`)."""
    return CreditCall(
        keys.credit_call(wallet, call_id),
        fingerprint(route, call_id, body),
        in_flight_ttl_ms,
        max(1, min(answer_ttl_ms, ANSWER_TTL_MS)),
    )
