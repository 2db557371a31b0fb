"""Facilitators: who verifies and settles payments for the gateway.

One protocol, two implementations: :class:`HttpFacilitator` speaks the facilitator HTTP API
to an external service (Coinbase CDP by default), and ``LocalFacilitator``
(``gateway.local_facilitator``) verifies and settles with our own fee-payer wallet.
The exact middleware only ever sees :class:`Facilitator`.
"""

from __future__ import annotations

from typing import Protocol

from gateway.x402.types import PaymentPayload, PaymentRequirements, SettleResponse, SupportedResponse, VerifyResponse


class FacilitatorUnavailable(Exception):
    """The facilitator could not be reached or answered garbage: 503, no upstream call."""


class Facilitator(Protocol):
    url: str
    """Public URL advertised in the 402's ``facilitator.url`` (never carries credentials)."""

    async def supported(self) -> SupportedResponse: ...

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse: ...

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse: ...

    async def close(self) -> None: ...
