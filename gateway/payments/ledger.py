"""The money state of paid requests, kept in the shared store so every replica agrees.

A payment is known by its **payment key**: the SHA-256 of its transaction message, the bytes
every signer commits to. Never by a client signature: an ed25519 signer may pick its nonce, so
one message can carry any number of valid client signatures, and each would otherwise buy
another answer. The facilitators deduplicate by the message too, so both sides agree on what
"one payment" is.

Keys (all under ``x402gw:``):

* ``pay:{key}`` - the claim on a payment, taken atomically before the facilitator verifies it.
  Released only when the facilitator refuses it or cannot be asked (the payment was never
  used), never once verified: a discarded authorization can never be settled or reused.
* ``pending:{key}`` - the write-ahead record of a settlement: written with the request
  fingerprint and the withheld response *before* the facilitator is asked to settle, and
  closed once the outcome is known. Whatever happens in between (a pending confirmation, a
  silent facilitator, the process killed), a retry of the identical request reconciles
  against it instead of paying twice.
* ``delivered:{key}`` - taken by the one request that delivers the settled answer, so
  concurrent reconciliations of one payment answer once.
* ``pid:{id}`` - the payment-identifier record: the request fingerprint and, once settled,
  the response to replay for 10 minutes.

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

from gateway.store import Bucket, Entry, RateDecision, Store

CLAIM_TTL_MS = 15 * 60 * 1000
"""Longer than any blockhash lives (about 60-90 s), so a claim outlives its payment."""
PENDING_TTL_MS = 15 * 60 * 1000
PAYMENT_ID_TTL_MS = 10 * 60 * 1000


def pay_key(key: str) -> str:
    return f"x402gw:pay:{key}"


def pending_key(key: str) -> str:
    return f"x402gw:pending:{key}"


def delivered_key(key: str) -> str:
    return f"x402gw:delivered:{key}"


def payment_id_key(payment_id: str) -> str:
    return f"x402gw:pid:{payment_id}"


class StoredResponse(msgspec.Struct):
    """A response we owe or may replay: status, headers, body and the payment-response header."""

    status: int
    body: bytes
    content_type: str
    payment_response: str = ""
    settlement: str = ""


class PendingSettlement(msgspec.Struct):
    """The write-ahead record of one settlement. Only the request that recorded it may reconcile
    it: same ``fingerprint`` (route, payment, body) and same ``claimant`` (the exact signed
    transaction), so a copy of the message under another client signature never collects it."""

    fingerprint: str
    claimant: str
    response: StoredResponse | None = None
    transaction: str = ""
    """The settlement's transaction, once a facilitator named it."""


class PaymentIdRecord(msgspec.Struct):
    fingerprint: str
    response: StoredResponse | None = None


@dataclass(frozen=True, slots=True)
class ClaimAttempt:
    """What one claim attempt on a payment found and did, in one store round trip."""

    claimed: bool
    """The payment was claimed before this attempt (by an earlier or concurrent request)."""
    pending: PendingSettlement | None
    """Its open write-ahead record, when a settlement of it was left pending."""
    payment_id: PaymentIdRecord | None
    """The record of the request's payment identifier, if it sent one and it is known."""
    decisions: list[RateDecision]
    """One per bucket charged, in order, up to the first refusal; none when the payment was
    claimed or its identifier known (nothing is charged for a request answered from the store)."""
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

    async def claim(
        self, key: str, route: str, payment_id: str | None, fp: str, buckets: Sequence[Bucket]
    ) -> ClaimAttempt:
        """Is the payment claimed (its settlement perhaps pending), is its identifier known;
        only when none of these, one decision per rate-limit bucket; only when every bucket
        allows it, claim the payment and tie its identifier (if any) to this request. One round
        trip, atomic: of many concurrent attempts on one payment, exactly one wins."""
        entries = [Entry(pay_key(key), f"{route} {secrets.token_hex(8)}", CLAIM_TTL_MS)]
        keys = [pay_key(key), pending_key(key)]
        if payment_id is not None:
            record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp)).decode()
            entries.append(Entry(payment_id_key(payment_id), record, PAYMENT_ID_TTL_MS))
            keys.append(payment_id_key(payment_id))
        found = await self.store.check_then_limit(keys, buckets, entries)
        claim, pending = found.values[0], found.values[1]
        raw_pid = found.values[2] if payment_id is not None else None
        return ClaimAttempt(
            # An open pending record outlives its claim by the moments between the two writes.
            claimed=claim is not None or pending is not None,
            pending=self._pending.decode(pending) if pending else None,
            payment_id=self._pid.decode(raw_pid) if raw_pid else None,
            decisions=found.decisions,
            entries=tuple(entries) if found.written else (),
        )

    async def release(self, attempt: ClaimAttempt) -> None:
        """Undo a won claim whose payment was never used (the facilitator refused it or could not
        be asked): the client may offer the same payment again, its identifier included. Each key
        is deleted only while it holds what this attempt wrote."""
        for entry in attempt.entries:
            await self.store.release(entry.key, entry.value)

    async def record_pending(self, key: str, record: PendingSettlement) -> None:
        await self.store.put(pending_key(key), msgspec.json.encode(record).decode(), PENDING_TTL_MS)

    async def resolve_pending(self, key: str) -> None:
        """Mark the pending record done (an empty record expires at once)."""
        await self.store.put(pending_key(key), "", 1)

    async def deliver(self, key: str, replay: tuple[str, str, StoredResponse] | None) -> bool:
        """True for exactly one caller per payment, the one that hands out the settled answer;
        that one also closes the intent and keeps ``replay`` (payment identifier, fingerprint,
        response) for identifier retries. One round trip."""
        puts = [Entry(pending_key(key), "", 1)]
        if replay is not None:
            pid, fp, response = replay
            record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp, response=response)).decode()
            puts.append(Entry(payment_id_key(pid), record, PAYMENT_ID_TTL_MS))
        return await self.store.claim_then_put([Entry(delivered_key(key), "1", CLAIM_TTL_MS)], puts) == 1
