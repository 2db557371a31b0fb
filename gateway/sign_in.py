"""SignInGate: from a verified sign-in to an admitted one, with no web framework in sight.

The sign-in's signature, times and resource are checked by :class:`gateway.x402.siwx.SiwxIssuer`;
this core decides, in one store round trip, whether a verified sign-in may reach the upstream:
its nonce unused, then (for a call paid from prepaid credit) the wallet's free credit covering
the call's price, then the wallet's and the client IP's own buckets, then the budget every
wallet shares, and only then the nonce recorded as used, the price held and the record of the
call it pays for claimed (``gateway.credit_calls``). A sign-in refused
by its credit or a limit spends nothing shared and keeps its nonce, to be sent again once it
may. Every expected result is a value; only an outage (``StoreUnavailable``) raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.rate_limiter import Limited, RateLimiter
from gateway.routes import RateLimitSpec
from gateway.store import CreditHoldOrder, CreditState, Entry, Store, StoreUnavailable, keys
from gateway.store.limits import check_then_limit
from gateway.x402.siwx import VerifiedSignIn


@dataclass(frozen=True, slots=True)
class Admitted:
    """The nonce is now used, every bucket charged and the credit ordered held: call the upstream."""

    held: CreditState | None = None
    """The wallet's credit after the hold, when one was ordered."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """The nonce was used already: a replayed sign-in."""

    call: str | None = None
    """The raw value at the key of the ``call`` record given to :meth:`SignInGate.admit`, if any:
    the caller tells its call's identical retry from another request under the same nonce."""


@dataclass(frozen=True, slots=True)
class Uncovered:
    """The wallet's free credit does not cover the hold ordered: nothing was spent or held."""


Admission = Admitted | Replayed | Limited | Uncovered
"""``Limited``: a bucket refused the sign-in; nothing shared was spent."""


class SignInGate:
    """Admits verified sign-ins on one route."""

    def __init__(self, store: Store, limiter: RateLimiter, limits: Sequence[RateLimitSpec]) -> None:
        self.store = store
        self.limiter = limiter
        self.limits = tuple(limits)

    async def admit(
        self,
        signed: VerifiedSignIn,
        client_ip: str,
        hold: CreditHoldOrder | None = None,
        call: Entry | None = None,
    ) -> Admission:
        """Use the nonce once across every replica, for as long as it could still verify, and make
        ``hold`` (the signed-in wallet's credit) and write ``call`` (the record of the call it
        pays for, a claim of its own) in the same atomic step."""
        key = keys.sign_in_nonce(signed.nonce)
        plan = self.limiter.plan(self.limits, wallet=signed.address, ip=client_ip)
        checked, puts = [key], [Entry(key, signed.address, signed.replay_ttl_ms)]
        if call is not None:
            checked.append(call.key)
            puts.append(call)
        found = await check_then_limit(self.store, checked, plan.buckets, puts, hold)
        if any(value is not None for value in found.values):
            return Replayed(found.values[1] if call is not None else None)
        limited = plan.refusal(found.decisions)
        if limited is not None:
            return limited
        if found.written and (hold is None or found.held is not None):
            return Admitted(found.held)
        if hold is not None and not found.written and not found.decisions:
            return Uncovered()
        raise StoreUnavailable("state store neither refused nor recorded the sign-in")
