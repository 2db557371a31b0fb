"""Local, cheap checks of a payment against one route: nothing here touches the store or the
facilitator, so junk is refused before it can cost a shared bucket or a verify call."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from solders.message import to_bytes_versioned
from solders.transaction import VersionedTransaction

from gateway.methods.exact.ledger import claimant
from gateway.methods.results import Refused
from gateway.x402 import svm
from gateway.x402.challenge import PAYMENT_IDENTIFIER
from gateway.x402.types import SCHEME_EXACT, V1_NETWORKS, PaymentPayload, PaymentRequirements, ResourceInfo

PAYMENT_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")


@dataclass(frozen=True, slots=True)
class Signed:
    """Who pays, which payment it is, and which signed transaction offered it."""

    payer: str
    key: str
    claimant: str


def match_payment(payload: PaymentPayload, want: PaymentRequirements) -> Signed | Refused:
    """The payment is for this route as far as the header says, not a self-transfer, and signed
    by its payer over the message; else the reason it is refused."""
    accepted = payload.accepted
    scheme = accepted.scheme if accepted else payload.scheme
    network = accepted.network if accepted else V1_NETWORKS.get(payload.network or "", payload.network)
    if payload.x402Version not in (1, 2) or (payload.x402Version == 2 and accepted is None):
        return Refused("invalid_x402_version")
    if scheme != SCHEME_EXACT:
        return Refused("invalid_scheme")
    if network != want.network:
        return Refused("invalid_network")
    if accepted is not None:
        if accepted.asset != want.asset:
            return Refused("asset_mismatch")
        if accepted.amount != want.amount:
            return Refused("amount_mismatch")
        if accepted.payTo != want.payTo:
            return Refused("pay_to_mismatch")
    transaction = payload.payload.get("transaction")
    if not isinstance(transaction, str):
        return Refused("invalid_payload", "payload.transaction is missing")
    try:
        tx = svm.decode_transaction(transaction)
    except ValueError as exc:
        return Refused("invalid_payload", str(exc))
    client = svm.payment_client(tx)
    if client is None:
        return Refused("invalid_payload", "the transaction has no client signer")
    payer = client[0]
    if payer == want.payTo:
        return Refused("self_transfer", "the payer must differ from payTo")
    if not client_signed(tx):
        return Refused(svm.Reason.TRANSACTION.value, "the client's signature does not verify")
    return Signed(payer, svm.payment_key(tx), claimant(bytes(tx)))


def client_signed(tx: VersionedTransaction) -> bool:
    """The client's signature (slot 1) verifies over the message. Slot 0 is the fee payer's,
    still empty here."""
    message = to_bytes_versioned(tx.message)
    return bool(tx.signatures[1].verify(tx.message.account_keys[1], message))


def payment_identifier(payload: PaymentPayload) -> str | Refused | None:
    """The client's payment-identifier (extension ``payment-identifier``), if it sent one."""
    extension: Any = (payload.extensions or {}).get(PAYMENT_IDENTIFIER)
    if not isinstance(extension, dict):
        return None
    info = extension.get("info")
    pid = info.get("id") if isinstance(info, dict) else None
    if pid is None:
        return None
    if not isinstance(pid, str) or not PAYMENT_ID.fullmatch(pid):
        return Refused("invalid_payment_identifier", "payment identifier must be 16-128 of [A-Za-z0-9_-]")
    return pid


def as_v2(
    payload: PaymentPayload, requirements: PaymentRequirements, resource: ResourceInfo
) -> PaymentPayload:
    """v1 (``X-PAYMENT``): the facilitator is spoken to in v2, so the payment says which
    requirements it accepted, as a v2 client would."""
    if payload.accepted is not None:
        return payload
    return PaymentPayload(
        x402Version=2,
        payload=payload.payload,
        accepted=requirements,
        resource=resource,
        extensions=payload.extensions,
    )
