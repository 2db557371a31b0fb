"""The money state of paid requests, kept in the shared store so every replica agrees.

A payment is known by its **payment key**: the SHA-256 of its transaction message, the bytes
every signer commits to. Never by a client signature: an ed25519 signer may pick its nonce, so
one message can carry any number of valid client signatures, and each would otherwise buy
another answer. The facilitators deduplicate by the message too, so both sides agree on what
"one payment" is.

Keys (spelled in :mod:`gateway.store.keys`):

* ``pay:{key}`` - the claim on a payment, taken atomically before the facilitator verifies it.
  Released only when the facilitator refuses it or cannot be asked (the payment was never
  used), never once verified: a discarded authorization can never be settled or reused.
* ``pending:{key}`` - the write-ahead record of a settlement: written with the request
  fingerprint and the withheld response *before* the facilitator is asked to settle, and
  closed once the outcome is known. Whatever happens in between (a pending confirmation, a
  silent facilitator, the process killed), a retry of the identical request reconciles
  against it instead of paying twice.
* ``delivered:{key}`` - taken by the one request that delivers the settled answer, so
  concurrent reconciliations of one payment answer once. It keeps the request's fingerprint
  and signed transaction and, up to a size cap, the answer, so that the identical request (same
  signed payment, route and body) retried within 10 minutes, by a client whose connection
  dropped after it was charged, gets what it paid for again; any other request offering the
  payment is refused.
* ``pid:{id}`` - the payment-identifier record: the fingerprint of the one request the
  identifier belongs to, for 10 minutes (another request under it is a conflict).

A paid request takes three store round trips, whatever its rate limits and whether it carries
a payment identifier: :meth:`PaymentLedger.claim` (is it used or pending, is its identifier
known; only if none of these, its rate-limit buckets; only if they allow it, the claim on the
payment and its identifier), :meth:`~PaymentLedger.record_pending` (the write-ahead intent) and
:meth:`~PaymentLedger.deliver` (the one delivery, closing the intent and keeping the replay).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gateway.store import Bucket, Credit, Entry, RateDecision, Store, keys
from gateway.store.claims import claim_then_put
from gateway.store.limits import check_then_limit, undo_claim

CLAIM_TTL_MS = 15 * 60 * 1000
"""Longer than any blockhash lives (about 60-90 s), so a claim outlives its payment."""
PENDING_TTL_MS = 15 * 60 * 1000
PAYMENT_ID_TTL_MS = 10 * 60 * 1000
ANSWER_TTL_MS = PAYMENT_ID_TTL_MS
"""How long an identical retry of a paid request gets its answer again."""
ANSWER_CAP_BYTES = 16 * 1024
"""The largest answer kept for an identical retry that carries no payment identifier: every
paid answer is kept, so the cap bounds what the store holds per sale. With an identifier, the
route's ``replay_cap_bytes`` applies (the client asked for idempotency)."""


class StoredResponse(msgspec.Struct):
    """A response we owe or may replay: status, headers, body and the payment-response header."""

    status: int
    body: bytes
    content_type: str
    payment_response: str = ""
    settlement: str = ""
    credit_balance: str = ""
    """Paid from prepaid credit: the wallet's credit left (the ``X-Credit-Balance`` header)."""
    receipts: dict[str, str] = msgspec.field(default_factory=dict)
    """Another method's own receipt headers (as its description declares them), by name."""


class PendingSettlement(msgspec.Struct):
    """The write-ahead record of one settlement. Only the request that recorded it may reconcile
    it: same ``fingerprint`` (route, payment, body) and same ``claimant`` (the exact signed
    transaction), so a copy of the message under another client signature never collects it."""

    fingerprint: str
    claimant: str
    response: StoredResponse | None = None
    transaction: str = ""
    """The settlement's transaction, once a facilitator named it."""
    retried: bool = False
    """A retry of the recording request reconciles it: written before that retry asks the
    facilitator, so a ``duplicate_settlement`` the recording request hears afterwards may be its
    retry's settlement, not a stranger's (see ``Settlement``)."""


class PaymentIdRecord(msgspec.Struct):
    fingerprint: str


class DeliveredRecord(msgspec.Struct):
    """The one delivery of a settled payment: which request it answered (its fingerprint, and
    its exact signed transaction as ``claimant``: ed25519 signing is deterministic, so an honest
    client's retry carries the same one, while a copy of the message re-signed with another
    nonce does not), and the answer when it is small enough to keep for that request's retries."""

    fingerprint: str
    claimant: str
    response: StoredResponse | None = None

    def answers(self, fingerprint: str, claimant: str, *, identified: bool) -> StoredResponse | None:
        """The kept answer, for the very request that was delivered; None for any other. A retry
        under the request's payment identifier is that request whatever its client signature:
        the client named it so."""
        if fingerprint == self.fingerprint and (identified or claimant == self.claimant):
            return self.response
        return None


@dataclass(frozen=True, slots=True)
class ClaimAttempt:
    """What one claim attempt on a payment found and did, in one store round trip."""

    claimed: bool
    """The payment was claimed before this attempt (by an earlier or concurrent request)."""
    pending: PendingSettlement | None
    """Its open write-ahead record, when a settlement of it was left pending."""
    delivered: DeliveredRecord | None
    """The payment's delivery, once its settled answer went out."""
    payment_id: PaymentIdRecord | None
    """The record of the request's payment identifier, if it sent one and it is known."""
    decisions: list[RateDecision]
    """One per bucket charged, in order, up to the first refusal; none when the payment was
    claimed or its identifier known (nothing is charged for a request answered from the store)."""
    blocked: bool = False
    """One of the attempt's blockers (a cool-down of its client) was present: nothing was charged."""
    entries: tuple[Entry, ...] = ()
    """What a won attempt wrote: what :meth:`PaymentLedger.release` deletes, value for value."""

    @property
    def won(self) -> bool:
        """This attempt claimed the payment (and tied its identifier to this request)."""
        return bool(self.entries)


def claimant(signed_transaction: bytes) -> str:
    """Identity of the exact signed transaction that claimed a payment (its client signature
    included): the token a pending settlement is reconciled with."""
    return hashlib.sha256(signed_transaction).hexdigest()


def fingerprint(route: str, key: str, body: bytes) -> str:
    """Identity of one paid request: route, the payment (its key) and the exact body."""
    digest = hashlib.sha256()
    for part in (route.encode(), b"\0", key.encode(), b"\0", body):
        digest.update(part)
    return digest.hexdigest()


class PaymentLedger:
    """Typed access to the payment keys; every method may raise ``StoreUnavailable``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending = msgspec.json.Decoder(PendingSettlement)
        self._pid = msgspec.json.Decoder(PaymentIdRecord)
        self._delivered = msgspec.json.Decoder(DeliveredRecord)

    async def claim(
        self,
        payer: str,
        key: str,
        route: str,
        payment_id: str | None,
        fp: str,
        buckets: Sequence[Bucket],
        blockers: Sequence[str] = (),
    ) -> ClaimAttempt:
        """Is the payment claimed (its settlement perhaps pending, its answer perhaps delivered),
        is its identifier known; only when none of these, one decision per rate-limit bucket;
        only when every bucket allows it, claim the payment and tie its identifier (if any) to
        this request. One round trip, atomic: of many concurrent attempts on one payment,
        exactly one wins. Any of ``blockers`` present (a cool-down) refuses it, charging nothing."""
        claim = keys.payment_claim(payer, key)
        entries = [Entry(claim, f"{route} {secrets.token_hex(8)}", CLAIM_TTL_MS)]
        read = [claim, keys.pending_settlement(payer, key), keys.delivery(payer, key)]
        if payment_id is not None:
            record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp)).decode()
            entries.append(Entry(keys.payment_id(payer, payment_id), record, PAYMENT_ID_TTL_MS))
            read.append(keys.payment_id(payer, payment_id))
        read += blockers
        found = await check_then_limit(self.store, read, buckets, entries)
        claimed, pending, delivered = found.values[:3]
        raw_pid = found.values[3] if payment_id is not None else None
        blocked = any(v is not None for v in found.values[len(read) - len(blockers) :])
        return ClaimAttempt(
            # An open pending record outlives its claim by the moments between the two writes.
            claimed=claimed is not None or pending is not None,
            pending=self._pending.decode(pending) if pending else None,
            delivered=self._delivered.decode(delivered) if delivered else None,
            payment_id=self._pid.decode(raw_pid) if raw_pid else None,
            decisions=found.decisions,
            blocked=blocked,
            entries=tuple(entries) if found.written else (),
        )

    async def release(
        self, attempt: ClaimAttempt, refunds: Sequence[Bucket] = (), debts: Sequence[Bucket] = ()
    ) -> None:
        """Undo a won claim whose payment was never used (the facilitator refused it or could not
        be asked): the client may offer the same payment again, its identifier included. Each key
        is deleted only while it holds what this attempt wrote; in the same round trip the
        shared budgets it spent are handed back (``refunds``) and the refusal is charged
        (``debts``)."""
        await undo_claim(self.store, attempt.entries, refunds, debts)

    async def record_pending(self, payer: str, key: str, record: PendingSettlement) -> None:
        encoded = msgspec.json.encode(record).decode()
        await self.store.put(keys.pending_settlement(payer, key), encoded, PENDING_TTL_MS)

    async def settled_by_retry(self, payer: str, key: str, fp: str) -> bool:
        """Whether a retry of the request with fingerprint ``fp`` is reconciling the payment
        (its intent marked ``retried``) or delivered it already: one round trip, reads only."""
        read = [keys.pending_settlement(payer, key), keys.delivery(payer, key)]
        pending, delivered = (await check_then_limit(self.store, read, [])).values
        if pending and self._pending.decode(pending).retried:
            return True
        return delivered is not None and self._delivered.decode(delivered).fingerprint == fp

    async def resolve_pending(self, payer: str, key: str) -> None:
        """Mark the pending record done (an empty record expires at once)."""
        await self.store.put(keys.pending_settlement(payer, key), "", 1)

    async def deliver(
        self, payer: str, key: str, record: DeliveredRecord, credits: Sequence[Credit] = ()
    ) -> bool:
        """True for exactly one caller per payment, the one that hands out the settled answer;
        that one also closes the intent and books ``credits`` (a top-up's). ``record`` (the
        request, and the answer to give its identical retries) is what a later claim attempt on
        the payment reads. One round trip: the credit is booked exactly when the delivery is."""
        delivery = Entry(keys.delivery(payer, key), msgspec.json.encode(record).decode(), ANSWER_TTL_MS)
        close = Entry(keys.pending_settlement(payer, key), "", 1)
        return await claim_then_put(self.store, [delivery], [close], credits) == 1
