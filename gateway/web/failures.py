"""The one conversion of each expected failure kind into its error response.

A store outage, invalid input or an unreachable facilitator can surface in any layer (an access
middleware, the payment core, a handler); each kind becomes its response here, once, where the
pipeline meets the client (:class:`~gateway.web.router.MethodDispatcher`), so its status, code and
message cannot drift between layers. After a settlement was asked for, a store outage never
reaches this point from a paid route: the payment core reports it as pending instead (see
``gateway.methods.exact.settlement``), which is why "nothing was charged" is true there. The internal
facilitator's routes make no such promise: its settle may have broadcast before the store failed.
"""

from __future__ import annotations

from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.routing.validation import InvalidInput
from gateway.store import StoreUnavailable

EXPECTED_FAILURES = (GatewayError, StoreUnavailable, InvalidInput, FacilitatorUnavailable)
"""What a pipeline may raise on purpose; anything else is a bug (500, from the telemetry)."""

Failure = GatewayError | StoreUnavailable | InvalidInput | FacilitatorUnavailable


def as_error(failure: Failure, *, access: str = "") -> GatewayError:
    """The response ``failure`` stands for, on a route of ``access`` (the mode's name)."""
    if isinstance(failure, StoreUnavailable):
        if access == "internal":
            return GatewayError(ErrorCode.STORE_UNAVAILABLE, "state store unavailable, try again later")
        return GatewayError(
            ErrorCode.STORE_UNAVAILABLE, "state store unavailable, try again later; nothing was charged"
        )
    if isinstance(failure, FacilitatorUnavailable):
        # Raisers keep credentials out of its message: a redacted URL at most.
        return GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, str(failure))
    if isinstance(failure, InvalidInput):
        # Only a body of the wrong JSON type fails at the root, where ``where`` is empty.
        where = failure.where or "body"
        message = str(failure) if failure.where else f"body: {failure}"
        return GatewayError(ErrorCode.INVALID_REQUEST, message, {"parameter": where})
    return failure
