"""The app's shared parts a payment method may take its dependencies from, typed.

The composition root (``gateway.app`` with ``gateway.services.Services``) holds one of each;
a method's :meth:`~gateway.methods.registry.PaymentMethod.dependencies` picks exactly what its
routes use into a small frozen value, and its binder sees only that value. This protocol names
the parts without importing the root, so no method depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.config import Settings
from gateway.facilitators.health import FacilitatorHealth
from gateway.facilitators.local import LocalFacilitator
from gateway.ledger.recorder import MoneyRecorder
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.credit.book import CreditBook
from gateway.methods.exact.fee_guard import FeeGuard
from gateway.methods.exact.offer import SettlingFacilitator
from gateway.store import Store
from gateway.x402.siwx import SiwxIssuer


class SharedParts(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> Store: ...

    @property
    def limiter(self) -> RateLimiter: ...

    @property
    def siwx(self) -> SiwxIssuer: ...

    @property
    def credit_book(self) -> CreditBook: ...

    @property
    def recorder(self) -> MoneyRecorder: ...

    @property
    def settling(self) -> Sequence[SettlingFacilitator]: ...

    @property
    def facilitator_health(self) -> FacilitatorHealth: ...

    @property
    def settlement_guard(self) -> FeeGuard | None: ...

    @property
    def local_facilitator(self) -> LocalFacilitator | None: ...
