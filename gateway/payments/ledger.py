"""The money state of paid requests, kept in the shared store so every replica agrees.

A payment is known by its **payment key**: the SHA-256 of its transaction message, the bytes
every signer commits to. Never by a client signature: an ed25519 signer may pick its nonce, so
one message can carry any number of valid client signatures, and each would otherwise buy
another answer. The facilitators deduplicate by the message too, so both sides agree on what
"one payment" is.

Keys (all under ``x402gw:``):

* ``pay:{key}`` - the claim on a payment, taken atomically before the upstream is called; it
  is never released, so a discarded authorization can never be settled or reused.
* ``pending:{key}`` - the write-ahead record of a settlement: written with the request
  fingerprint and the withheld response *before* the facilitator is asked to settle, and
  closed once the outcome is known. Whatever happens in between (a pending confirmation, a
  silent facilitator, the process killed), a retry of the identical request reconciles
  against it instead of paying twice.
* ``delivered:{key}`` - taken by the one request that delivers the settled answer, so
  concurrent reconciliations of one payment answer once.
* ``pid:{id}`` - the payment-identifier record: the request fingerprint and, once settled,
  the response to replay for 10 minutes.

A paid request takes four store round trips, whatever its rate limits and whether it carries a
payment identifier: :meth:`PaymentLedger.look_up` (is it used, is its identifier known, and
only if neither, its rate-limit buckets), :meth:`~PaymentLedger.claim` (the payment, then its
identifier), :meth:`~PaymentLedger.record_pending` (the write-ahead intent) and
:meth:`~PaymentLedger.deliver` (the one delivery, closing the intent and keeping the replay).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gateway.store import Bucket, Entry, RateDecision, Store

CLAIM_TTL_MS = 15 * 60 * 1000
"""Longer than any blockhash lives (about 60-90 s), so a claim outlives its payment."""
PENDING_TTL_MS = 15 * 60 * 1000
PAYMENT_ID_TTL_MS = 10 * 60 * 1000


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
class PaymentLookup:
    """What the store knows of a payment before it is verified."""

    claimed: bool
    payment_id: PaymentIdRecord | None
    """The record of the request's payment identifier, if it sent one and it is known."""
    decisions: list[RateDecision]
    """One per bucket charged, in order, up to the first refusal; none when the payment was
    claimed or its identifier known (nothing is charged for a request answered from the store)."""

    @property
    def charged(self) -> bool:
        return not self.claimed and self.payment_id is None


class Claim(enum.Enum):
    WON = "won"
    TAKEN = "taken"
    """Another request claimed this payment first."""
    ID_TAKEN = "id_taken"
    """The payment is ours, but its payment identifier belongs to another request."""


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

    async def look_up(self, key: str, payment_id: str | None, buckets: Sequence[Bucket]) -> PaymentLookup:
        """Is the payment claimed, is its identifier known, and (only when neither) one decision
        per rate-limit bucket: one round trip."""
        keys = [f"x402gw:pay:{key}"] + ([f"x402gw:pid:{payment_id}"] if payment_id is not None else [])
        found = await self.store.check_then_limit(keys, buckets)
        raw_pid = found.values[1] if payment_id is not None else None
        return PaymentLookup(
            claimed=found.values[0] is not None,
            payment_id=self._pid.decode(raw_pid) if raw_pid else None,
            decisions=found.decisions,
        )

    async def claim(self, key: str, route: str, payment_id: str | None, fp: str) -> Claim:
        """Claim the payment, then tie its identifier (if any) to this request: one round trip."""
        claims = [Entry(f"x402gw:pay:{key}", route, CLAIM_TTL_MS)]
        if payment_id is not None:
            record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp)).decode()
            claims.append(Entry(f"x402gw:pid:{payment_id}", record, PAYMENT_ID_TTL_MS))
        won = await self.store.claim_then_put(claims)
        if won == len(claims):
            return Claim.WON
        return Claim.TAKEN if won == 0 else Claim.ID_TAKEN

    async def claimed(self, key: str) -> bool:
        """Whether the payment was claimed already (a concurrent request may have won it)."""
        return await self.store.get(f"x402gw:pay:{key}") is not None

    async def pending(self, key: str) -> PendingSettlement | None:
        raw = await self.store.get(f"x402gw:pending:{key}")
        return self._pending.decode(raw) if raw else None

    async def record_pending(self, key: str, record: PendingSettlement) -> None:
        await self.store.put(f"x402gw:pending:{key}", msgspec.json.encode(record).decode(), PENDING_TTL_MS)

    async def resolve_pending(self, key: str) -> None:
        """Mark the pending record done (an empty record expires at once)."""
        await self.store.put(f"x402gw:pending:{key}", "", 1)

    async def deliver(self, key: str, replay: tuple[str, str, StoredResponse] | None) -> bool:
        """True for exactly one caller per payment, the one that hands out the settled answer;
        that one also closes the intent and keeps ``replay`` (payment identifier, fingerprint,
        response) for identifier retries. One round trip."""
        puts = [Entry(f"x402gw:pending:{key}", "", 1)]
        if replay is not None:
            pid, fp, response = replay
            record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp, response=response)).decode()
            puts.append(Entry(f"x402gw:pid:{pid}", record, PAYMENT_ID_TTL_MS))
        return (
            await self.store.claim_then_put([Entry(f"x402gw:delivered:{key}", "1", CLAIM_TTL_MS)], puts) == 1
        )
