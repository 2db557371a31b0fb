"""The money state of paid requests, kept in the shared store so every replica agrees.

Keys (all under ``x402gw:``):

* ``pay:{signature}`` - the claim on a client's payment (its transaction signature), taken
  atomically before the upstream is called; it is never released, so a discarded
  authorization can never be settled or reused.
* ``pending:{signature}`` - a settlement whose outcome is not known yet (``settlement_pending``
  or the facilitator went silent after upstream success), with the withheld response, so a
  retry reconciles instead of broadcasting again.
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
    fingerprint: str
    response: StoredResponse | None = None
    transaction: str = ""


class PaymentIdRecord(msgspec.Struct):
    fingerprint: str
    response: StoredResponse | None = None


def fingerprint(route: str, signature: str, body: bytes) -> str:
    """Identity of one paid request: route, the payment and the exact body."""
    digest = hashlib.sha256()
    for part in (route.encode(), b"\0", signature.encode(), b"\0", body):
        digest.update(part)
    return digest.hexdigest()


class PaymentLedger:
    """Typed access to the payment keys; every method may raise ``StoreUnavailable``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending = msgspec.json.Decoder(PendingSettlement)
        self._pid = msgspec.json.Decoder(PaymentIdRecord)

    async def claim(self, signature: str, route: str) -> bool:
        return await self.store.claim(f"x402gw:pay:{signature}", route, CLAIM_TTL_MS)

    async def claimed(self, signature: str) -> bool:
        """Whether the payment was claimed already (a cheap look before asking the facilitator)."""
        return await self.store.get(f"x402gw:pay:{signature}") is not None

    async def pending(self, signature: str) -> PendingSettlement | None:
        raw = await self.store.get(f"x402gw:pending:{signature}")
        return self._pending.decode(raw) if raw else None

    async def record_pending(self, signature: str, record: PendingSettlement) -> None:
        await self.store.put(
            f"x402gw:pending:{signature}", msgspec.json.encode(record).decode(), PENDING_TTL_MS
        )

    async def resolve_pending(self, signature: str) -> None:
        """Mark the pending record done (an empty record expires with the claim)."""
        await self.store.put(f"x402gw:pending:{signature}", "", 1)

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
