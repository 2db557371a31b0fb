"""The prepaid-credit routes' answers on the wire, declared once for the gateway that sends them
(:mod:`gateway.methods.credit.handlers`) and the clients that read them (:mod:`client.credits`,
:mod:`client.sessions`), so the two sides cannot drift apart.

Every answer is the asset-data envelope (``ok``, ``provider``, ``surface``, ``method``) around a
``result``; amounts are decimal strings of micro-USDC, times Unix seconds.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class TopUpResult(msgspec.Struct):
    wallet: str
    balanceMicroUsdc: str
    expiresAt: int


class Movement(msgspec.Struct, omit_defaults=True):
    """One journal entry of the wallet: a top-up, a sale, a spend of credit, a lapse."""

    kind: str
    amountMicroUsdc: str
    route: str | None
    at: int
    signature: str | None = None
    """The settlement's transaction (top-ups and sales)."""


class BalanceResult(msgspec.Struct, omit_defaults=True):
    wallet: str
    balanceMicroUsdc: str
    heldMicroUsdc: str
    expiresAt: int
    movements: list[Movement] | None = None
    """Only when asked for (``?movements=N``), newest first."""


class SessionResult(msgspec.Struct):
    token: str
    wallet: str
    capMicroUsdc: str
    expiresAt: int


class RevokedResult(msgspec.Struct):
    wallet: str
    capMicroUsdc: str
    spentMicroUsdc: str
    """What the session spent, the calls still in flight included."""


Result = TopUpResult | BalanceResult | SessionResult | RevokedResult


class CreditEnvelope(msgspec.Struct):
    ok: bool
    provider: str
    surface: str
    method: str
    result: Result


def result_of(body: bytes, kind: type[T]) -> T | None:
    """``result`` of an envelope answer as ``kind``; None when the body is not one (a client
    reads whatever a gateway sent)."""
    try:
        envelope = msgspec.json.decode(body, type=dict[str, Any])
        return msgspec.convert(envelope.get("result"), kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
