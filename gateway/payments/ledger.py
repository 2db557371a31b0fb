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
"""

from __future__ import annotations

import hashlib

import msgspec

from gateway.store import Store

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

    async def claim(self, key: str, route: str) -> bool:
        return await self.store.claim(f"x402gw:pay:{key}", route, CLAIM_TTL_MS)

    async def claimed(self, key: str) -> bool:
        """Whether the payment was claimed already (a cheap look before asking the facilitator)."""
        return await self.store.get(f"x402gw:pay:{key}") is not None

    async def pending(self, key: str) -> PendingSettlement | None:
        raw = await self.store.get(f"x402gw:pending:{key}")
        return self._pending.decode(raw) if raw else None

    async def record_pending(self, key: str, record: PendingSettlement) -> None:
        await self.store.put(f"x402gw:pending:{key}", msgspec.json.encode(record).decode(), PENDING_TTL_MS)

    async def resolve_pending(self, key: str) -> None:
        """Mark the pending record done (an empty record expires at once)."""
        await self.store.put(f"x402gw:pending:{key}", "", 1)

    async def claim_delivery(self, key: str) -> bool:
        """True for exactly one caller per payment: the one that hands out the settled answer."""
        return await self.store.claim(f"x402gw:delivered:{key}", "1", CLAIM_TTL_MS)

    async def payment_id(self, pid: str) -> PaymentIdRecord | None:
        raw = await self.store.get(f"x402gw:pid:{pid}")
        return self._pid.decode(raw) if raw else None

    async def reserve_payment_id(self, pid: str, fp: str) -> bool:
        """Tie ``pid`` to this request's fingerprint; False when another request holds it."""
        record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp)).decode()
        return await self.store.claim(f"x402gw:pid:{pid}", record, PAYMENT_ID_TTL_MS)

    async def complete_payment_id(self, pid: str, fp: str, response: StoredResponse) -> None:
        record = msgspec.json.encode(PaymentIdRecord(fingerprint=fp, response=response)).decode()
        await self.store.put(f"x402gw:pid:{pid}", record, PAYMENT_ID_TTL_MS)
