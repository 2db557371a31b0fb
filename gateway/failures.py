"""The one conversion of each expected failure kind into its error response.

A store outage or invalid input can surface in any layer (an access middleware, the payment
core, a handler); each kind becomes its response here, once, where the pipeline meets the
client (:class:`~gateway.router.MethodDispatcher`), so its status, code and message cannot
drift between layers. After a settlement was asked for, a store outage never reaches this
point: the payment core reports it as pending instead (see ``gateway.payments.settlement``),
which is why "nothing was charged" is true here.
"""

from __future__ import annotations

from gateway.errors import ErrorCode, GatewayError
from gateway.store import StoreUnavailable
from gateway.validation import InvalidInput

EXPECTED_FAILURES = (GatewayError, StoreUnavailable, InvalidInput)
"""What a pipeline may raise on purpose; anything else is a bug (500, from the telemetry)."""


def as_error(failure: GatewayError | StoreUnavailable | InvalidInput) -> GatewayError:
    """The response ``failure`` stands for."""
    if isinstance(failure, StoreUnavailable):
        return GatewayError(
            ErrorCode.STORE_UNAVAILABLE, "state store unavailable, try again later; nothing was charged"
        )
    if isinstance(failure, InvalidInput):
        # Only a body of the wrong JSON type fails at the root, where ``where`` is empty.
        where = failure.where or "body"
        message = str(failure) if failure.where else f"body: {failure}"
        return GatewayError(ErrorCode.INVALID_REQUEST, message, {"parameter": where})
    return failure
